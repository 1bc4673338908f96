// BatchScheduler<Task>: the batching policy, generic over the task it queues (the shape
// of TF Serving's BatchScheduler<Task>). It owns the queue, its count and byte budgets,
// the dispatch policy and the worker threads; an executor it is given runs each batch.
// It knows nothing of oneDNN or of attention: its tests use a task of their own.
#ifndef ATTNSERVE_SERVER_BATCHING_BATCH_SCHEDULER_H_
#define ATTNSERVE_SERVER_BATCHING_BATCH_SCHEDULER_H_

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/batching/clock.h"
#include "server/batching/thread_scheduling.h"

namespace attnserve::server {

// Counters of what the scheduler did; for tests, logs and metrics.
struct BatcherStats {
  int64_t enqueued = 0;
  int64_t rejected_queue_full = 0;   // max_queue_size reached
  int64_t rejected_queue_bytes = 0;  // max_queue_bytes would be exceeded
  int64_t dropped_deadline = 0;
  int64_t dropped_cancelled = 0;
  int64_t batches = 0;            // batches executed successfully
  int64_t computed_requests = 0;  // requests inside those batches
  int64_t max_batch_size_seen = 0;
  int64_t failed_requests = 0;  // requests whose batch the executor failed
};

// Observer hooks (for metrics). All optional. on_dequeue runs on worker threads without
// the scheduler's lock held; on_batch is the executor's to call.
struct BatcherObserver {
  // A batch finished computing.
  std::function<void(int batch_size, int64_t tokens, absl::Duration compute_time)>
      on_batch;
  // A request left the queue (into a batch, or dropped) after `queue_time`.
  std::function<void(absl::Duration queue_time)> on_dequeue;
  // The number of queued requests changed. Called with the scheduler's lock held, so
  // that reports arrive in the order the depth changed (a gauge set after the lock was
  // released could be left stale): it must only record, never call the scheduler.
  std::function<void(int64_t depth)> on_queue_depth;
  // Device memory (bytes) that instance `instance`'s backend holds: once when it is
  // created, then after each of its batches, on that instance's thread. 0 on the CPU.
  std::function<void(int instance, int64_t bytes)> on_device_memory;
};

// What the request path needs of a model's batcher, whatever task it batches: a wake-up
// for a cancelled call, answer bytes held against its budget, flush and shutdown, and
// its figures. Thread-safe.
class BatchQueue {
 public:
  virtual ~BatchQueue() = default;
  // See BatchScheduler's members of the same names.
  virtual void Wake() = 0;
  virtual void Hold(int64_t bytes) = 0;
  virtual void Release(int64_t bytes) = 0;
  virtual void Flush() = 0;
  virtual void Shutdown() = 0;
  virtual BatcherStats stats() const = 0;
  virtual int64_t queue_depth() const = 0;
  virtual int64_t held_bytes() const = 0;
};

struct BatchingOptions {
  // Most requests per batch. Range [1, 65536].
  int max_batch_size = 32;
  // Most tokens per batch. Range >= 1.
  int64_t max_batch_tokens = 8192;
  // How long the oldest request may wait for company: at most this long, and only while
  // the batch is smaller than the last one dispatched (callers answered together come
  // back together; a lone caller's next request goes at once). Range >= 0; 0
  // dispatches at once with whatever is queued (under load, requests queue up while a
  // batch runs, so batches still form).
  absl::Duration max_queue_delay = absl::ZeroDuration();
  // Queued requests beyond which Enqueue fails with RESOURCE_EXHAUSTED. Range >= 1.
  int max_queue_size = 1024;
  // Bytes that requests may hold together from Enqueue until their callbacks return
  // (Task::reserved_bytes); beyond it Enqueue fails with RESOURCE_EXHAUSTED. What an
  // executor allocates for a batch is not counted. Range >= 1.
  int64_t max_queue_bytes = int64_t{1} << 30;
  // Workers, each running one batch at a time. Range [1, 256].
  int instances = 1;
  // Threads that answer executed batches (the callbacks: building, serializing and
  // sending responses), so that a worker starts its next batch while the last one's
  // answers go out. 0 = each worker answers its own batch before taking the next.
  // Range [0, 256].
  int answer_threads = 0;
  // Whether the workers run compute first (thread_scheduling.h): Create sets each to
  // SCHED_OTHER before it takes a batch, for a server whose other threads run under
  // SCHED_BATCH, so that their wake-ups do not preempt a batch computing on the same
  // core. false: the workers keep the policy of the thread that called Create.
  bool compute_first = false;
  // Source of time; not owned; must outlive the scheduler. Null means RealClock.
  Clock* clock = nullptr;
  BatcherObserver observer;
};

// InvalidArgument naming the first option out of its range.
absl::Status CheckBatchingOptions(const BatchingOptions& options);

// A Task has:
//   int64_t tokens() const;                 // its size for max_batch_tokens
//   bool SharesBatchWith(const Task&) const;  // may run in one batch with another
//   int64_t reserved_bytes;                 // held from Enqueue until answered
//   absl::Time deadline;                    // dropped if still queued when it passes
//   std::shared_ptr<const std::atomic<bool>> cancelled;  // may be null
//   absl::Duration queue_time;              // set when it leaves the queue
//
// Policy: a batch holds tasks in arrival order that share a batch with the oldest task,
// at most max_batch_size of them and max_batch_tokens tokens (a larger single task runs
// alone). It is dispatched when full, or as large as the last batch dispatched (before
// the first, max_batch_size), or max_queue_delay after its oldest task came (for a task
// no batch has passed over yet, after the last batch of the worker taking it ended, if
// later), or at once while flushing or shutting down. A task whose deadline
// passed or whose call was cancelled is dropped before it is executed.
//
// Thread-safe. Owns its worker threads (started by Create, joined by Shutdown or the
// destructor).
template <typename Task>
class BatchScheduler {
 public:
  // Called exactly once per enqueued task, on a worker thread (an answer thread for
  // executed tasks when answer_threads > 0), with OK and the task's results, or with the
  // error (DEADLINE_EXCEEDED, CANCELLED, or the executor's). Must not block for long: it
  // delays the thread's next batch or answers.
  using Callback = std::function<void(absl::Status, std::unique_ptr<Task>)>;
  // Runs one batch on worker `instance` (in [0, instances)), filling in each task's
  // results; its status is every task's answer. Called on that worker's thread only.
  using Executor =
      std::function<absl::Status(int instance, absl::Span<Task* const> batch)>;

