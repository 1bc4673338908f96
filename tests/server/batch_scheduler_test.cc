// The batching policy alone: BatchScheduler over a task of the test's own, with an
// executor that records what it was given. No core, no gRPC; time is a FakeClock.
#include "server/batching/batch_scheduler.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/fake_clock.h"

namespace attnserve::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct FakeTask {
  int id = 0;
  int64_t size = 1;
  // Tasks share a batch only with their own kind; "alone" ones with none.
  std::string kind = "a";
  int64_t reserved_bytes = 0;
  absl::Time deadline = absl::InfiniteFuture();
  std::shared_ptr<const std::atomic<bool>> cancelled;
  absl::Duration queue_time;
  int executed_in_batch_of = 0;

  int64_t tokens() const { return size; }
  bool SharesBatchWith(const FakeTask& other) const {
    return kind == other.kind && kind != "alone";
  }
};

using Scheduler = BatchScheduler<FakeTask>;

std::unique_ptr<FakeTask> Task(int id, int64_t size = 1, std::string kind = "a") {
  auto task = std::make_unique<FakeTask>();
  task->id = id;
  task->size = size;
  task->kind = std::move(kind);
  return task;
}

// Records every batch (the ids in it) and every answer; Wait(n) blocks until n answers.
class Recorder {
 public:
  Scheduler::Executor Executor(absl::Status result = absl::OkStatus()) {
    return [this, result](int /*instance*/, absl::Span<FakeTask* const> batch) {
      std::vector<int> ids;
      for (FakeTask* task : batch) {
        ids.push_back(task->id);
        task->executed_in_batch_of = static_cast<int>(batch.size());
      }
      absl::MutexLock lock(&mu_);
      batches_.push_back(ids);
      return result;
    };
  }
  // Enqueues task `id` on `scheduler`, answered to this recorder.
  void Enqueue(Scheduler& scheduler, int id) {
    ASSERT_TRUE(scheduler.Enqueue(Task(id), Callback()).ok());
  }
  Scheduler::Callback Callback() {
    return [this](absl::Status status, std::unique_ptr<FakeTask> task) {
      absl::MutexLock lock(&mu_);
      answers_.push_back({task->id, status});
      tasks_.push_back(std::move(task));
    };
  }
  void Wait(size_t answers) {
    absl::MutexLock lock(&mu_);
    const auto enough = [this, answers]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return answers_.size() >= answers;
    };
    mu_.Await(absl::Condition(&enough));
  }
  std::vector<std::vector<int>> batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  // The status each task id was answered with.
  absl::Status StatusOf(int id) {
    absl::MutexLock lock(&mu_);
    for (const auto& [task, status] : answers_) {
      if (task == id) return status;
    }
    return absl::UnknownError("not answered");
  }
  const FakeTask& TaskOf(int id) {
    absl::MutexLock lock(&mu_);
    for (const auto& task : tasks_) {
      if (task->id == id) return *task;
    }
    ADD_FAILURE() << "task " << id << " not answered";
    return *tasks_.front();
  }

 private:
  absl::Mutex mu_;
  std::vector<std::vector<int>> batches_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int, absl::Status>> answers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<FakeTask>> tasks_ ABSL_GUARDED_BY(mu_);
};

BatchingOptions Options(FakeClock& clock) {
  BatchingOptions options;
  options.clock = &clock;
  options.max_queue_delay = absl::Milliseconds(10);
  options.max_batch_size = 4;
  return options;
}

TEST(BatchSchedulerTest, PartialBatchWaitsForItsDelayThenGoesTogether) {
  FakeClock clock;
  Recorder recorder;
  auto scheduler = Scheduler::Create(Options(clock), recorder.Executor());
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  for (int id = 1; id <= 3; ++id) {
    ASSERT_TRUE((*scheduler)->Enqueue(Task(id), recorder.Callback()).ok());
  }
  // Had the first not waited for company it would have run alone.
  clock.Advance(absl::Milliseconds(10));
  recorder.Wait(3);
  EXPECT_THAT(recorder.batches(), ElementsAre(ElementsAre(1, 2, 3)));
  EXPECT_EQ(recorder.TaskOf(1).queue_time, absl::Milliseconds(10));
  EXPECT_EQ((*scheduler)->stats().computed_requests, 3);
}

