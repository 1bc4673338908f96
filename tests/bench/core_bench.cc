// Google Benchmark for the attention core over the (B, L, d, h) grid at 1 and 2
// threads, reporting GFLOP/s, plus a 2048^3 oneDNN f32 matmul as the in-situ peak.
// Run through `make bench-core`, which also runs PyTorch and prints the comparison.
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "core/attention/attention_weights.h"
#include "core/attention/multi_head_attention.h"
#include "core/base/device.h"
#include "dnnl.hpp"

namespace attnserve::core {
namespace {

// MHA FLOPs: 8 B L d^2 for the four projections + 4 B L^2 d for QK^T and PV.
double AttentionFlops(int64_t batch, int64_t length, int64_t d_model) {
  return 8.0 * batch * length * d_model * d_model +
         4.0 * batch * length * length * d_model;
}

// The benchmark's input tokens: the same values every run.
std::vector<float> BenchTokens(size_t count) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<float>(i % 17) / 17.0f;
  return values;
}

// Untimed runs before each timed loop, and the fewest calls a median is taken of, as
// torch_mha.py gives every peer.
constexpr int kWarmUpCalls = 2;
constexpr size_t kMinTimedCalls = 3;

// Times Forward on `batch` sequences of `length` tokens (the same pseudo-random values
// every run) for the model `spec`; false (and the benchmark marked skipped) on an error.
// The last output is left in `last_output` when it is not null.
bool TimeForward(benchmark::State& state, const ModelSpec& spec,
                 const MultiHeadAttention::Options& options, int64_t batch,
                 int64_t length, const AttentionOptions& attention_options = {},
                 std::vector<float>* last_output = nullptr) {
  auto engine = CreateCpuEngine();
  auto attention = MultiHeadAttention::Create(spec, GenerateAttentionWeights(spec, 0),
                                              *engine, options);
  if (!attention.ok()) {
    state.SkipWithError(attention.status().ToString().c_str());
    return false;
  }
  const std::vector<int64_t> lengths(batch, length);
  const std::vector<float> query = BenchTokens(batch * length * spec.d_model);
  std::vector<float> output(query.size());
  AttentionBatch packed;
  packed.query = query;
  packed.query_lengths = lengths;
  // Untimed calls first, as the peers get (torch_mha.py's median_ms) and as the server's
  // warm-up gives every model before it serves: the first call faults in its scratch
  // buffers (about 30,000 pages at (1, 4096, 1024)), which once made the 2-thread long
  // rows read 10-15% slow against warmed-up peers. Then each call is timed too: the
  // peers report the median call of at least 3, and so does the "median_ms" counter
  // (make bench-core reads it), which one slow call on a shared host cannot move as it
  // moves the mean.
  std::vector<double> call_ms;
  const auto call = [&](bool timed) {
    const auto begin = std::chrono::steady_clock::now();
    const absl::Status status =
        (*attention)->Forward(packed, attention_options, absl::MakeSpan(output));
    if (timed) {
      call_ms.push_back(std::chrono::duration<double, std::milli>(
                            std::chrono::steady_clock::now() - begin)
                            .count());
    }
    benchmark::DoNotOptimize(output.data());
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    return status.ok();
  };
  for (int i = 0; i < kWarmUpCalls; ++i) {
    if (!call(false)) return false;
  }
  for (auto _ : state) {
    if (!call(true)) return false;
  }
  while (call_ms.size() < kMinTimedCalls) {
    if (!call(true)) return false;
  }
  std::sort(call_ms.begin(), call_ms.end());
  state.counters["median_ms"] = call_ms[call_ms.size() / 2];
  if (last_output != nullptr) *last_output = std::move(output);
  // What the warm-up timing chose, beside the figure it produced.
  state.SetLabel(absl::StrCat((*attention)->ProjectionChoices(),
                              "; attention: ", (*attention)->AttentionKernelChoice()));
  return true;
}

// For tuning without rebuilding: ATTNSERVE_BENCH_BLOCK_BYTES sets the attention block
// budget, ATTNSERVE_BENCH_FLASH_TILES="ROWS,KEYS" the flash kernel's tiles,
// ATTNSERVE_BENCH_ATTENTION_KERNEL=flash|blocks the attention kernel.
void Tune(MultiHeadAttention::Options& options) {
  if (const char* block = std::getenv("ATTNSERVE_BENCH_BLOCK_BYTES")) {
    options.attention_block_bytes = std::atoll(block);
  }
  using Kernel = MultiHeadAttention::Options::AttentionKernel;
  if (const char* kernel = std::getenv("ATTNSERVE_BENCH_ATTENTION_KERNEL")) {
    const std::string name = kernel;
    options.attention_kernel = name == "flash"    ? Kernel::kFlash
                               : name == "blocks" ? Kernel::kBlocks
                                                  : Kernel::kAuto;
  }
  if (const char* tiles = std::getenv("ATTNSERVE_BENCH_FLASH_TILES")) {
    options.flash_tiles.query_rows = std::atoll(tiles);
    if (const char* comma = std::strchr(tiles, ',')) {
      options.flash_tiles.keys = std::atoll(comma + 1);
    }
  }
}

void BM_MultiHeadAttention(benchmark::State& state) {
  const int64_t batch = state.range(0);
  const int64_t length = state.range(1);
  ModelSpec spec;
  spec.d_model = state.range(2);
  spec.num_heads = state.range(3);
  MultiHeadAttention::Options options;
  options.intra_op_threads = static_cast<int>(state.range(4));
  Tune(options);
  if (!TimeForward(state, spec, options, batch, length)) return;
  state.counters["GFLOPs"] =
      benchmark::Counter(AttentionFlops(batch, length, spec.d_model) / 1e9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

void AttentionGrid(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"B", "L", "d", "h", "threads"});
  const int64_t grid[][4] = {{1, 128, 512, 8},   {8, 128, 512, 8},    {32, 128, 512, 8},
                             {8, 512, 768, 12},  {1, 2048, 1024, 16}, {64, 64, 256, 4},
                             {1, 4096, 1024, 16}};
  for (int64_t threads : {1, 2}) {
    for (const auto& shape : grid) {
      bench->Args({shape[0], shape[1], shape[2], shape[3], threads});
    }
  }
}
BENCHMARK(BM_MultiHeadAttention)
    ->Apply(AttentionGrid)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.5);