  // Starts the workers and answer threads. Returns InvalidArgument naming a bad
  // option, or with compute_first the FailedPrecondition of a worker whose policy the
  // kernel would not set (the threads already started are joined).
  static absl::StatusOr<std::unique_ptr<BatchScheduler>> Create(
      const BatchingOptions& options, Executor executor) {
    if (absl::Status status = CheckBatchingOptions(options); !status.ok()) return status;
    std::unique_ptr<BatchScheduler> scheduler(
        new BatchScheduler(options, std::move(executor)));
    // Named for `top -H` and perf. A worker's policy is set here, before any task can
    // reach it, so the intra-op threads it starts at its first batch inherit it.
    for (int i = 0; i < options.instances; ++i) {
      std::thread& worker = scheduler->workers_.emplace_back(&BatchScheduler::WorkerLoop,
                                                             scheduler.get(), i);
      pthread_setname_np(worker.native_handle(), "attn-compute");
      if (options.compute_first) {
        absl::Status status =
            SetSchedulingPolicy(worker.native_handle(), SchedulingPolicy::kOther);
        if (!status.ok()) return status;
      }
    }
    for (int i = 0; i < options.answer_threads; ++i) {
      std::thread& answerer = scheduler->answerers_.emplace_back(
          &BatchScheduler::AnswerLoop, scheduler.get());
      pthread_setname_np(answerer.native_handle(), "attn-answer");
    }
    return scheduler;
  }

  BatchScheduler(const BatchScheduler&) = delete;
  BatchScheduler& operator=(const BatchScheduler&) = delete;
  // Shuts down (see Shutdown) and joins the workers.
  ~BatchScheduler() { Shutdown(); }

