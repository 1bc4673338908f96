// Batcher<Work> with an executor of the test's own: the Pack → Run → Scatter order, what
// each work is told about its batch, errors at each step, one executor per instance. The
// policy itself is batch_scheduler_test's; the real executors have their own tests.
#include "server/batching/batcher.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/fake_clock.h"

namespace attnserve::server {
namespace {

using ::testing::ElementsAre;

struct FakeWork {
  int64_t value = 0;
  int64_t result = 0;
  int64_t reserved_bytes = 0;
  absl::Time deadline = absl::InfiniteFuture();
  std::shared_ptr<const std::atomic<bool>> cancelled;
  absl::Duration queue_time;
  absl::Duration compute_time = absl::Seconds(-1);
  int batch_size = 0;
  int64_t batch_id = 0;

  int64_t tokens() const { return value; }
  bool SharesBatchWith(const FakeWork& /*other*/) const { return true; }
};

// What the executors were asked to do, in order, and what the batches were told.
struct Log {
  absl::Mutex mu;
  std::vector<std::string> calls ABSL_GUARDED_BY(mu);
  std::vector<int64_t> batch_tokens ABSL_GUARDED_BY(mu);
  std::vector<std::pair<absl::Status, std::unique_ptr<FakeWork>>> answers
      ABSL_GUARDED_BY(mu);

  void Add(std::string call) {
    absl::MutexLock lock(&mu);
    calls.push_back(std::move(call));
  }
  void WaitForAnswers(size_t count) {
    absl::MutexLock lock(&mu);
    const auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return answers.size() >= count;
    };
    mu.Await(absl::Condition(&enough));
  }
};

// Packs the values into a sum, "runs" by doubling it, scatters value * 2 into each work.
class FakeExecutor final : public BatchExecutor<FakeWork> {
 public:
  FakeExecutor(int id, Log* log, absl::Status pack_status, absl::Status run_status)
      : id_(id), log_(log), pack_status_(pack_status), run_status_(run_status) {}

  absl::Status Pack(absl::Span<FakeWork* const> batch) override {
    log_->Add(absl::StrCat("pack ", batch.size(), " on ", id_));
    packed_ = 0;
    for (const FakeWork* work : batch) packed_ += work->value;
    return pack_status_;
  }
  absl::Status Run() override {
    log_->Add(absl::StrCat("run ", packed_));
    packed_ *= 2;
    return run_status_;
  }
  void Scatter(absl::Span<FakeWork* const> batch, bool computed) override {
    log_->Add(absl::StrCat("scatter ", computed ? "computed" : "failed"));
    if (computed) {
      for (FakeWork* work : batch) work->result = work->value * 2;
    }
  }

 private:
  const int id_;
  Log* const log_;
  const absl::Status pack_status_, run_status_;
  int64_t packed_ = 0;
};

class BatcherTest : public ::testing::Test {
 protected:
  // Batches of exactly three: the first batch is dispatched when it is full.
  std::unique_ptr<Batcher<FakeWork>> Make(absl::Status pack_status = absl::OkStatus(),
                                          absl::Status run_status = absl::OkStatus()) {
    BatchingOptions options;
    options.clock = &clock_;
    options.max_batch_size = 3;
    options.max_queue_delay = absl::Hours(1);
    options.observer.on_batch = [this](int /*size*/, int64_t tokens,
                                       absl::Duration /*compute*/) {
      absl::MutexLock lock(&log_.mu);
      log_.batch_tokens.push_back(tokens);
    };
    int made = 0;
    auto batcher = Batcher<FakeWork>::Create(
        options, [&]() -> absl::StatusOr<std::unique_ptr<BatchExecutor<FakeWork>>> {
          return std::make_unique<FakeExecutor>(made++, &log_, pack_status, run_status);
        });
    EXPECT_TRUE(batcher.ok()) << batcher.status();
    return std::move(batcher).value();
  }

  void EnqueueThree(Batcher<FakeWork>& batcher) {
    for (int64_t value : {1, 2, 3}) {
      auto work = std::make_unique<FakeWork>();
      work->value = value;
      ASSERT_TRUE(
          batcher
              .Enqueue(std::move(work),
                       [this](absl::Status status, std::unique_ptr<FakeWork> work) {
                         absl::MutexLock lock(&log_.mu);
                         log_.answers.emplace_back(status, std::move(work));
                       })
              .ok());
    }
    log_.WaitForAnswers(3);
  }

  FakeClock clock_;
  Log log_;
};

TEST_F(BatcherTest, PacksRunsAndScattersEachBatchOnce) {
  auto batcher = Make();
  EnqueueThree(*batcher);
  absl::MutexLock lock(&log_.mu);
  EXPECT_THAT(log_.calls, ElementsAre("pack 3 on 0", "run 6", "scatter computed"));
  EXPECT_THAT(log_.batch_tokens, ElementsAre(6));
  for (const auto& [status, work] : log_.answers) {
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_EQ(work->result, work->value * 2);
    EXPECT_EQ(work->batch_size, 3);
    // One batch: one number, shared.
    EXPECT_GT(work->batch_id, 0);
    EXPECT_EQ(work->batch_id, log_.answers.front().second->batch_id);
    EXPECT_GE(work->compute_time, absl::ZeroDuration());
  }
}

TEST_F(BatcherTest, APackErrorFailsEveryRequestWithoutRunning) {
  auto batcher = Make(absl::InvalidArgumentError("packed batch too large"));
  EnqueueThree(*batcher);
  absl::MutexLock lock(&log_.mu);
  EXPECT_THAT(log_.calls, ElementsAre("pack 3 on 0", "scatter failed"));
  EXPECT_TRUE(log_.batch_tokens.empty());  // a failed batch is not counted as computed
  for (const auto& [status, work] : log_.answers) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(work->result, 0);
    EXPECT_EQ(work->compute_time, absl::ZeroDuration());
  }
}

TEST_F(BatcherTest, ARunErrorFailsEveryRequestAndFreesTheBatch) {
  auto batcher = Make(absl::OkStatus(), absl::InternalError("engine fault"));
  EnqueueThree(*batcher);
  absl::MutexLock lock(&log_.mu);
  EXPECT_THAT(log_.calls, ElementsAre("pack 3 on 0", "run 6", "scatter failed"));
  EXPECT_TRUE(log_.batch_tokens.empty());
  for (const auto& [status, work] : log_.answers) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
    EXPECT_EQ(work->result, 0);
  }
}

TEST(BatcherCreateTest, MakesOneExecutorPerInstanceAndPassesOnAFactoryError) {
  BatchingOptions options;
  options.instances = 3;
  int made = 0;
  auto batcher = Batcher<FakeWork>::Create(
      options, [&]() -> absl::StatusOr<std::unique_ptr<BatchExecutor<FakeWork>>> {
        if (++made == 3) return absl::ResourceExhaustedError("no memory for instance 3");
        return std::make_unique<FakeExecutor>(made, nullptr, absl::OkStatus(),
                                              absl::OkStatus());
      });
  EXPECT_EQ(made, 3);
  EXPECT_EQ(batcher.status().code(), absl::StatusCode::kResourceExhausted);

  options.instances = 0;
  batcher = Batcher<FakeWork>::Create(
      options, []() -> absl::StatusOr<std::unique_ptr<BatchExecutor<FakeWork>>> {
        return absl::InternalError("not called");
      });
  EXPECT_EQ(batcher.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(batcher.status().message()), ::testing::HasSubstr("instances"));
}

}  // namespace
}  // namespace attnserve::server
