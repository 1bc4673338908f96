// The attnserve binary as operators run it: start-up errors, and the SIGTERM drain.
#include "tests/e2e/server_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "client/attention_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::attnserve::client::AttentionClient;
using ::attnserve::client::Float32Tensor;
using ::attnserve::testing::ServerProcess;
using ::testing::HasSubstr;

std::string StderrPath(const std::string& name) {
  return ::testing::TempDir() + "/" + name + ".stderr";
}

std::unique_ptr<AttentionClient> Connect(int port) {
  AttentionClient::Options options;
  options.target = absl::StrCat("127.0.0.1:", port);
  options.timeout = absl::Seconds(60);
  return std::move(AttentionClient::Create(options)).value();
}

// GET http://127.0.0.1:port/metrics over a plain socket; "" on failure.
std::string FetchMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string text;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
    if (write(fd, request.data(), request.size()) ==
        static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      ssize_t got;
      while ((got = read(fd, buffer, sizeof(buffer))) > 0) text.append(buffer, got);
    }
  }
  close(fd);
  return text;
}

// The value of the first sample line starting with `series` (name and labels), or -1.
double SampleValue(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

v1::AttendRequest Request(int64_t length) {
  v1::AttendRequest request;
  *request.mutable_query() =
      Float32Tensor(std::vector<float>(length * 512, 0.25f), {length, 512});
  return request;
}

TEST(ServerProcessTest, SigtermDrainsInFlightRequestsAndExitsZero) {
  ServerProcess server(
      ATTNSERVE_BINARY,
      {"--host=127.0.0.1", "--port=0", "--metrics_port=-1", "--http_port=-1",
       "--instances=1", "--max_batch_size=4", "--max_queue_delay=1ms",
       "--grace_period=60s", "--metrics_host=127.0.0.1", "--metrics_port=0"},
      StderrPath("drain"));
  const int port = server.ReadPort();
  ASSERT_GT(port, 0) << server.Stderr();
  const int metrics_port = server.ReadPort("metrics on");
  ASSERT_GT(metrics_port, 0) << server.Stderr();
  auto client = Connect(port);
  ASSERT_TRUE(client->Attend(Request(8)).ok());  // connected and warm

  // 100 requests of 256 tokens in batches of 4: well over a second of compute, so
  // most are still queued when the signal arrives.
  constexpr int kInFlight = 100;
  std::atomic<int> succeeded{0};
  std::vector<absl::Status> failures;
  absl::Mutex failures_mu;
  absl::BlockingCounter pending(kInFlight);
  for (int i = 0; i < kInFlight; ++i) {
    client->AttendAsync(Request(256), absl::Seconds(60), [&](auto response) {
      if (response.ok()) {
        ++succeeded;
      } else {
        absl::MutexLock lock(&failures_mu);
        failures.push_back(response.status());
      }
      pending.DecrementCount();
    });
  }
  // The signal goes once the server holds all of them (answered or in flight), however
  // slowly a loaded machine delivers them.
  const auto all_received = [&] {
    const std::string text = FetchMetrics(metrics_port);
    const double inflight =
        SampleValue(text, "attnserve_inflight_requests{model=\"mha-base\"}");
    const double answered =
        SampleValue(text, "attnserve_requests_total{code=\"OK\",model=\"mha-base\"}");
    return inflight + answered - 1 >= kInFlight;  // minus the warm-up call
  };
  bool received = all_received();
  for (int i = 0; i < 6000 && !received; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    received = all_received();
  }
  ASSERT_TRUE(received) << FetchMetrics(metrics_port);
  server.Signal(SIGTERM);

  // New calls are refused once the drain has begun.
  bool refused = false;
  for (int attempt = 0; attempt < 200 && !refused; ++attempt) {
    const auto late = client->Attend(Request(4), absl::Seconds(5));
    refused = late.status().code() == absl::StatusCode::kUnavailable;
    if (!refused) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(refused);

  pending.Wait();
  EXPECT_EQ(succeeded.load(), kInFlight);
  for (const absl::Status& failure : failures) ADD_FAILURE() << failure;
  EXPECT_EQ(server.Wait(), 0);
  const std::string log = server.Stderr();
  EXPECT_THAT(log, HasSubstr("event=signal signal=SIGTERM"));
  EXPECT_THAT(log, HasSubstr("event=shutdown_finished"));
}

// A replica killed with SIGKILL (the OOM killer, a node failure) answers nothing more:
// its callers get UNAVAILABLE at once, never a hang, and the same client carries on once
// a new process listens on the port again.
TEST(ServerProcessTest, SigkillFailsInFlightCallsAndTheClientRecoversAfterRestart) {
  const std::vector<std::string> flags = {"--host=127.0.0.1", "--metrics_port=-1",
                                          "--http_port=-1", "--instances=1",
                                          "--max_batch_size=4"};
  std::vector<std::string> first_flags = flags;
  first_flags.push_back("--port=0");
  auto first = std::make_unique<ServerProcess>(ATTNSERVE_BINARY, first_flags,
                                               StderrPath("sigkill-first"));
  const int port = first->ReadPort();
  ASSERT_GT(port, 0) << first->Stderr();
  auto client = Connect(port);
  ASSERT_TRUE(client->Attend(Request(8)).ok());

  // Calls of 512 tokens: several seconds of compute in all, so the kill lands mid-work.
  constexpr int kInFlight = 24;
  std::vector<absl::Status> results;
  absl::Mutex results_mu;
  absl::BlockingCounter pending(kInFlight);
  absl::Notification first_answered;
  for (int i = 0; i < kInFlight; ++i) {
    client->AttendAsync(Request(512), absl::Seconds(120), [&](auto response) {
      {
        absl::MutexLock lock(&results_mu);
        results.push_back(response.status());
      }
      if (response.ok() && !first_answered.HasBeenNotified()) first_answered.Notify();
      pending.DecrementCount();
    });
  }
  first_answered.WaitForNotification();  // the server is busy computing the rest
  first->Signal(SIGKILL);
  EXPECT_EQ(first->Wait(), 128 + SIGKILL);
  pending.Wait();  // every call ends: none hangs on a dead connection
  int ok = 0;
  for (const absl::Status& status : results) {
    if (status.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_LT(ok, kInFlight);

  std::vector<std::string> second_flags = flags;
  second_flags.push_back(absl::StrCat("--port=", port));
  ServerProcess second(ATTNSERVE_BINARY, second_flags, StderrPath("sigkill-second"));
  ASSERT_EQ(second.ReadPort(), port) << second.Stderr();
  // The channel reconnects on its own backoff; the new process answers the same client.
  absl::Status recovered = absl::UnavailableError("not tried");
  for (int attempt = 0; attempt < 300 && !recovered.ok(); ++attempt) {
    recovered = client->Attend(Request(8), absl::Seconds(10)).status();
    if (!recovered.ok()) {
      EXPECT_EQ(recovered.code(), absl::StatusCode::kUnavailable) << recovered;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  EXPECT_TRUE(recovered.ok()) << recovered;
  second.Signal(SIGTERM);
  EXPECT_EQ(second.Wait(), 0) << second.Stderr();
}

// (name, scheduling policy) of each of process `pid`'s threads, from /proc: the name
// is the `comm` field, the policy the 41st field of the thread's stat line.
std::vector<std::pair<std::string, int>> ThreadPolicies(pid_t pid) {
  std::vector<std::pair<std::string, int>> threads;
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  for (const auto& task : std::filesystem::directory_iterator(tasks)) {
    std::ifstream file(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(file)),
                     std::istreambuf_iterator<char>());
    const size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    // Fields after the name start at the 3rd (state); the policy is the 41st.
    const std::vector<std::string> fields =
        absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
    if (fields.size() < 39) continue;
    threads.emplace_back(stat.substr(open + 1, close - open - 1), std::stoi(fields[38]));
  }
  return threads;
}

// --compute_first, then the default (off).
TEST(ServerProcessTest, ComputeFirstRunsWorkersUnderSchedOtherAndEveryOtherThreadBatch) {
  ServerProcess server(
      ATTNSERVE_BINARY,
      {"--host=127.0.0.1", "--port=0", "--metrics_port=-1", "--http_port=0",
       "--instances=2", "--intra_op_threads=2", "--compute_first"},
      StderrPath("compute_first"));
  const int port = server.ReadPort();
  ASSERT_GT(port, 0) << server.Stderr();
  // A batch starts the workers' intra-op threads, which inherit a worker's name.
  ASSERT_TRUE(Connect(port)->Attend(Request(64)).ok());
  int compute = 0, other = 0;
  for (const auto& [name, policy] : ThreadPolicies(server.pid())) {
    if (name == "attn-compute") {
      ++compute;
      EXPECT_EQ(policy, SCHED_OTHER) << name;
    } else {
      ++other;
      EXPECT_EQ(policy, SCHED_BATCH) << name;
    }
  }
  EXPECT_GE(compute, 3);  // 2 workers, and the intra-op thread of the one that ran
  EXPECT_GE(other, 3);    // main, gRPC's and the HTTP door's threads
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(), 0) << server.Stderr();

  ServerProcess fair(
      ATTNSERVE_BINARY,
      {"--host=127.0.0.1", "--port=0", "--metrics_port=-1", "--http_port=0"},
      StderrPath("compute_first_off"));
  ASSERT_GT(fair.ReadPort(), 0) << fair.Stderr();
  for (const auto& [name, policy] : ThreadPolicies(fair.pid())) {
    EXPECT_EQ(policy, SCHED_OTHER) << name;
  }
  fair.Signal(SIGTERM);
  EXPECT_EQ(fair.Wait(), 0) << fair.Stderr();
}

TEST(ServerProcessTest, BadModelRepositoryFailsStartupNamingTheFile) {
  const std::string repository = ::testing::TempDir() + "/bad_repository";
  const std::string model_dir = repository + "/broken";
  std::filesystem::create_directories(model_dir);
  {
    std::ofstream config(model_dir + "/config.pbtxt");
    config << "d_model: 64\nnum_heads: 5\n";
  }
  ServerProcess server(ATTNSERVE_BINARY,
                       {"--host=127.0.0.1", "--port=0", "--metrics_port=-1",
                        "--http_port=-1", "--model_repository=" + repository},
                       StderrPath("bad_repository"));
  EXPECT_EQ(server.ReadPort(), -1);
  EXPECT_NE(server.Wait(), 0);
  const std::string log = server.Stderr();
  EXPECT_THAT(log, HasSubstr("event=startup_failed"));
  EXPECT_THAT(log, HasSubstr(model_dir + "/config.pbtxt"));
  EXPECT_THAT(log, HasSubstr("num_heads must divide d_model"));
}

}  // namespace
}  // namespace attnserve
