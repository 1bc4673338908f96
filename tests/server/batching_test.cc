// Batching, deadlines, cancellation, overload and streaming through a real server.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/fake_clock.h"
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
  // Fake time: the request can never become due by itself, whatever the machine's load.
  FakeClock clock;
  TestServer server = StartServer([&clock](AttentionServer::Options& options) {
    options.models.clock = &clock;
    options.models.batching.max_queue_delay = absl::Hours(1);
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
  ASSERT_TRUE(Eventually([&] { return server.batcher().queue_depth() == 1; }));
  context.TryCancel();
  done.WaitForNotification();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  // The server's cancellation wakes the batcher, which drops the request at once:
  // fake time never moved, so nothing else could have woken it.
  EXPECT_TRUE(
      Eventually([&] { return server.batcher().stats().dropped_cancelled == 1; }));
  EXPECT_EQ(server.batcher().queue_depth(), 0);
  EXPECT_EQ(server.batcher().stats().computed_requests, 0);
}

TEST(BatchingTest, FullQueueIsResourceExhaustedAndServerRecovers) {
  // Fake time: the two queued requests stay queued until the test advances it.
  FakeClock clock;
  TestServer server = StartServer([&clock](AttentionServer::Options& options) {
    options.models.clock = &clock;
    options.models.batching.max_queue_delay = absl::Milliseconds(10);
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
  ASSERT_TRUE(Eventually([&] { return server.batcher().queue_depth() == 2; }));
  auto rejected = server.client->Attend(Request(3, 9));
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(rejected.status().message(), HasSubstr("max_queue_size=2"));
  clock.Advance(absl::Milliseconds(10));
  pending.Wait();
  EXPECT_TRUE(queued[0].ok()) << queued[0];
  EXPECT_TRUE(queued[1].ok()) << queued[1];
  // A lone request is due after the delay too: answer it by advancing time until done.
  absl::Notification recovered;
  absl::Status last;
  server.client->AttendAsync(Request(3, 10), absl::Seconds(30), [&](auto response) {
    last = response.status();
    recovered.Notify();
  });
  EXPECT_TRUE(Eventually([&] {
    clock.Advance(absl::Milliseconds(10));
    return recovered.HasBeenNotified();
  }));
  EXPECT_TRUE(last.ok()) << last;
}

TEST(BatchingTest, ShutdownComputesQueuedCallsWithoutWaitingForTheirDelay) {
  TestServer server = StartServer([](AttentionServer::Options& options) {
    options.models.batching.max_queue_delay = absl::Hours(1);
    options.grace_period = absl::Hours(1);  // a hang would outlast the test's timeout
  });
  absl::Notification done;
  absl::Status status;
  server.client->AttendAsync(Request(4, 1), absl::Seconds(60), [&](auto response) {
    status = response.status();
    done.Notify();
  });
  ASSERT_TRUE(Eventually([&] { return server.batcher().queue_depth() == 1; }));
  server.server->Shutdown();
  done.WaitForNotification();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(server.batcher().stats().computed_requests, 1);
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

// Two workers and two answer threads: batches finish and are answered in any order,
// and each stream still gets its answers in the order of its messages.
TEST(StreamingTest, AnswerThreadsKeepEveryStreamInOrder) {
  TestServer server = StartServer([](AttentionServer::Options& options) {
    options.models.batching.instances = 2;
    options.models.batching.answer_threads = 2;
  });
  constexpr int kStreams = 3;
  constexpr int kMessages = 200;
  std::vector<std::thread> streams;
  for (int s = 0; s < kStreams; ++s) {
    streams.emplace_back([&, s] {
      grpc::ClientContext context;
      auto stream = server.client->stub()->AttendStream(&context);
      std::thread writer([&] {
        for (int i = 0; i < kMessages; ++i) {
          v1::AttendStreamRequest message;
          *message.mutable_request() = Request(1 + (i + s) % 8, i);
          message.mutable_request()->set_request_id(absl::StrCat(s, "-", i));
          if (!stream->Write(message)) break;
        }
        stream->WritesDone();
      });
      int received = 0;
      v1::AttendStreamResponse answer;
      while (stream->Read(&answer)) {
        EXPECT_TRUE(answer.has_response()) << answer.error().message();
        EXPECT_EQ(answer.response().request_id(), absl::StrCat(s, "-", received));
        EXPECT_EQ(answer.response().output().shape(0), 1 + (received + s) % 8);
        ++received;
      }
      writer.join();
      EXPECT_TRUE(stream->Finish().ok());
      EXPECT_EQ(received, kMessages);
    });
  }
  for (std::thread& stream : streams) stream.join();
  EXPECT_EQ(server.batcher().stats().computed_requests, kStreams * kMessages);
}

TEST(StreamingTest, DrainAnswersWhatTheStreamHoldsThenEndsUnavailable) {
  TestServer server = StartServer([](AttentionServer::Options& options) {
    // Long enough that a stream left open until the grace period ends would end
    // CANCELLED only after this test's timeout, not UNAVAILABLE.
    options.grace_period = absl::Seconds(120);
  });
  grpc::ClientContext context;
  auto stream = server.client->stub()->AttendStream(&context);
  for (int i = 0; i < 3; ++i) {
    v1::AttendStreamRequest message;
    *message.mutable_request() = Request(4, i);
    ASSERT_TRUE(stream->Write(message));
  }
  // The server holds all three once they are counted as started.
  ASSERT_TRUE(Eventually([&] { return server.batcher().stats().enqueued == 3; }));
  std::thread shutdown([&] { server.server->Shutdown(); });
  int answered = 0;
  v1::AttendStreamResponse answer;
  while (stream->Read(&answer)) {
    EXPECT_TRUE(answer.has_response()) << answer.error().message();
    ++answered;
  }
  const grpc::Status status = stream->Finish();
  shutdown.join();
  EXPECT_EQ(answered, 3);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("reopen the stream"));
}

// Messages that reach an open stream while the server starts to drain are computed, not
// refused one by one: a per-message error is a failure the client cannot retry, while
// the stream's own UNAVAILABLE end tells it to reopen elsewhere and send again what was
// not answered. (Refusing them raced the drain in rollout_test: one stream message in a
// rollout came back UNAVAILABLE.)
TEST(StreamingTest, DrainComputesEveryMessageTheStreamHasRead) {
  TestServer server = StartServer([](AttentionServer::Options& options) {
    options.grace_period = absl::Seconds(120);
  });
  grpc::ClientContext context;
  auto stream = server.client->stub()->AttendStream(&context);
  // The client writes until the stream ends, so messages keep arriving while the
  // drain begins.
  std::atomic<int> written{0};
  std::thread writer([&] {
    for (int i = 0; i < 100000; ++i) {
      v1::AttendStreamRequest message;
      *message.mutable_request() = Request(1, i);
      if (!stream->Write(message)) break;
      ++written;
    }
    stream->WritesDone();
  });
  int answered = 0;
  int refused = 0;
  std::thread shutdown;
  v1::AttendStreamResponse answer;
  while (stream->Read(&answer)) {
    if (answer.has_response()) {
      ++answered;
    } else {
      ADD_FAILURE() << "message " << answered + refused << ": "
                    << answer.error().message();
      ++refused;
    }
    if (answered == 200) shutdown = std::thread([&] { server.server->Shutdown(); });
  }
  writer.join();  // its Write fails once the stream has ended
  const grpc::Status status = stream->Finish();
  ASSERT_TRUE(shutdown.joinable());
  shutdown.join();
  EXPECT_EQ(refused, 0);
  EXPECT_GT(written.load(), answered);  // the stream stopped reading, as drained
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

// A client that sends on a stream and never reads: its answers wait in the server until
// written, and they stay counted in the queue budget meanwhile. So they cannot grow the
// server's memory past it: new work is refused instead (here a unary call from another
// caller), and the bytes come back when the stream goes away.
TEST(StreamingTest, SlowReaderHoldsItsAnswersInsideTheQueueBudget) {
  constexpr int64_t kBudget = int64_t{8} << 20;
  TestServer server = StartServer([](AttentionServer::Options& options) {
    options.models.batching.max_queue_bytes = kBudget;
  });
  // 64 messages (the most a stream reads ahead) of 2 MiB answers each: far more than
  // loopback socket buffers and HTTP/2 windows absorb, so writes stall.
  constexpr int kMessages = 64;
  constexpr int64_t kLength = 1024;
  grpc::ClientContext context;
  auto stream = server.client->stub()->AttendStream(&context);
  for (int i = 0; i < kMessages; ++i) {
    v1::AttendStreamRequest message;
    *message.mutable_request() = Request(kLength, i);
    ASSERT_TRUE(stream->Write(message));
  }
  // Every message was either computed or refused (the budget was full).
  const auto settled = [&] {
    const BatcherStats stats = server.batcher().stats();
    return stats.enqueued + stats.rejected_queue_bytes + stats.rejected_queue_full ==
               kMessages &&
           stats.computed_requests == stats.enqueued;
  };
  for (int i = 0; i < 12000 && !settled(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(settled());
  EXPECT_GT(server.batcher().stats().rejected_queue_bytes, 0);
  const int64_t held = server.batcher().held_bytes();
  EXPECT_GT(held, 0);        // unwritten answers are counted...
  EXPECT_LE(held, kBudget);  // ...and never beyond the budget
  const absl::Status refused = server.client->Attend(Request(kLength, 99)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("max_queue_bytes"));

  context.TryCancel();  // the slow reader goes away: its answers are discarded
  ASSERT_TRUE(Eventually([&] { return server.batcher().held_bytes() == 0; }));
  EXPECT_TRUE(server.client->Attend(Request(kLength, 100)).ok());
}

TEST(StreamingTest, ManyStreamsEndingWhileAnswersArriveLeaveNoDanglingReactor) {
  // Streams that close (WritesDone, then the client goes away) while the batcher is
  // still answering race OnDone against Complete; run under ASan this catches a
  // reactor used after deletion.
  TestServer server = StartServer();
  constexpr int kStreams = 16;
  std::vector<std::thread> clients;
  for (int c = 0; c < kStreams; ++c) {
    clients.emplace_back([&server, c] {
      grpc::ClientContext context;
      auto stream = server.client->stub()->AttendStream(&context);
      for (int i = 0; i < 20; ++i) {
        v1::AttendStreamRequest message;
        *message.mutable_request() = Request(1 + (c + i) % 8, i);
        if (!stream->Write(message)) break;
      }
      stream->WritesDone();
      v1::AttendStreamResponse answer;
      // Half the clients read everything; the others cancel after the first answer.
      if (c % 2 == 0) {
        while (stream->Read(&answer)) {
        }
        EXPECT_TRUE(stream->Finish().ok());
      } else {
        stream->Read(&answer);
        context.TryCancel();
        stream->Finish();
      }
    });
  }
  for (std::thread& client : clients) client.join();
  EXPECT_TRUE(server.client->Attend(Request(3, 1)).ok());
}

}  // namespace
}  // namespace attnserve::server