// What the server's batches cost in the core alone: B single sequences of L=128,
// d=512, 1 thread (make bench-server divides the server's throughput by this), and L=16
// at B=1 and B=32 (the core's own batching gain, the ceiling of the server's).
void ServerShapes(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"B", "L", "d", "h", "threads"});
  for (int64_t batch : {1, 2, 4, 8, 16, 32}) bench->Args({batch, 128, 512, 8, 1});
  for (int64_t batch : {1, 32}) bench->Args({batch, 16, 512, 8, 1});
}
BENCHMARK(BM_MultiHeadAttention)
    ->Name("BM_ServerShapes")
    ->Apply(ServerShapes)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.5);

// A server sees batches of arbitrary total length: each call here packs 4 sequences of
// lengths drawn from [16, 512] (a fixed pseudo-random sequence), so shapes rarely
// repeat and primitive creation shows up in the time. Compare with the same FLOPs at a
// repeated shape to see what shape churn costs.
void BM_MixedLengths(benchmark::State& state) {
  ModelSpec spec;
  MultiHeadAttention::Options options;
  options.intra_op_threads = 1;
  auto engine = CreateCpuEngine();
  auto attention = MultiHeadAttention::Create(spec, GenerateAttentionWeights(spec, 0),
                                              *engine, options);
  std::vector<float> query(4 * 512 * spec.d_model, 0.1f), output(query.size());
  uint64_t lcg = 12345;
  double flops = 0;
  // Warmed up on the longest batch the loop can draw (four of 512 tokens).
  const std::vector<int64_t> longest(4, 512);
  for (int call = 0; call < kWarmUpCalls; ++call) {
    if (!(*attention)->Forward({query, longest}, {}, absl::MakeSpan(output)).ok()) {
      state.SkipWithError("the warm-up call failed");
      return;
    }
  }
  for (auto _ : state) {
    std::vector<int64_t> lengths(4);
    int64_t total = 0;
    for (int64_t& length : lengths) {
      lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
      length = state.range(0) ? 16 + static_cast<int64_t>((lcg >> 33) % 497) : 264;
      total += length;
      flops += 8.0 * length * spec.d_model * spec.d_model +
               4.0 * length * length * spec.d_model;
    }
    AttentionBatch batch;
    batch.query = absl::MakeConstSpan(query).subspan(0, total * spec.d_model);
    batch.query_lengths = lengths;
    const absl::Status status =
        (*attention)
            ->Forward(batch, AttentionOptions(),
                      absl::MakeSpan(output).subspan(0, total * spec.d_model));
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      return;
    }
  }
  state.counters["GFLOPs"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
  state.counters["primitives_created"] =
      static_cast<double>((*attention)->primitive_creations());
}
BENCHMARK(BM_MixedLengths)
    ->ArgName("mixed")
    ->Arg(0)
    ->Arg(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);