TEST(BatchSchedulerTest, ABatchAsLargeAsTheLastGoesWithoutWaiting) {
  FakeClock clock;
  Recorder recorder;
  auto scheduler = Scheduler::Create(Options(clock), recorder.Executor());
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  // Two callers, answered together (the first batch waits: there is no last one yet).
  recorder.Enqueue(**scheduler, 1);
  recorder.Enqueue(**scheduler, 2);
  clock.Advance(absl::Milliseconds(10));
  recorder.Wait(2);
  // Their next two requests: the second completes a batch as large as the last, which
  // goes while time stands still; the first alone would have waited.
  recorder.Enqueue(**scheduler, 3);
  recorder.Enqueue(**scheduler, 4);
  recorder.Wait(4);
  // One caller left: its first request waits for the company it had, its next goes at
  // once.
  recorder.Enqueue(**scheduler, 5);
  clock.Advance(absl::Milliseconds(10));
  recorder.Wait(5);
  recorder.Enqueue(**scheduler, 6);
  recorder.Wait(6);
  EXPECT_THAT(recorder.batches(), ElementsAre(ElementsAre(1, 2), ElementsAre(3, 4),
                                              ElementsAre(5), ElementsAre(6)));
  EXPECT_EQ(recorder.TaskOf(4).queue_time, absl::ZeroDuration());
  EXPECT_EQ(recorder.TaskOf(5).queue_time, absl::Milliseconds(10));
  EXPECT_EQ(recorder.TaskOf(6).queue_time, absl::ZeroDuration());
}

TEST(BatchSchedulerTest, TasksQueuedBehindABatchWaitForTheCallersItAnswers) {
  FakeClock clock;
  absl::Notification started, release;
  Recorder recorder;
  const Scheduler::Executor record = recorder.Executor();
  // The first batch runs until the test releases it.
  auto executor = [&](int instance, absl::Span<FakeTask* const> batch) {
    if (!started.HasBeenNotified()) started.Notify();
    release.WaitForNotification();
    return record(instance, batch);
  };
  auto scheduler = Scheduler::Create(Options(clock), executor);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  // Three callers; the third one's request comes late, while the first two's batch
  // runs, and waits past its own delay.
  recorder.Enqueue(**scheduler, 1);
  recorder.Enqueue(**scheduler, 2);
  clock.Advance(absl::Milliseconds(10));
  started.WaitForNotification();
  recorder.Enqueue(**scheduler, 3);
  clock.Advance(absl::Milliseconds(30));
  release.Notify();
  recorder.Wait(2);
  // The worker is free and 3 is alone, smaller than the last batch: it waits for the
  // callers just answered instead of running alone, which would leave the three split
  // in two batches that each wait for the other's.
  clock.AwaitWaiters(1);
  recorder.Enqueue(**scheduler, 4);
  recorder.Wait(4);
  EXPECT_THAT(recorder.batches(), ElementsAre(ElementsAre(1, 2), ElementsAre(3, 4)));
  EXPECT_EQ(recorder.TaskOf(3).queue_time, absl::Milliseconds(30));
}

TEST(BatchSchedulerTest, FullBatchGoesWithoutWaiting) {
  FakeClock clock;
  Recorder recorder;
  BatchingOptions options = Options(clock);
  options.max_queue_delay = absl::Hours(1);
  auto scheduler = Scheduler::Create(options, recorder.Executor());
  ASSERT_TRUE(scheduler.ok());
  for (int id = 1; id <= 4; ++id) {
    ASSERT_TRUE((*scheduler)->Enqueue(Task(id), recorder.Callback()).ok());
  }
  recorder.Wait(4);  // time never moves
  EXPECT_THAT(recorder.batches(), ElementsAre(ElementsAre(1, 2, 3, 4)));
}