  // Queues `task`; `done` is called later on a worker thread. Never blocks on a batch.
  // Returns RESOURCE_EXHAUSTED when max_queue_size tasks are queued or the task's
  // reserved_bytes would take the held bytes past max_queue_bytes, UNAVAILABLE after
  // Shutdown began; `done` is then not called and `task` is dropped.
  absl::Status Enqueue(std::unique_ptr<Task> task, Callback done) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        return absl::UnavailableError(
            "the server is shutting down; retry on another replica");
      }
      if (static_cast<int64_t>(queue_.size()) >= options_.max_queue_size) {
        ++stats_.rejected_queue_full;
        return absl::ResourceExhaustedError(absl::StrCat(
            "queue full: ", queue_.size(), " requests waiting (max_queue_size=",
            options_.max_queue_size, "); retry later"));
      }
      if (task->reserved_bytes > options_.max_queue_bytes - held_bytes_) {
        ++stats_.rejected_queue_bytes;
        return absl::ResourceExhaustedError(absl::StrCat(
            "queue full: queued and running requests hold ", held_bytes_,
            " bytes and this one needs ", task->reserved_bytes,
            " (max_queue_bytes=", options_.max_queue_bytes, "); retry later"));
      }
      held_bytes_ += task->reserved_bytes;
      queue_.push_back(Pending{std::move(task), std::move(done), clock_->Now()});
      ++stats_.enqueued;
      ++generation_;
      ReportDepth();
    }
    return absl::OkStatus();
  }

  // Makes the workers re-check the queue now: a task whose call was cancelled is
  // dropped (and its bytes returned) without waiting for the next batch. Does not block.
  void Wake() {
    absl::MutexLock lock(&mu_);
    ++generation_;
  }

  // From now on batches are dispatched without waiting for max_queue_delay, so queued
  // work finishes promptly while a server drains; Enqueue still accepts work. Does not
  // block. Idempotent.
  void Flush() {
    absl::MutexLock lock(&mu_);
    flushing_ = true;
    ++generation_;
  }

  // Stops accepting work, executes and answers everything already queued, then joins
  // the threads. Blocks until done. Idempotent.
  void Shutdown() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    absl::MutexLock lock(&join_mu_);
    if (joined_) return;
    for (std::thread& worker : workers_) worker.join();
    {
      // Every executed batch is in answers_ now; the answer threads empty it and end.
      absl::MutexLock lock(&answer_mu_);
      answers_closed_ = true;
    }
    for (std::thread& answerer : answerers_) answerer.join();
    joined_ = true;
  }

  // Counts `bytes` against max_queue_bytes until Release(bytes): for results a caller
  // still holds after its callback returned (a stream's answer waiting for a slow
  // reader), so that they keep new work out instead of growing memory past the budget.
  // Always succeeds: the bytes exist already.
  void Hold(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    held_bytes_ += bytes;
  }
  void Release(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    held_bytes_ -= bytes;
  }

  BatcherStats stats() const {
    absl::MutexLock lock(&mu_);
    return stats_;
  }
  int64_t queue_depth() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(queue_.size());
  }
  // Bytes held now by queued and running tasks.
  int64_t held_bytes() const {
    absl::MutexLock lock(&mu_);
    return held_bytes_;
  }

 private:
  // How far gRPC's deadline timer and the clock may disagree (see TakeBatch).
  static constexpr absl::Duration kDeadlineClockSlack = absl::Milliseconds(20);

  struct Pending {
    std::unique_ptr<Task> task;
    Callback done;
    absl::Time enqueue_time;
    // Left in the queue when a batch was taken (no room, or no sharing). A task never
    // passed over came after the last batch was taken.
    bool passed_over = false;
  };
  struct Batch {
    std::vector<Pending> tasks;
    std::vector<Pending> dropped;  // with their status in `drop_status`
    std::vector<absl::Status> drop_status;
  };
  // An executed batch waiting for an answer thread.
  struct Executed {
    std::vector<Pending> tasks;
    absl::Status status;
  };

  BatchScheduler(const BatchingOptions& options, Executor executor)
      : options_(options),
        clock_(options.clock != nullptr ? options.clock : RealClock::Get()),
        executor_(std::move(executor)) {}

  void ReportDepth() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (options_.observer.on_queue_depth) {
      options_.observer.on_queue_depth(static_cast<int64_t>(queue_.size()));
    }
  }

  // Calls `pending.done`, then returns the task's bytes to the budget.
  void Answer(Pending& pending, absl::Status status) {
    const int64_t bytes = pending.task->reserved_bytes;
    pending.done(std::move(status), std::move(pending.task));
    absl::MutexLock lock(&mu_);
    held_bytes_ -= bytes;
  }

  // Removes expired and cancelled tasks into `batch.dropped`, then takes a batch if one
  // is due at `now` for a worker whose last batch ended at `last_ended`. Returns the
  // time of the next check when none is due.
  std::optional<absl::Time> TakeBatch(absl::Time now, absl::Time last_ended, Batch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Drop what can no longer be answered usefully, before it costs compute.
    for (auto it = queue_.begin(); it != queue_.end();) {
      const Task& task = *it->task;
      absl::Status drop;
      // The deadline is checked first: gRPC cancels a call when its deadline passes, and
      // that is a deadline, not a caller's cancellation. gRPC's deadline timer runs on
      // its own clock and a cancellation wakes this worker at once, so a call cancelled
      // just before the deadline by this clock was cancelled by its deadline too.
      const bool cancelled =
          task.cancelled != nullptr && task.cancelled->load(std::memory_order_acquire);
      if (now >= task.deadline ||
          (cancelled && now >= task.deadline - kDeadlineClockSlack)) {
        drop = absl::DeadlineExceededError(absl::StrCat(
            "deadline passed after ", absl::FormatDuration(now - it->enqueue_time),
            " in the queue; the request was not computed"));
        ++stats_.dropped_deadline;
      } else if (cancelled) {
        drop = absl::CancelledError("the call was cancelled while queued");
        ++stats_.dropped_cancelled;
      }
      if (drop.ok()) {
        ++it;
        continue;
      }
      batch.dropped.push_back(std::move(*it));
      batch.drop_status.push_back(std::move(drop));
      it = queue_.erase(it);
    }
    if (queue_.empty()) return std::nullopt;

    const Pending& oldest = queue_.front();
    std::vector<size_t> chosen;
    int64_t tokens = 0;
    bool full = false;
    for (size_t i = 0; i < queue_.size(); ++i) {
      const Task& task = *queue_[i].task;
      // The oldest always goes, even a task that shares a batch with no other.
      if (i > 0 && !oldest.task->SharesBatchWith(task)) continue;
      if (!chosen.empty() && tokens + task.tokens() > options_.max_batch_tokens) {
        full = true;
        break;
      }
      chosen.push_back(i);
      tokens += task.tokens();
      if (static_cast<int>(chosen.size()) == options_.max_batch_size ||
          tokens >= options_.max_batch_tokens) {
        full = true;
        break;
      }
    }
    // A closed loop of n callers, answered together, sends its next n requests a few
    // hundred microseconds apart: without waiting for them, the first goes alone and
    // the others wait for it (measured: p99 twice p50 at 16 callers). Tasks that came
    // while the worker's last batch ran wait from its end too, for the callers it just
    // answered: else a loop once split stays split, in groups that each wait for the
    // other's batch. Tasks a batch passed over (no room, or no sharing) do not.
    absl::Time due_time = oldest.enqueue_time + options_.max_queue_delay;
    if (!oldest.passed_over) {
      due_time = std::max(due_time, last_ended + options_.max_queue_delay);
    }
    const bool as_large_as_last = static_cast<int64_t>(chosen.size()) >= last_batch_size_;
    if (!full && !as_large_as_last && !stopping_ && !flushing_ && now < due_time) {
      absl::Time next = due_time;
      for (const Pending& pending : queue_) next = std::min(next, pending.task->deadline);
      return next;
    }
    // Move the chosen tasks out, keeping the others in arrival order.
    std::deque<Pending> rest;
    size_t next_chosen = 0;
    for (size_t i = 0; i < queue_.size(); ++i) {
      if (next_chosen < chosen.size() && chosen[next_chosen] == i) {
        batch.tasks.push_back(std::move(queue_[i]));
        ++next_chosen;
      } else {
        rest.push_back(std::move(queue_[i]));
        rest.back().passed_over = true;
      }
    }
    queue_.swap(rest);
    last_batch_size_ = static_cast<int64_t>(batch.tasks.size());
    return std::nullopt;
  }

  // Whether no task is queued (the next batch may still be forming in gRPC's threads).
  bool QueueEmpty() {
    absl::MutexLock lock(&mu_);
    return queue_.empty();
  }

  void WorkerLoop(int instance) {
    std::vector<Task*> tasks;
    absl::Time last_ended = absl::InfinitePast();  // this worker's last batch
    while (true) {
      Batch batch;
      {
        absl::MutexLock lock(&mu_);
        while (true) {
          const std::optional<absl::Time> next =
              TakeBatch(clock_->Now(), last_ended, batch);
          if (!batch.tasks.empty() || !batch.dropped.empty()) break;
          if (stopping_ && queue_.empty()) return;
          const int64_t seen = generation_;
          const auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return generation_ != seen || stopping_;
          };
          clock_->AwaitWithDeadline(&mu_, absl::Condition(&changed),
                                    next.value_or(absl::InfiniteFuture()));
        }
        ReportDepth();
      }
      const absl::Time now = clock_->Now();
      const auto dequeue = [&](Pending& pending) {
        pending.task->queue_time = now - pending.enqueue_time;
        if (options_.observer.on_dequeue) {
          options_.observer.on_dequeue(pending.task->queue_time);
        }
      };
      for (size_t i = 0; i < batch.dropped.size(); ++i) {
        dequeue(batch.dropped[i]);
        Answer(batch.dropped[i], batch.drop_status[i]);
      }
      if (batch.tasks.empty()) continue;
      tasks.clear();
      for (Pending& pending : batch.tasks) {
        dequeue(pending);
        tasks.push_back(pending.task.get());
      }
      const absl::Status status = executor_(instance, tasks);
      // Before any answer goes out: the callers it answers come back after this.
      last_ended = clock_->Now();
      const int batch_size = static_cast<int>(tasks.size());
      {
        absl::MutexLock lock(&mu_);
        if (status.ok()) {
          ++stats_.batches;
          stats_.computed_requests += batch_size;
          stats_.max_batch_size_seen =
              std::max<int64_t>(stats_.max_batch_size_seen, batch_size);
        } else {
          stats_.failed_requests += batch_size;
        }
      }
      if (answerers_.empty()) {
        for (Pending& pending : batch.tasks) Answer(pending, status);
      } else {
        absl::MutexLock lock(&answer_mu_);
        answers_.push_back(Executed{std::move(batch.tasks), status});
      }
      // Under compute first the I/O threads that the answers woke wait for this thread
      // to block; with nothing queued it yields at once instead, so that the answers go
      // out as soon as they did under SCHED_OTHER (without it, concurrency 1 measured 2%
      // slower). With a batch waiting, compute goes on first.
      if (options_.compute_first && QueueEmpty()) sched_yield();
    }
  }

  // Takes executed batches in the order they were executed and answers their tasks,
  // until Shutdown closed the queue and it is empty.
  void AnswerLoop() {
    while (true) {
      Executed executed;
      {
        absl::MutexLock lock(&answer_mu_);
        const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(answer_mu_) {
          return !answers_.empty() || answers_closed_;
        };
        answer_mu_.Await(absl::Condition(&ready));
        if (answers_.empty()) return;
        executed = std::move(answers_.front());
        answers_.pop_front();
      }
      for (Pending& pending : executed.tasks) Answer(pending, executed.status);
    }
  }

  const BatchingOptions options_;
  Clock* const clock_;
  const Executor executor_;
  std::vector<std::thread> workers_;
  std::vector<std::thread> answerers_;

  mutable absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool flushing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Bumped on every Enqueue so that waiting workers re-evaluate the policy.
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Tasks in the last batch dispatched; a forming batch this large does not wait.
  int64_t last_batch_size_ ABSL_GUARDED_BY(mu_) = options_.max_batch_size;
  BatcherStats stats_ ABSL_GUARDED_BY(mu_);
  // Executed batches for the answer threads. Their tasks' bytes stay held until each
  // is answered, so this queue is inside max_queue_bytes.
  absl::Mutex answer_mu_;  // never held together with mu_
  std::deque<Executed> answers_ ABSL_GUARDED_BY(answer_mu_);
  bool answers_closed_ ABSL_GUARDED_BY(answer_mu_) = false;
  absl::Mutex join_mu_;
  bool joined_ ABSL_GUARDED_BY(join_mu_) = false;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_BATCHING_BATCH_SCHEDULER_H_
