// The transport floor under attnserve, for `make bench-server`: a bare gRPC echo (the
// same callback API, channel defaults and allocator set-up as attnserve) and a raw TCP
// echo of the same bytes. Each mode is its own process so the bench can pin server and
// client to different cores.
//
//   echo_bench --mode=grpc_server|tcp_server            prints "listening on PORT"
//   echo_bench --mode=grpc_client|tcp_client --port=P --bytes=N --seconds=S
//                                                       prints one JSON line of latencies
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "echo.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "transport/transport.h"

ABSL_FLAG(std::string, mode, "", "grpc_server, grpc_client, tcp_server or tcp_client.");
ABSL_FLAG(int, port, 0, "Server port (clients: the port to call).");
ABSL_FLAG(int64_t, bytes, 256 << 10, "Payload bytes each way.");
ABSL_FLAG(
    bool, tuned, true,
    "Apply attnserve's allocator and channel settings; false shows gRPC's defaults.");
ABSL_FLAG(
    int, concurrency, 1,
    "grpc_client: calls in flight (callback API); above 1 it prints throughput, the "
    "most echoes one server core can answer.");
ABSL_FLAG(double, seconds, 3, "Client: how long to measure (after 0.5 s of warm-up).");
ABSL_FLAG(double, work_ms, 0,
          "grpc_server: answer from a worker thread after this much busy work per call, "
          "as attnserve answers from its compute thread (0: answer in the handler).");

namespace {

using Clock = std::chrono::steady_clock;

// With --work_ms, calls are answered the way attnserve answers them: the handler queues
// the call, one worker thread takes it, works (spins) for work_ms, copies the bytes and
// calls Finish from that thread.
class EchoService final : public attnserve::bench::Echo::CallbackService {
 public:
  EchoService() {
    if (absl::GetFlag(FLAGS_work_ms) > 0) worker_ = std::thread([this] { Work(); });
  }

 private:
  struct Call {
    const attnserve::bench::Blob* request;
    attnserve::bench::Blob* response;
    grpc::ServerUnaryReactor* reactor;
  };

  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context,
                                 const attnserve::bench::Blob* request,
                                 attnserve::bench::Blob* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (!worker_.joinable()) {
      *response->mutable_data() = request->data();
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }
    absl::MutexLock lock(&mu_);
    calls_.push_back(Call{request, response, reactor});
    return reactor;
  }

  void Work() {
    const auto work =
        std::chrono::duration<double, std::milli>(absl::GetFlag(FLAGS_work_ms));
    for (;;) {
      Call call;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](std::deque<Call>* calls) { return !calls->empty(); }, &calls_));
        call = calls_.front();
        calls_.pop_front();
      }
      const auto until = Clock::now() + work;
      while (Clock::now() < until) {
      }
      *call.response->mutable_data() = call.request->data();
      call.reactor->Finish(grpc::Status::OK);
    }
  }

  absl::Mutex mu_;
  std::deque<Call> calls_ ABSL_GUARDED_BY(mu_);
  std::thread worker_;  // runs until the process exits
};

int GrpcServer() {
  EchoService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", absl::GetFlag(FLAGS_port)),
                           grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  if (absl::GetFlag(FLAGS_tuned)) attnserve::transport::ApplyTransportDefaults(builder);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  std::printf("listening on %d\n", port);
  std::fflush(stdout);
  server->Wait();
  return 0;
}

// Times `call` in a closed loop and prints p50/p99/mean in ms as one JSON line.
template <typename Call>
int Measure(Call call) {
  const auto warm_until = Clock::now() + std::chrono::milliseconds(500);
  while (Clock::now() < warm_until) {
    if (!call()) return 1;
  }
  std::vector<double> ms;
  const auto until =
      Clock::now() + std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds));
  while (Clock::now() < until) {
    const auto start = Clock::now();
    if (!call()) return 1;
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  double sum = 0;
  for (double m : ms) sum += m;
  std::printf("{\"calls\": %zu, \"p50_ms\": %.4f, \"p99_ms\": %.4f, \"mean_ms\": %.4f}\n",
              ms.size(), ms[ms.size() / 2], ms[ms.size() * 99 / 100], sum / ms.size());
  return 0;
}