TEST(BatchSchedulerTest, TokenBudgetSplitsBatchesAndALargerTaskRunsAlone) {
  FakeClock clock;
  Recorder recorder;
  BatchingOptions options = Options(clock);
  options.max_batch_tokens = 10;
  auto scheduler = Scheduler::Create(options, recorder.Executor());
  ASSERT_TRUE(scheduler.ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(1, 6), recorder.Callback()).ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(2, 4), recorder.Callback()).ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(3, 20), recorder.Callback()).ok());
  clock.Advance(absl::Milliseconds(10));
  recorder.Wait(3);
  EXPECT_THAT(recorder.batches(), ElementsAre(ElementsAre(1, 2), ElementsAre(3)));
}

TEST(BatchSchedulerTest, TasksThatCannotShareABatchRunApartInArrivalOrder) {
  FakeClock clock;
  Recorder recorder;
  auto scheduler = Scheduler::Create(Options(clock), recorder.Executor());
  ASSERT_TRUE(scheduler.ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(1, 1, "a"), recorder.Callback()).ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(2, 1, "b"), recorder.Callback()).ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(3, 1, "a"), recorder.Callback()).ok());
  clock.Advance(absl::Milliseconds(10));
  recorder.Wait(3);
  EXPECT_THAT(recorder.batches(), ElementsAre(ElementsAre(1, 3), ElementsAre(2)));
}

TEST(BatchSchedulerTest, ATaskThatSharesWithNoneRunsAlone) {
  FakeClock clock;
  Recorder recorder;
  auto scheduler = Scheduler::Create(Options(clock), recorder.Executor());
  ASSERT_TRUE(scheduler.ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(1, 1, "alone"), recorder.Callback()).ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(2, 1, "alone"), recorder.Callback()).ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(3, 1, "a"), recorder.Callback()).ok());
  clock.Advance(absl::Milliseconds(10));
  recorder.Wait(3);
  EXPECT_THAT(recorder.batches(),
              ElementsAre(ElementsAre(1), ElementsAre(2), ElementsAre(3)));
}