// What removed work buys, each beside the same shape in full (variant 0): 1 = half the
// heads zeroed by the request's head_mask, 2 = half the heads pruned by the model, 3 =
// causal, 4 = bf16 precision, 5 = int8 precision; and the projection primitives fixed
// instead of chosen at warm-up (variant 0's default): 6 = per shape, 7 = runtime rows;
// and the attention kernel fixed: 8 = query-row blocks, 9 = the same, causal; 10 = flash,
// 11 = flash, causal.
// make bench-core prints the ratios against their targets.
void BM_Variant(benchmark::State& state) {
  const int64_t batch = state.range(0);
  const int64_t length = state.range(1);
  const int64_t variant = state.range(4);
  ModelSpec spec;
  spec.d_model = state.range(2);
  spec.num_heads = state.range(3);
  if (variant == 2) {
    for (int64_t h = 1; h < spec.num_heads; h += 2) spec.pruned_heads.push_back(h);
  }
  if (variant == 4) spec.precision = Precision::kBf16;
  if (variant == 5) spec.precision = Precision::kInt8;
  MultiHeadAttention::Options options;
  options.intra_op_threads = 1;
  using Projection = MultiHeadAttention::Options::ProjectionPrimitives;
  if (variant == 6) options.projection_primitives = Projection::kPerShape;
  if (variant == 7) options.projection_primitives = Projection::kRuntimeRows;
  using Kernel = MultiHeadAttention::Options::AttentionKernel;
  Tune(options);
  if (variant == 8 || variant == 9) options.attention_kernel = Kernel::kBlocks;
  if (variant == 10 || variant == 11) options.attention_kernel = Kernel::kFlash;
  std::vector<float> mask(spec.num_heads, 1.0f);
  for (int64_t h = 1; h < spec.num_heads; h += 2) mask[h] = 0.0f;
  AttentionOptions attention_options;
  if (variant == 1) attention_options.head_mask = mask;
  attention_options.causal = variant == 3 || variant == 9 || variant == 11;
  std::vector<float> output;
  if (!TimeForward(state, spec, options, batch, length, attention_options, &output))
    return;
  if (variant == 5) {
    // int8's accuracy beside its speed: the cosine of its output with fp32's, same
    // weights and inputs.
    ModelSpec fp32 = spec;
    fp32.precision = Precision::kFp32;
    auto engine = CreateCpuEngine();
    auto reference = MultiHeadAttention::Create(fp32, GenerateAttentionWeights(fp32, 0),
                                                *engine, options);
    const std::vector<int64_t> lengths(batch, length);
    const std::vector<float> query = BenchTokens(output.size());
    std::vector<float> expected(output.size());
    if (!reference.ok() ||
        !(*reference)->Forward({query, lengths}, {}, absl::MakeSpan(expected)).ok()) {
      state.SkipWithError("the fp32 reference failed");
      return;
    }
    double dot = 0, a = 0, b = 0;
    for (size_t i = 0; i < output.size(); ++i) {
      dot += static_cast<double>(output[i]) * expected[i];
      a += static_cast<double>(output[i]) * output[i];
      b += static_cast<double>(expected[i]) * expected[i];
    }
    state.counters["cosine_vs_fp32"] = dot / std::sqrt(a * b);
  }
}
BENCHMARK(BM_Variant)
    ->ArgNames({"B", "L", "d", "h", "variant"})
    ->ArgsProduct({{1}, {128}, {512}, {8}, {0, 4, 5, 6, 7, 10}})
    ->ArgsProduct({{8}, {128}, {512}, {8}, {0, 1, 2, 4, 5, 6, 7, 10}})
    ->ArgsProduct({{1}, {2048}, {1024}, {16}, {0, 1, 2, 3, 4, 8, 9, 10, 11}})
    ->ArgsProduct({{1}, {4096}, {1024}, {16}, {0, 3, 8, 9, 10, 11}})
    ->ArgsProduct({{1}, {512}, {768}, {12}, {0, 3, 4, 5, 8, 9, 10, 11}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.5);

// One long sequence without returned weights, once: make bench-core runs it alone per L
// and reads the process's peak RSS, which must grow like L d, not L^2.
void BM_LongSequence(benchmark::State& state) {
  ModelSpec spec;  // d=512, h=8
  MultiHeadAttention::Options options;
  options.intra_op_threads = 1;
  auto engine = CreateCpuEngine();
  auto attention = MultiHeadAttention::Create(spec, GenerateAttentionWeights(spec, 0),
                                              *engine, options);
  const int64_t length = state.range(0);
  const std::vector<int64_t> lengths = {length};
  std::vector<float> query(length * spec.d_model, 0.25f), output(query.size());
  for (auto _ : state) {
    const absl::Status status =
        (*attention)
            ->Forward({query, lengths}, AttentionOptions(), absl::MakeSpan(output));
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      return;
    }
  }
}
BENCHMARK(BM_LongSequence)
    ->ArgName("L")
    ->Arg(2048)
    ->Arg(4096)
    ->Arg(8192)
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// cblas_sgemm of the host's OpenBLAS (Debian's libopenblas0, which make bench-core
// installs), loaded at run time on one thread; null where it is not installed. Not a
// build dependency: it is only the yardstick for routing the f32 projections to a
// maintained BLAS.
using SgemmFunction = void (*)(int order, int trans_a, int trans_b, int m, int n, int k,
                               float alpha, const float* a, int lda, const float* b,
                               int ldb, float beta, float* c, int ldc);
