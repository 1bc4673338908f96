// The metrics a running server records, read back in the text format /metrics serves.
#include <chrono>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/observability/server_metrics.h"
#include "tests/server/test_server.h"

namespace attnserve::server {
namespace {

using ::attnserve::client::Float32Tensor;
using ::attnserve::server::testing::Eventually;
using ::attnserve::server::testing::StartServer;
using ::attnserve::server::testing::TestServer;

// The value of the sample `name{labels}` in `text`, where `labels` lists label="value"
// pairs that must all appear (in any order); -1 when absent.
double Sample(const std::string& text, const std::string& name,
              const std::vector<std::string>& labels = {}) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t end_of_name = line.find_first_of("{ ");
    if (line.substr(0, end_of_name) != name) continue;
    bool all = true;
    for (const std::string& label : labels) all &= line.find(label) != std::string::npos;
    if (!all) continue;
    double value = -1;
    EXPECT_TRUE(absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) << line;
    return value;
  }
  return -1;
}

v1::AttendRequest Request(int64_t length) {
  v1::AttendRequest request;
  *request.mutable_query() =
      Float32Tensor(std::vector<float>(length * 512, 0.5f), {length, 512});
  return request;
}

TEST(ServerMetricsTest, CountsEqualWhatWasSentPerCode) {
  // A lone request waits an hour for company, so what is queued stays queued until the
  // test flushes the batcher: no step depends on how fast this machine is.
  TestServer server = StartServer([](AttentionServer::Options& options) {
    options.models.batching.max_queue_delay = absl::Hours(1);
    options.models.batching.max_batch_size = 4;
    options.models.batching.max_queue_size = 1;
  });
  // 1 DEADLINE_EXCEEDED: its deadline (long enough to reach the server on a loaded
  // machine) passes in the queue; dropped before compute.
  EXPECT_EQ(server.client->Attend(Request(2), absl::Milliseconds(500)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(Eventually([&] { return server.batcher().stats().dropped_deadline == 1; }));
  // 1 OK that holds the only queue slot, and 1 RESOURCE_EXHAUSTED meanwhile.
  absl::Notification held_done;
  server.client->AttendAsync(Request(4), absl::Seconds(30), [&](auto response) {
    EXPECT_TRUE(response.ok());
    held_done.Notify();
  });
  ASSERT_TRUE(Eventually([&] { return server.batcher().queue_depth() == 1; }));
  EXPECT_EQ(server.client->Attend(Request(2)).status().code(),
            absl::StatusCode::kResourceExhausted);
  // From here on batches run at once.
  server.batcher().Flush();
  held_done.WaitForNotification();
  // 3 OK, one at a time (each alone in its batch).
  for (int64_t length : {3, 5, 8})
    ASSERT_TRUE(server.client->Attend(Request(length)).ok());
  // 2 INVALID_ARGUMENT.
  v1::AttendRequest bad = Request(2);
  bad.mutable_query()->set_dtype(v1::DATA_TYPE_UNSPECIFIED);
  EXPECT_FALSE(server.client->Attend(bad).ok());
  EXPECT_FALSE(server.client->Attend(bad).ok());
  ASSERT_TRUE(Eventually([&] {
    return Sample(server.server->metrics().Render(), "attnserve_requests_total",
                  {"model=\"mha-base\"", "code=\"INVALID_ARGUMENT\""}) == 2;
  }));

  const std::string text = server.server->metrics().Render();
  const std::string model = "model=\"mha-base\"";
  EXPECT_EQ(Sample(text, "attnserve_requests_total", {model, "code=\"OK\""}), 4);
  EXPECT_EQ(
      Sample(text, "attnserve_requests_total", {model, "code=\"INVALID_ARGUMENT\""}), 2);
  EXPECT_EQ(
      Sample(text, "attnserve_requests_total", {model, "code=\"RESOURCE_EXHAUSTED\""}),
      1);
  EXPECT_EQ(
      Sample(text, "attnserve_requests_total", {model, "code=\"DEADLINE_EXCEEDED\""}), 1);
  EXPECT_EQ(Sample(text, "attnserve_requests_total", {model, "code=\"CANCELLED\""}), 0);
  EXPECT_EQ(Sample(text, "attnserve_request_duration_seconds_count", {model}), 8);
  EXPECT_EQ(Sample(text, "attnserve_refusal_duration_seconds_count", {model}), 1);
  // Four computed batches of one request each, 3+5+8+4 tokens.
  EXPECT_EQ(Sample(text, "attnserve_batch_size_count", {model}), 4);
  EXPECT_EQ(Sample(text, "attnserve_batch_size_bucket", {model, "le=\"1\""}), 4);
  EXPECT_EQ(Sample(text, "attnserve_batch_tokens_sum", {model}), 20);
  EXPECT_EQ(Sample(text, "attnserve_tokens_total", {model}), 20);
  EXPECT_EQ(Sample(text, "attnserve_compute_duration_seconds_count", {model}), 4);
  // Queue time is observed for computed and dropped requests alike.
  EXPECT_EQ(Sample(text, "attnserve_queue_duration_seconds_count", {model}), 5);
  EXPECT_EQ(Sample(text, "attnserve_inflight_requests", {model}), 0);
  EXPECT_EQ(Sample(text, "attnserve_queue_depth", {model}), 0);
  EXPECT_EQ(Sample(text, "attnserve_queue_capacity", {model}), 1);
  EXPECT_EQ(
      Sample(text, "attnserve_model_info", {model, "d_model=\"512\"", "heads=\"8\""}), 1);
  // The model loaded at start: counted, at version 1, none unloaded; and the warm-up's
  // choice for its 512 x 512 projections.
  EXPECT_EQ(Sample(text, "attnserve_model_loads_total", {model, "outcome=\"ok\""}), 1);
  EXPECT_EQ(Sample(text, "attnserve_model_version", {model}), 1);
  EXPECT_EQ(Sample(text, "attnserve_model_unloads_total", {model}), 0);
  EXPECT_EQ(Sample(text, "attnserve_projection_primitive_info",
                   {"in_features=\"512\"", "out_features=\"512\""}),
            1);
  // The model's head size (512 / 8 = 64) had its attention kernel timed at load.
  EXPECT_EQ(Sample(text, "attnserve_attention_kernel_info", {"head_dim=\"64\""}), 1);
  const std::string attend = "grpc_method=\"Attend\"";
  EXPECT_EQ(Sample(text, "grpc_server_started_total", {attend}), 8);
  EXPECT_EQ(Sample(text, "grpc_server_handled_total", {attend, "grpc_code=\"OK\""}), 4);
  EXPECT_EQ(Sample(text, "grpc_server_handled_total",
                   {attend, "grpc_code=\"InvalidArgument\""}),
            2);
  EXPECT_EQ(Sample(text, "grpc_server_handling_seconds_count", {attend}), 8);
  EXPECT_GT(Sample(text, "process_resident_memory_bytes"), 1e6);
  EXPECT_GT(Sample(text, "process_open_fds"), 3);
}

TEST(ServerMetricsTest, EveryMethodIsCounted) {
  // ListModels, GetModel and HeadStatistics answer without the batcher queue (or, for
  // HeadStatistics, through it); each call is counted under its own method.
  TestServer server = StartServer();
  ASSERT_TRUE(server.client->ListModels().ok());
  ASSERT_TRUE(server.client->GetModel("mha-base").ok());
  EXPECT_EQ(server.client->GetModel("nope").status().code(), absl::StatusCode::kNotFound);
  v1::HeadStatisticsRequest statistics;
  *statistics.mutable_query() = Request(3).query();
  ASSERT_TRUE(server.client->HeadStatistics(statistics).ok());
  ASSERT_TRUE(Eventually([&] {
    return Sample(server.server->metrics().Render(), "grpc_server_handled_total",
                  {"grpc_method=\"HeadStatistics\"", "grpc_code=\"OK\""}) == 1;
  }));
  const std::string text = server.server->metrics().Render();
  EXPECT_EQ(Sample(text, "grpc_server_started_total", {"grpc_method=\"ListModels\""}), 1);
  EXPECT_EQ(Sample(text, "grpc_server_handled_total",
                   {"grpc_method=\"ListModels\"", "grpc_code=\"OK\""}),
            1);
  EXPECT_EQ(Sample(text, "grpc_server_started_total", {"grpc_method=\"GetModel\""}), 2);
  EXPECT_EQ(Sample(text, "grpc_server_handled_total",
                   {"grpc_method=\"GetModel\"", "grpc_code=\"NotFound\""}),
            1);
  EXPECT_EQ(Sample(text, "grpc_server_started_total", {"grpc_method=\"HeadStatistics\""}),
            1);
}

// Every RPC the port serves, as its service descriptor lists it, has its
// grpc_server_* series from the start (at 0), and a call is counted under it: an RPC
// added to a .proto cannot go uncounted.
TEST(ServerMetricsTest, EveryMethodOfEveryServiceHasItsSeries) {
  TestServer server = StartServer();
  const std::string text = server.server->metrics().Render();
  int methods = 0;
  for (const char* name :
       {"attnserve.v1.AttentionService", "inference.GRPCInferenceService"}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i, ++methods) {
      const std::vector<std::string> labels = {
          absl::StrCat("grpc_service=\"", name, "\""),
          absl::StrCat("grpc_method=\"", service->method(i)->name(), "\"")};
      EXPECT_EQ(Sample(text, "grpc_server_started_total", labels), 0)
          << service->method(i)->full_name();
    }
  }
  EXPECT_GE(methods, 18);
  // Encode, once missing from the list, counts its calls.
  auto stub = v1::AttentionService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", server.server->port()),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::EncodeRequest request;
  request.set_model("no-such-encoder");
  v1::EncodeResponse response;
  EXPECT_EQ(stub->Encode(&context, request, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Eventually([&] {
    return Sample(server.server->metrics().Render(), "grpc_server_handled_total",
                  {"grpc_method=\"Encode\"", "grpc_code=\"NotFound\""}) == 1;
  }));
  EXPECT_EQ(Sample(server.server->metrics().Render(), "grpc_server_started_total",
                   {"grpc_method=\"Encode\""}),
            1);
}

TEST(ServerMetricsTest, UnknownModelIsCountedUnderOneLabel) {
  TestServer server = StartServer();
  v1::AttendRequest request = Request(2);
  for (const char* name : {"a", "b", "c"}) {
    request.set_model(name);
    EXPECT_EQ(server.client->Attend(request).status().code(),
              absl::StatusCode::kNotFound);
  }
  const std::string text = server.server->metrics().Render();
  EXPECT_EQ(Sample(text, "attnserve_requests_total",
                   {"model=\"_unknown\"", "code=\"NOT_FOUND\""}),
            3);
  EXPECT_EQ(text.find("model=\"a\""), std::string::npos);
}

TEST(ServerMetricsTest, StreamCountsOneRpcAndEveryMessage) {
  TestServer server = StartServer();
  grpc::ClientContext context;
  auto stream = server.client->stub()->AttendStream(&context);
  for (int i = 0; i < 5; ++i) {
    v1::AttendStreamRequest message;
    *message.mutable_request() = Request(2);
    ASSERT_TRUE(stream->Write(message));
  }
  stream->WritesDone();
  v1::AttendStreamResponse answer;
  while (stream->Read(&answer)) {
  }
  ASSERT_TRUE(stream->Finish().ok());
  ASSERT_TRUE(Eventually([&] {
    return Sample(server.server->metrics().Render(), "grpc_server_handled_total",
                  {"grpc_method=\"AttendStream\"", "grpc_code=\"OK\""}) == 1;
  }));
  const std::string text = server.server->metrics().Render();
  EXPECT_EQ(Sample(text, "grpc_server_started_total",
                   {"grpc_method=\"AttendStream\"", "grpc_type=\"bidi_stream\""}),
            1);
  EXPECT_EQ(
      Sample(text, "attnserve_requests_total", {"model=\"mha-base\"", "code=\"OK\""}), 5);
}

TEST(ServerMetricsTest, BucketsSpanSubMillisecondToSeconds) {
  EXPECT_EQ(DurationBuckets().front(), 0.0001);
  EXPECT_EQ(DurationBuckets().back(), 25);
  EXPECT_THAT(PowerOfTwoBuckets(32), ::testing::ElementsAre(1, 2, 4, 8, 16, 32));
  EXPECT_THAT(PowerOfTwoBuckets(20), ::testing::ElementsAre(1, 2, 4, 8, 16, 32));
}

}  // namespace
}  // namespace attnserve::server