TEST(BatchSchedulerTest, ExpiredAndCancelledTasksAreAnsweredWithoutExecution) {
  FakeClock clock;
  Recorder recorder;
  auto scheduler = Scheduler::Create(Options(clock), recorder.Executor());
  ASSERT_TRUE(scheduler.ok());
  auto expiring = Task(1);
  expiring->deadline = clock.Now() + absl::Milliseconds(5);
  auto flag = std::make_shared<std::atomic<bool>>(false);
  auto cancelled = Task(2);
  cancelled->cancelled = flag;
  ASSERT_TRUE((*scheduler)->Enqueue(std::move(expiring), recorder.Callback()).ok());
  ASSERT_TRUE((*scheduler)->Enqueue(std::move(cancelled), recorder.Callback()).ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(3), recorder.Callback()).ok());
  flag->store(true);
  clock.Advance(absl::Milliseconds(10));
  recorder.Wait(3);
  EXPECT_EQ(recorder.StatusOf(1).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(recorder.StatusOf(1).message(), HasSubstr("not computed"));
  EXPECT_EQ(recorder.StatusOf(2).code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(recorder.StatusOf(3).ok());
  EXPECT_THAT(recorder.batches(), ElementsAre(ElementsAre(3)));
  const BatcherStats stats = (*scheduler)->stats();
  EXPECT_EQ(stats.dropped_deadline, 1);
  EXPECT_EQ(stats.dropped_cancelled, 1);
}

TEST(BatchSchedulerTest, WakeDropsACancelledTaskWithoutWaitingForTheBatch) {
  FakeClock clock;
  Recorder recorder;
  BatchingOptions options = Options(clock);
  options.max_queue_delay = absl::Hours(1);
  auto scheduler = Scheduler::Create(options, recorder.Executor());
  ASSERT_TRUE(scheduler.ok());
  auto flag = std::make_shared<std::atomic<bool>>(false);
  auto task = Task(1);
  task->cancelled = flag;
  task->reserved_bytes = 64;
  ASSERT_TRUE((*scheduler)->Enqueue(std::move(task), recorder.Callback()).ok());
  flag->store(true);
  (*scheduler)->Wake();
  recorder.Wait(1);  // time never moves
  EXPECT_EQ(recorder.StatusOf(1).code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(recorder.batches().empty());
}

TEST(BatchSchedulerTest, CancellationJustBeforeTheDeadlineCountsAsDeadline) {
  // gRPC cancels a call at its deadline by its own timer, which may run a little ahead
  // of this clock: that drop is a deadline, not a caller's cancellation.
  FakeClock clock;
  Recorder recorder;
  BatchingOptions options = Options(clock);
  options.max_queue_delay = absl::Hours(1);
  auto scheduler = Scheduler::Create(options, recorder.Executor());
  ASSERT_TRUE(scheduler.ok());
  auto flag = std::make_shared<std::atomic<bool>>(false);
  auto task = Task(1);
  task->cancelled = flag;
  task->deadline = clock.Now() + absl::Milliseconds(5);
  ASSERT_TRUE((*scheduler)->Enqueue(std::move(task), recorder.Callback()).ok());
  flag->store(true);
  (*scheduler)->Wake();
  recorder.Wait(1);
  EXPECT_EQ(recorder.StatusOf(1).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ((*scheduler)->stats().dropped_deadline, 1);
}

TEST(BatchSchedulerTest, CountAndByteBudgetsRefuseWithTheLimitAndBytesComeBack) {
  FakeClock clock;
  Recorder recorder;
  BatchingOptions options = Options(clock);
  options.max_queue_size = 2;
  options.max_queue_bytes = 1000;
  auto scheduler = Scheduler::Create(options, recorder.Executor());
  ASSERT_TRUE(scheduler.ok());
  auto sized = [](int id, int64_t bytes) {
    auto task = Task(id);
    task->reserved_bytes = bytes;
    return task;
  };
  ASSERT_TRUE((*scheduler)->Enqueue(sized(1, 600), recorder.Callback()).ok());
  const absl::Status over = (*scheduler)->Enqueue(sized(2, 401), recorder.Callback());
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("hold 600 bytes and this one needs 401"));
  EXPECT_THAT(over.message(), HasSubstr("max_queue_bytes=1000"));
  ASSERT_TRUE((*scheduler)->Enqueue(sized(3, 400), recorder.Callback()).ok());
  EXPECT_EQ((*scheduler)->held_bytes(), 1000);
  const absl::Status full = (*scheduler)->Enqueue(sized(4, 0), recorder.Callback());
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("max_queue_size=2"));
  (*scheduler)->Shutdown();  // executes both and joins: every byte is returned
  EXPECT_EQ((*scheduler)->held_bytes(), 0);
  const BatcherStats stats = (*scheduler)->stats();
  EXPECT_EQ(stats.rejected_queue_bytes, 1);
  EXPECT_EQ(stats.rejected_queue_full, 1);
}

TEST(BatchSchedulerTest, AnExecutorErrorAnswersEveryTaskOfItsBatch) {
  FakeClock clock;
  Recorder recorder;
  auto scheduler =
      Scheduler::Create(Options(clock), recorder.Executor(absl::InternalError("boom")));
  ASSERT_TRUE(scheduler.ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(1), recorder.Callback()).ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(2), recorder.Callback()).ok());
  clock.Advance(absl::Milliseconds(10));
  recorder.Wait(2);
  EXPECT_EQ(recorder.StatusOf(1).message(), "boom");
  EXPECT_EQ(recorder.StatusOf(2).message(), "boom");
  EXPECT_EQ((*scheduler)->stats().failed_requests, 2);
  EXPECT_EQ((*scheduler)->stats().batches, 0);
}

TEST(BatchSchedulerTest, InstancesExecuteBatchesAtTheSameTime) {
  FakeClock clock;
  BatchingOptions options = Options(clock);
  options.max_batch_size = 1;
  options.instances = 2;
  absl::Mutex mu;
  int inside = 0;
  std::vector<int> instances_seen;
  // Each batch waits until the other one is running too: with one worker this would
  // never return (and the test would time out), with two both get through.
  auto executor = [&](int instance, absl::Span<FakeTask* const>) {
    absl::MutexLock lock(&mu);
    ++inside;
    instances_seen.push_back(instance);
    mu.Await(absl::Condition(
        +[](int* n) { return *n >= 2; }, &inside));
    return absl::OkStatus();
  };
  auto scheduler = Scheduler::Create(options, executor);
  ASSERT_TRUE(scheduler.ok());
  Recorder recorder;
  ASSERT_TRUE((*scheduler)->Enqueue(Task(1), recorder.Callback()).ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(2), recorder.Callback()).ok());
  recorder.Wait(2);
  absl::MutexLock lock(&mu);
  EXPECT_THAT(instances_seen, ::testing::UnorderedElementsAre(0, 1));
}