SgemmFunction OpenBlasSgemm() {
  static const SgemmFunction sgemm = []() -> SgemmFunction {
    void* library = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) return nullptr;
    const auto set_threads =
        reinterpret_cast<void (*)(int)>(dlsym(library, "openblas_set_num_threads"));
    if (set_threads != nullptr) set_threads(1);
    return reinterpret_cast<SgemmFunction>(dlsym(library, "cblas_sgemm"));
  }();
  return sgemm;
}

// OpenBLAS's own Q, K, V projections: the bias rows copied into the output, then
// C += A B (row-major, no transposes), as a BLAS user computes a linear layer.
void TimeOpenBlasProjections(benchmark::State& state, int64_t rows, int64_t d) {
  const SgemmFunction sgemm = OpenBlasSgemm();
  if (sgemm == nullptr) {
    state.SkipWithError("OpenBLAS (libopenblas.so.0) is not installed");
    return;
  }
  constexpr int kRowMajor = 101;  // CblasRowMajor
  constexpr int kNoTrans = 111;   // CblasNoTrans
  const std::vector<float> a(static_cast<size_t>(rows * d), 0.25f);
  const std::vector<float> b(static_cast<size_t>(d * d), 0.125f);
  const std::vector<float> bias(static_cast<size_t>(d), 0.5f);
  std::vector<float> c(static_cast<size_t>(rows * d));
  const int n = static_cast<int>(d);
  const auto run = [&] {
    for (int i = 0; i < 3; ++i) {
      for (int64_t r = 0; r < rows; ++r) std::copy(bias.begin(), bias.end(), &c[r * d]);
      sgemm(kRowMajor, kNoTrans, kNoTrans, static_cast<int>(rows), n, n, 1.0f, a.data(),
            n, b.data(), n, 1.0f, c.data(), n);
    }
    benchmark::DoNotOptimize(c.data());
  };
  for (int call = 0; call < kWarmUpCalls; ++call) run();
  for (auto _ : state) run();
}