// Keeps --concurrency echoes in flight for 0.5 s of warm-up plus --seconds and prints
// the echoes per second answered after the warm-up, and every echo answered (warm-up
// included, for the server's CPU time per call), as one JSON line.
int Throughput(attnserve::bench::Echo::Stub& stub,
               const attnserve::bench::Blob& request) {
  struct Call {
    grpc::ClientContext context;
    attnserve::bench::Blob response;
  };
  const auto measure_from = Clock::now() + std::chrono::milliseconds(500);
  const auto until =
      measure_from + std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds));
  absl::Mutex mu;
  int64_t counted = 0, answered = 0, failed = 0;
  int running = absl::GetFlag(FLAGS_concurrency);
  std::function<void()> issue = [&] {
    auto* call = new Call;
    stub.async()->Echo(&call->context, &request, &call->response,
                       [&, call](grpc::Status status) {
                         const auto now = Clock::now();
                         delete call;
                         bool again;
                         {
                           absl::MutexLock lock(&mu);
                           if (!status.ok()) ++failed;
                           if (status.ok()) ++answered;
                           if (now >= measure_from && now < until) ++counted;
                           again = status.ok() && now < until;
                           if (!again) --running;
                         }
                         if (again) issue();
                       });
  };
  for (int i = 0; i < absl::GetFlag(FLAGS_concurrency); ++i) issue();
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](int* left) { return *left == 0; }, &running));
  if (failed > 0) {
    std::fprintf(stderr, "echo failed %lld times\n", static_cast<long long>(failed));
    return 1;
  }
  std::printf("{\"calls\": %lld, \"all_calls\": %lld, \"per_second\": %.1f}\n",
              static_cast<long long>(counted), static_cast<long long>(answered),
              static_cast<double>(counted) / absl::GetFlag(FLAGS_seconds));
  return 0;
}

int GrpcClient() {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(-1);
  arguments.SetMaxSendMessageSize(-1);
  if (absl::GetFlag(FLAGS_tuned)) attnserve::transport::ApplyTransportDefaults(arguments);
  auto stub = attnserve::bench::Echo::NewStub(
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", absl::GetFlag(FLAGS_port)),
                                grpc::InsecureChannelCredentials(), arguments));
  attnserve::bench::Blob request;
  request.mutable_data()->assign(static_cast<size_t>(absl::GetFlag(FLAGS_bytes)), 'x');
  if (absl::GetFlag(FLAGS_concurrency) > 1) return Throughput(*stub, request);
  return Measure([&] {
    grpc::ClientContext context;
    attnserve::bench::Blob response;
    const grpc::Status status = stub->Echo(&context, request, &response);
    if (!status.ok() || response.data().size() != request.data().size()) {
      std::fprintf(stderr, "echo failed: %s\n", status.error_message().c_str());
      return false;
    }
    return true;
  });
}

// Moves all `size` bytes through `io` (read or write), which may move fewer per call.
template <typename Io, typename Byte>
bool Full(Io io, int fd, Byte* data, size_t size) {
  while (size > 0) {
    const ssize_t n = io(fd, data, size);
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool ReadFull(int fd, char* data, size_t size) { return Full(read, fd, data, size); }
bool WriteFull(int fd, const char* data, size_t size) {
  return Full(write, fd, data, size);
}

// Raw TCP: each message is an 8-byte length and the payload; the server sends it back.
int TcpServer() {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(absl::GetFlag(FLAGS_port)));
  socklen_t length = sizeof(address);
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listener, 4) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    std::perror("tcp_server");
    return 1;
  }
  std::printf("listening on %d\n", ntohs(address.sin_port));
  std::fflush(stdout);
  for (;;) {
    const int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::vector<char> buffer;
    uint64_t size = 0;
    while (ReadFull(fd, reinterpret_cast<char*>(&size), sizeof(size))) {
      buffer.resize(size);
      if (!ReadFull(fd, buffer.data(), size) ||
          !WriteFull(fd, reinterpret_cast<char*>(&size), sizeof(size)) ||
          !WriteFull(fd, buffer.data(), size)) {
        break;
      }
    }
    close(fd);
  }
}

int TcpClient() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(absl::GetFlag(FLAGS_port)));
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    std::perror("tcp_client");
    return 1;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const uint64_t size = static_cast<uint64_t>(absl::GetFlag(FLAGS_bytes));
  std::vector<char> out(size, 'x'), in(size);
  return Measure([&] {
    uint64_t echoed = 0;
    return WriteFull(fd, reinterpret_cast<const char*>(&size), sizeof(size)) &&
           WriteFull(fd, out.data(), size) &&
           ReadFull(fd, reinterpret_cast<char*>(&echoed), sizeof(echoed)) &&
           echoed == size && ReadFull(fd, in.data(), size);
  });
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_tuned) && !attnserve::transport::KeepAllocatorMemory()) {
    std::fprintf(stderr, "echo_bench: glibc refused an allocator setting\n");
    return 1;
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "grpc_server") return GrpcServer();
  if (mode == "grpc_client") return GrpcClient();
  if (mode == "tcp_server") return TcpServer();
  if (mode == "tcp_client") return TcpClient();
  std::fprintf(stderr,
               "echo_bench: --mode must be grpc_server, grpc_client, tcp_server or "
               "tcp_client\n");
  return 2;
}