TEST(BatchSchedulerTest, ShutdownExecutesWhatIsQueuedThenRefuses) {
  FakeClock clock;
  Recorder recorder;
  BatchingOptions options = Options(clock);
  options.max_queue_delay = absl::Hours(1);
  auto scheduler = Scheduler::Create(options, recorder.Executor());
  ASSERT_TRUE(scheduler.ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(1), recorder.Callback()).ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(2), recorder.Callback()).ok());
  (*scheduler)->Shutdown();  // without waiting for the hour
  EXPECT_TRUE(recorder.StatusOf(1).ok());
  EXPECT_TRUE(recorder.StatusOf(2).ok());
  const absl::Status late = (*scheduler)->Enqueue(Task(3), recorder.Callback());
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable);
}

TEST(BatchSchedulerTest, AnAnswerThreadAnswersWhileTheWorkerExecutesTheNextBatch) {
  FakeClock clock;
  BatchingOptions options = Options(clock);
  options.max_batch_size = 1;
  options.answer_threads = 1;
  Recorder recorder;
  absl::Notification second_executed;
  auto record = recorder.Executor();
  auto scheduler =
      Scheduler::Create(options, [&](int instance, absl::Span<FakeTask* const> batch) {
        const absl::Status status = record(instance, batch);
        if (batch.front()->id == 2) second_executed.Notify();
        return status;
      });
  ASSERT_TRUE(scheduler.ok());
  // Task 1's answer returns only once task 2 was executed. The one worker can do that
  // only if it left task 1's answer to the answer thread (answering it itself, it
  // would wait here for the full minute and the expectation would fail).
  std::atomic<bool> second_ran_during_first_answer{false};
  auto answer_first = recorder.Callback();
  ASSERT_TRUE((*scheduler)
                  ->Enqueue(Task(1),
                            [&](absl::Status status, std::unique_ptr<FakeTask> task) {
                              second_ran_during_first_answer =
                                  second_executed.WaitForNotificationWithTimeout(
                                      absl::Seconds(60));
                              answer_first(std::move(status), std::move(task));
                            })
                  .ok());
  ASSERT_TRUE((*scheduler)->Enqueue(Task(2), recorder.Callback()).ok());
  recorder.Wait(2);
  EXPECT_TRUE(second_ran_during_first_answer.load());
  EXPECT_TRUE(recorder.StatusOf(1).ok());
  EXPECT_TRUE(recorder.StatusOf(2).ok());
}

TEST(BatchSchedulerTest, AnsweredBytesStayHeldUntilTheAnswerThreadAnswers) {
  FakeClock clock;
  BatchingOptions options = Options(clock);
  options.max_batch_size = 1;
  options.answer_threads = 1;
  options.max_queue_bytes = 100;
  Recorder recorder;
  auto scheduler = Scheduler::Create(options, recorder.Executor());
  ASSERT_TRUE(scheduler.ok());
  absl::Notification inside_answer, release_answer;
  auto task = Task(1);
  task->reserved_bytes = 60;
  auto callback = recorder.Callback();
  ASSERT_TRUE((*scheduler)
                  ->Enqueue(std::move(task),
                            [&](absl::Status status, std::unique_ptr<FakeTask> done) {
                              inside_answer.Notify();
                              release_answer.WaitForNotification();
                              callback(std::move(status), std::move(done));
                            })
                  .ok());
  inside_answer.WaitForNotification();
  // Executed, not yet answered: its 60 bytes still count, so 60 more do not fit.
  EXPECT_EQ((*scheduler)->held_bytes(), 60);
  auto second = Task(2);
  second->reserved_bytes = 60;
  EXPECT_EQ((*scheduler)->Enqueue(std::move(second), recorder.Callback()).code(),
            absl::StatusCode::kResourceExhausted);
  release_answer.Notify();
  recorder.Wait(1);
  (*scheduler)->Shutdown();
  EXPECT_EQ((*scheduler)->held_bytes(), 0);
}