// Design choices, measured rather than assumed (d=512, 1 thread, f32): the Q, K and
// V projections as three [M, d] x [d, d] products (variant 0) or one fused [M, d] x
// [d, 3d] (variant 1); primitives made per token count M (variant 0) or once with
// oneDNN's runtime M (variant 2) (the core times these two per weight matrix at
// warm-up); and the same three products on OpenBLAS (variant 3). make bench-core
// prints the ratios.
void BM_ProjectionChoice(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const int64_t variant = state.range(1);
  const int64_t d = 512;
  omp_set_num_threads(1);
  if (variant == 3) {
    TimeOpenBlasProjections(state, rows, d);
    return;
  }
  using dnnl::memory;
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const int64_t out = variant == 1 ? 3 * d : d;
  const int64_t described_rows = variant == 2 ? DNNL_RUNTIME_DIM_VAL : rows;
  const memory::desc src({described_rows, d}, memory::data_type::f32,
                         memory::format_tag::ab);
  const memory::desc dst({described_rows, out}, memory::data_type::f32,
                         memory::format_tag::ab);
  // Runtime dimensions need a fixed weights layout; prepacked (any) otherwise.
  const memory::desc weights(
      {d, out}, memory::data_type::f32,
      variant == 2 ? memory::format_tag::ba : memory::format_tag::any);
  const memory::desc bias({1, out}, memory::data_type::f32, memory::format_tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, weights, bias, dst),
                                        engine);
  const dnnl::matmul matmul(pd);
  memory a({{rows, d}, memory::data_type::f32, memory::format_tag::ab}, engine);
  memory c({{rows, out}, memory::data_type::f32, memory::format_tag::ab}, engine);
  memory w(pd.weights_desc(), engine), b(bias, engine);
  std::fill_n(static_cast<float*>(a.get_data_handle()), rows * d, 0.25f);
  // Weights and bias set too: left as allocated they can hold denormals or NaNs from
  // earlier heap use, which cost Intel cores microcode assists in every FMA (this row
  // once ran 3x slower than the module it belongs to on a Sapphire Rapids).
  std::fill_n(static_cast<float*>(w.get_data_handle()),
              pd.weights_desc().get_size() / sizeof(float), 0.01f);
  std::fill_n(static_cast<float*>(b.get_data_handle()), out, 0.5f);
  const int calls = variant == 1 ? 1 : 3;
  const auto run = [&] {
    for (int i = 0; i < calls; ++i) {
      matmul.execute(stream, {{DNNL_ARG_SRC, a},
                              {DNNL_ARG_WEIGHTS, w},
                              {DNNL_ARG_BIAS, b},
                              {DNNL_ARG_DST, c}});
      stream.wait();
    }
  };
  for (int call = 0; call < kWarmUpCalls; ++call) run();
  for (auto _ : state) run();
}
BENCHMARK(BM_ProjectionChoice)
    ->ArgNames({"M", "variant"})
    ->ArgsProduct({{16, 128, 1024}, {0, 1, 2, 3}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.3);

// The in-situ ceiling: oneDNN's own large square f32 matmul.
void BM_PeakMatmul(benchmark::State& state) {
  const int64_t n = state.range(0);
  omp_set_num_threads(static_cast<int>(state.range(1)));
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const dnnl::memory::desc desc({n, n}, dnnl::memory::data_type::f32,
                                dnnl::memory::format_tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(desc, desc, desc), engine);
  const dnnl::matmul matmul(pd);
  dnnl::memory a(desc, engine), b(desc, engine), c(desc, engine);
  auto* a_data = static_cast<float*>(a.get_data_handle());
  auto* b_data = static_cast<float*>(b.get_data_handle());
  for (int64_t i = 0; i < n * n; ++i) {
    a_data[i] = static_cast<float>(i % 13) / 13.0f;
    b_data[i] = static_cast<float>(i % 7) / 7.0f;
  }
  const auto run = [&] {
    matmul.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
  };
  for (int call = 0; call < kWarmUpCalls; ++call) run();
  for (auto _ : state) run();
  state.counters["GFLOPs"] = benchmark::Counter(
      2.0 * n * n * n / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PeakMatmul)
    ->ArgNames({"n", "threads"})
    ->Args({2048, 1})
    ->Args({2048, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.5);

}  // namespace
}  // namespace attnserve::core

BENCHMARK_MAIN();
