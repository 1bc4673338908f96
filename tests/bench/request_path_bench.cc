// Heap allocations per request on attnserve's request path, as benchmark counters:
//   BM_CoreForward  the core alone (MultiHeadAttention::Forward);
//   BM_ServicePath  validation, queue, batch, compute and response building, without gRPC
//                   (RequestPipeline::Submit on the built-in model);
//   BM_GrpcCall     one unary Attend over loopback, client and server in this process.
// Every malloc/calloc/realloc/aligned allocation in the process is counted (this binary
// interposes them), so oneDNN's and gRPC's count too. One sequence of L=16, d=512.
#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "benchmark/benchmark.h"
#include "client/attention_client.h"
#include "core/attention/attention_weights.h"
#include "core/attention/multi_head_attention.h"
#include "core/base/device.h"
#include "server/attention_server.h"
#include "server/models/model_registry.h"
#include "server/pipeline/request_pipeline.h"

namespace {

std::atomic<int64_t> allocations{0};

}  // namespace

// glibc's own entry points; every allocation in the process comes through these
// interposed names. Not under a sanitizer, which interposes them itself.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__has_feature)
#define ATTNSERVE_COUNT_ALLOCATIONS 1
#elif defined(__has_feature)
#if !__has_feature(address_sanitizer)
#define ATTNSERVE_COUNT_ALLOCATIONS 1
#endif
#endif

#ifdef ATTNSERVE_COUNT_ALLOCATIONS
extern "C" {
void* __libc_malloc(size_t size);
void* __libc_calloc(size_t count, size_t size);
void* __libc_realloc(void* pointer, size_t size);
void* __libc_memalign(size_t alignment, size_t size);

void* malloc(size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_malloc(size);
}
void* calloc(size_t count, size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_calloc(count, size);
}
void* realloc(void* pointer, size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_realloc(pointer, size);
}
int posix_memalign(void** out, size_t alignment, size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  *out = __libc_memalign(alignment, size);
  return *out != nullptr ? 0 : ENOMEM;
}
void* aligned_alloc(size_t alignment, size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_memalign(alignment, size);
}
void* memalign(size_t alignment, size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_memalign(alignment, size);
}
}
#endif

namespace attnserve {
namespace {

constexpr int64_t kLength = 16, kDModel = 512;

v1::AttendRequest Request() {
  v1::AttendRequest request;
  *request.mutable_query() = client::Float32Tensor(
      std::vector<float>(kLength * kDModel, 0.25f), {kLength, kDModel});
  return request;
}

void ReportAllocations(benchmark::State& state, int64_t before) {
  state.counters["allocs_per_request"] =
      static_cast<double>(allocations.load() - before) /
      static_cast<double>(state.iterations());
}

void BM_CoreForward(benchmark::State& state) {
  core::ModelSpec spec;
  spec.d_model = kDModel;
  spec.num_heads = 8;
  core::MultiHeadAttention::Options options;
  options.intra_op_threads = 1;
  auto attention = core::MultiHeadAttention::Create(
      spec, core::GenerateAttentionWeights(spec, 1), *core::CreateCpuEngine(), options);
  if (!attention.ok()) {
    state.SkipWithError(std::string(attention.status().message()).c_str());
    return;
  }
  const std::vector<float> query(kLength * kDModel, 0.25f);
  const std::vector<int64_t> lengths = {kLength};
  std::vector<float> output(query.size());
  const auto call = [&] {
    if (!(*attention)->Forward({query, lengths}, {}, absl::MakeSpan(output)).ok()) {
      std::abort();
    }
  };
  for (int i = 0; i < 20; ++i) call();
  const int64_t before = allocations.load();
  for (auto _ : state) call();
  ReportAllocations(state, before);
}
BENCHMARK(BM_CoreForward)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_ServicePath(benchmark::State& state) {
  server::ModelRegistry::Options options;
  options.intra_op_threads = 1;
  auto registry = server::ModelRegistry::Create(options);
  if (!registry.ok()) {
    state.SkipWithError(std::string(registry.status().message()).c_str());
    return;
  }
  server::RequestPipeline service(registry->get(), {});
  const v1::AttendRequest request = Request();
  const auto call = [&] {
    absl::Notification done;
    std::shared_ptr<server::Request> counted = *service.Begin("");
    if (!counted->Find(request.model()).ok()) std::abort();
    service.Submit(counted, request, absl::InfiniteFuture(), nullptr,
                   [&](absl::Status status, v1::AttendResponse response) {
                     benchmark::DoNotOptimize(response);
                     if (!status.ok()) std::abort();
                     done.Notify();
                   });
    done.WaitForNotification();
  };
  for (int i = 0; i < 20; ++i) call();  // primitives created, pools warm
  const int64_t before = allocations.load();
  for (auto _ : state) call();
  ReportAllocations(state, before);
  (*registry)->Shutdown();
}
BENCHMARK(BM_ServicePath)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_GrpcCall(benchmark::State& state) {
  server::AttentionServer::Options options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.models.intra_op_threads = 1;
  auto server = server::AttentionServer::Create(options);
  if (!server.ok()) {
    state.SkipWithError(std::string(server.status().message()).c_str());
    return;
  }
  client::AttentionClient::Options client_options;
  client_options.target = absl::StrCat("127.0.0.1:", (*server)->port());
  auto client = client::AttentionClient::Create(client_options);
  const v1::AttendRequest request = Request();
  const auto call = [&] {
    if (!(*client)->Attend(request).ok()) std::abort();
  };
  for (int i = 0; i < 20; ++i) call();
  const int64_t before = allocations.load();
  for (auto _ : state) call();
  ReportAllocations(state, before);
  (*server)->Shutdown();
}
BENCHMARK(BM_GrpcCall)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace attnserve

BENCHMARK_MAIN();
