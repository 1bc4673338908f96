// Batching, deadlines, cancellation, overload and streaming through a real server.
#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/test_server.h"

namespace attnserve::server {
namespace {

using ::attnserve::client::Float32Tensor;
using ::attnserve::server::testing::Eventually;
using ::attnserve::server::testing::RandomValues;
using ::attnserve::server::testing::StartServer;
using ::attnserve::server::testing::TestServer;
using ::testing::HasSubstr;

constexpr int64_t kD = 512;

v1::AttendRequest Request(int64_t length, uint32_t seed) {
  v1::AttendRequest request;
  *request.mutable_query() = Float32Tensor(RandomValues(length * kD, seed), {length, kD});
  return request;
}

// Sends `count` requests at once and waits for every answer.
std::vector<absl::StatusOr<v1::AttendResponse>> SendConcurrently(TestServer& server,
                                                                 int count) {
  std::vector<absl::StatusOr<v1::AttendResponse>> responses(count,
                                                            absl::UnknownError("unset"));
  absl::BlockingCounter pending(count);
  for (int i = 0; i < count; ++i) {
    server.client->AttendAsync(Request(1 + (i * 5) % 24, i), absl::Seconds(60),
                               [&responses, &pending, i](auto response) {
                                 responses[i] = std::move(response);
                                 pending.DecrementCount();
                               });
  }
  pending.Wait();
  return responses;
}

TEST(BatchingTest, ConcurrentRequestsFormBatchesWhenDelayAllows) {
  TestServer server = StartServer([](AttentionServer::Options& options) {
    options.models.batching.max_queue_delay = absl::Milliseconds(20);
  });
  for (const auto& response : SendConcurrently(server, 64)) {
    ASSERT_TRUE(response.ok()) << response.status();
  }
  const BatcherStats stats = server.batcher().stats();
  EXPECT_EQ(stats.computed_requests, 64);
  EXPECT_GT(stats.max_batch_size_seen, 1);
  EXPECT_LT(stats.batches, 64);
}

TEST(BatchingTest, MaxBatchSizeOneNeverBatches) {
  TestServer server = StartServer([](AttentionServer::Options& options) {
    options.models.batching.max_queue_delay = absl::Milliseconds(20);
    options.models.batching.max_batch_size = 1;
  });
  for (const auto& response : SendConcurrently(server, 64)) {
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->batch_size(), 1);
  }
  const BatcherStats stats = server.batcher().stats();
  EXPECT_EQ(stats.max_batch_size_seen, 1);
  EXPECT_EQ(stats.batches, 64);
}

TEST(BatchingTest, RequestExpiringInQueueIsNotComputed) {
  TestServer server = StartServer([](AttentionServer::Options& options) {
    // A lone request waits this long for company: longer than its deadline.
    options.models.batching.max_queue_delay = absl::Seconds(3);
  });
  auto response = server.client->Attend(Request(4, 1), absl::Milliseconds(200));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kDeadlineExceeded);
  // On a loaded machine the call may reach the server late enough for gRPC to cancel
  // it first; either way it must be dropped, never computed.
  EXPECT_TRUE(Eventually([&] {
    const BatcherStats stats = server.batcher().stats();
    return stats.dropped_deadline + stats.dropped_cancelled == 1;
  }));
  EXPECT_EQ(server.batcher().stats().computed_requests, 0);
}

TEST(BatchingTest, CancelledCallIsDroppedBeforeCompute) {
  TestServer server = StartServer([](AttentionServer::Options& options) {
    options.models.batching.max_queue_delay = absl::Milliseconds(500);
  });
  grpc::ClientContext context;
  absl::Notification done;
  absl::Status status;
  server.client->AttendAsync(
      Request(4, 1), absl::Seconds(30),
      [&](auto response) {
        status = response.status();
        done.Notify();
      },
      &context);
  EXPECT_TRUE(Eventually([&] { return server.batcher().queue_depth() == 1; }));
  context.TryCancel();
  done.WaitForNotification();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(
      Eventually([&] { return server.batcher().stats().dropped_cancelled == 1; }));
  EXPECT_EQ(server.batcher().stats().computed_requests, 0);
}

TEST(BatchingTest, FullQueueIsResourceExhaustedAndServerRecovers) {
  TestServer server = StartServer([](AttentionServer::Options& options) {
    options.models.batching.max_queue_delay = absl::Milliseconds(400);
    options.models.batching.max_batch_size = 8;
    options.models.batching.max_queue_size = 2;
  });
  absl::BlockingCounter pending(2);
  std::vector<absl::Status> queued(2);
  for (int i = 0; i < 2; ++i) {
    server.client->AttendAsync(Request(3, i), absl::Seconds(30), [&, i](auto response) {
      queued[i] = response.status();
      pending.DecrementCount();
    });
  }
  EXPECT_TRUE(Eventually([&] { return server.batcher().queue_depth() == 2; }));
  auto rejected = server.client->Attend(Request(3, 9));
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(rejected.status().message(), HasSubstr("max_queue_size=2"));
  pending.Wait();
  EXPECT_TRUE(queued[0].ok()) << queued[0];
  EXPECT_TRUE(queued[1].ok()) << queued[1];
  EXPECT_TRUE(server.client->Attend(Request(3, 10)).ok());
}

TEST(StreamingTest, ThousandMessagesAnsweredInOrderWithOneError) {
  TestServer server = StartServer();
  grpc::ClientContext context;
  auto stream = server.client->stub()->AttendStream(&context);
  constexpr int kMessages = 1000;
  constexpr int kBad = 500;
  std::thread writer([&] {
    for (int i = 0; i < kMessages; ++i) {
      v1::AttendStreamRequest message;
      *message.mutable_request() = Request(1 + i % 8, i);
      message.mutable_request()->set_request_id(absl::StrCat("m", i));
      if (i == kBad)
        message.mutable_request()->mutable_query()->set_dtype(v1::DATA_TYPE_UNSPECIFIED);
      if (!stream->Write(message)) break;
    }
    stream->WritesDone();
  });
  int received = 0;
  v1::AttendStreamResponse answer;
  while (stream->Read(&answer)) {
    const std::string expected_id = absl::StrCat("m", received);
    if (received == kBad) {
      EXPECT_TRUE(answer.has_error());
      EXPECT_EQ(answer.error().code(),
                static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      EXPECT_THAT(answer.error().message(), HasSubstr("query.dtype"));
      EXPECT_EQ(answer.error().request_id(), expected_id);
    } else {
      ASSERT_TRUE(answer.has_response()) << received << ": " << answer.error().message();
      EXPECT_EQ(answer.response().request_id(), expected_id);
      EXPECT_EQ(answer.response().output().shape(0), 1 + received % 8);
    }
    ++received;
  }
  writer.join();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(received, kMessages);
}

}  // namespace
}  // namespace attnserve::server