TEST(BatchSchedulerTest, ShutdownAnswersEveryExecutedTaskThroughTheAnswerThreads) {
  FakeClock clock;
  Recorder recorder;
  BatchingOptions options = Options(clock);
  options.max_queue_delay = absl::Hours(1);
  options.max_batch_size = 2;
  options.answer_threads = 2;
  auto scheduler = Scheduler::Create(options, recorder.Executor());
  ASSERT_TRUE(scheduler.ok());
  for (int id = 1; id <= 5; ++id) {
    ASSERT_TRUE((*scheduler)->Enqueue(Task(id), recorder.Callback()).ok());
  }
  (*scheduler)->Shutdown();  // returns only after every callback ran
  for (int id = 1; id <= 5; ++id) EXPECT_TRUE(recorder.StatusOf(id).ok()) << id;
  EXPECT_EQ((*scheduler)->held_bytes(), 0);
}

TEST(BatchSchedulerTest, BadOptionsAreRefusedByName) {
  BatchingOptions options;
  options.instances = 0;
  Recorder recorder;
  auto scheduler = Scheduler::Create(options, recorder.Executor());
  EXPECT_EQ(scheduler.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(scheduler.status().message(), HasSubstr("instances must be in [1, 256]"));
  options.instances = 1;
  options.answer_threads = -1;
  scheduler = Scheduler::Create(options, recorder.Executor());
  EXPECT_EQ(scheduler.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(scheduler.status().message(),
              HasSubstr("answer_threads must be in [0, 256], got -1"));
}

// What a worker runs as: the policy of the worker and of a thread it starts (as oneDNN's
// intra-op threads are started at a worker's first batch), and the worker's name. The
// thread calling Create runs under SCHED_BATCH, as the server's main thread does.
struct WorkerThreads {
  int worker_policy = -1;
  int started_thread_policy = -1;
  std::string worker_name;
};

WorkerThreads RunOneBatch(bool compute_first) {
  FakeClock clock;
  BatchingOptions options = Options(clock);
  options.max_batch_size = 1;
  options.compute_first = compute_first;
  sched_param priority{};
  EXPECT_EQ(pthread_setschedparam(pthread_self(), SCHED_BATCH, &priority), 0);
  WorkerThreads seen;
  Recorder recorder;
  auto scheduler = Scheduler::Create(
      options, [&seen](int /*instance*/, absl::Span<FakeTask* const> /*batch*/) {
        seen.worker_policy = sched_getscheduler(0);
        std::thread([&seen] {
          seen.started_thread_policy = sched_getscheduler(0);
        }).join();
        char name[16] = {};
        pthread_getname_np(pthread_self(), name, sizeof(name));
        seen.worker_name = name;
        return absl::OkStatus();
      });
  EXPECT_EQ(pthread_setschedparam(pthread_self(), SCHED_OTHER, &priority), 0);
  EXPECT_TRUE(scheduler.ok()) << scheduler.status();
  if (!scheduler.ok()) return seen;
  EXPECT_TRUE((*scheduler)->Enqueue(Task(1), recorder.Callback()).ok());
  recorder.Wait(1);
  return seen;
}

TEST(BatchSchedulerTest, ComputeFirstWorkersAndTheirThreadsRunUnderSchedOther) {
  const WorkerThreads seen = RunOneBatch(/*compute_first=*/true);
  EXPECT_EQ(seen.worker_policy, SCHED_OTHER);
  EXPECT_EQ(seen.started_thread_policy, SCHED_OTHER);
  EXPECT_EQ(seen.worker_name, "attn-compute");
}

TEST(BatchSchedulerTest, WithoutComputeFirstWorkersKeepTheCreatorsPolicy) {
  const WorkerThreads seen = RunOneBatch(/*compute_first=*/false);
  EXPECT_EQ(seen.worker_policy, SCHED_BATCH);
  EXPECT_EQ(seen.started_thread_policy, SCHED_BATCH);
}

}  // namespace
}  // namespace attnserve::server
