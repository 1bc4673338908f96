// Batcher<Work>: one model's batcher, whatever its kind: a BatchScheduler<Work> (queue,
// budgets, policy, workers) and one BatchExecutor<Work> per worker, which packs each
// batch, runs it on that worker's own engine and scatters the results. A model kind (the
// attention layer, an encoder, a task head or family on top of it) is one executor.
#ifndef ATTNSERVE_SERVER_BATCHING_BATCHER_H_
#define ATTNSERVE_SERVER_BATCHING_BATCHER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/batching/batch_scheduler.h"

namespace attnserve::server {

// Runs batches of one model kind on one engine (an attention backend, an encoder) that
// it owns. Each batch goes Pack → Run → Scatter, always on the same worker thread and
// one batch at a time, so an executor needs no lock; the packed batch lives in the
// executor between the three calls.
template <typename Work>
class BatchExecutor {
 public:
  virtual ~BatchExecutor() = default;
  // Lays `batch` out for the engine and sizes each work's results: a lone request is
  // viewed where it can be, several are copied once into one packed batch. An error
  // fails every request in the batch.
  virtual absl::Status Pack(absl::Span<Work* const> batch) = 0;
  // Runs the packed batch on the engine; the only step timed as compute.
  virtual absl::Status Run() = 0;
  // Writes each work's results from the packed batch when `computed` (Run succeeded),
  // then frees the packed batch either way.
  virtual void Scatter(absl::Span<Work* const> batch, bool computed) = 0;
  // Device memory the engine holds now, in bytes; 0 on the CPU.
  virtual int64_t device_memory_bytes() const { return 0; }
};

// A model's batcher. Work is a BatchScheduler task (see there) that also has
//   int batch_size;                // set to the size of the batch it ran in
//   int64_t batch_id;              // set to that batch's number (unique in the process)
//   absl::Duration compute_time;   // set to that batch's Run time
// Thread-safe. Owns its executors and its worker threads.
template <typename Work>
class Batcher final : public BatchQueue {
 public:
  using Callback = typename BatchScheduler<Work>::Callback;
  using MakeExecutor =
      std::function<absl::StatusOr<std::unique_ptr<BatchExecutor<Work>>>()>;

  // One executor per instance from `make_executor`, then the workers start.
  // InvalidArgument naming a bad option; the factory's error otherwise.
  static absl::StatusOr<std::unique_ptr<Batcher>> Create(
      const BatchingOptions& options, const MakeExecutor& make_executor) {
    if (absl::Status status = CheckBatchingOptions(options); !status.ok()) return status;
    std::unique_ptr<Batcher> batcher(new Batcher(options));
    for (int i = 0; i < options.instances; ++i) {
      absl::StatusOr<std::unique_ptr<BatchExecutor<Work>>> executor = make_executor();
      if (!executor.ok()) return executor.status();
      batcher->executors_.push_back(std::move(executor).value());
      batcher->ReportDeviceMemory(i);
    }
    Batcher* self = batcher.get();
    absl::StatusOr<std::unique_ptr<BatchScheduler<Work>>> scheduler =
        BatchScheduler<Work>::Create(options,
                                     [self](int instance, absl::Span<Work* const> batch) {
                                       return self->RunBatch(instance, batch);
                                     });
    if (!scheduler.ok()) return scheduler.status();
    batcher->scheduler_ = std::move(scheduler).value();
    return batcher;
  }

  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;
  // Shuts down (see Shutdown): the workers are joined before the executors go.
  ~Batcher() override { Shutdown(); }

  // See BatchScheduler: Enqueue never blocks on compute and fails with
  // RESOURCE_EXHAUSTED (count or bytes) or UNAVAILABLE (shutting down), `done` then not
  // being called; Wake re-checks cancellations now; Hold/Release count results held
  // after their callback against max_queue_bytes; Flush stops waiting for
  // max_queue_delay; Shutdown computes what is queued and joins the workers.
  absl::Status Enqueue(std::unique_ptr<Work> work, Callback done) {
    return scheduler_->Enqueue(std::move(work), std::move(done));
  }
  void Wake() override { scheduler_->Wake(); }
  void Hold(int64_t bytes) override { scheduler_->Hold(bytes); }
  void Release(int64_t bytes) override { scheduler_->Release(bytes); }
  void Flush() override { scheduler_->Flush(); }
  void Shutdown() override {
    if (scheduler_ != nullptr) scheduler_->Shutdown();
  }
  BatcherStats stats() const override { return scheduler_->stats(); }
  int64_t queue_depth() const override { return scheduler_->queue_depth(); }
  // Bytes held now by queued and computing requests.
  int64_t held_bytes() const override { return scheduler_->held_bytes(); }

 private:
  explicit Batcher(const BatchingOptions& options) : options_(options) {}

  // The scheduler's executor, on worker `instance`'s thread: pack, run (timed), scatter.
  absl::Status RunBatch(int instance, absl::Span<Work* const> batch) {
    BatchExecutor<Work>& executor = *executors_[instance];
    // Numbers batches across every model, so that a trace's batch mates share one.
    static std::atomic<int64_t> batches{0};
    const int64_t batch_id = batches.fetch_add(1, std::memory_order_relaxed) + 1;
    int64_t tokens = 0;
    for (Work* work : batch) {
      work->batch_size = static_cast<int>(batch.size());
      work->batch_id = batch_id;
      tokens += work->tokens();
    }
    absl::Status status = executor.Pack(batch);
    absl::Duration compute_time;
    if (status.ok()) {
      const absl::Time start = absl::Now();
      status = executor.Run();
      compute_time = absl::Now() - start;
    }
    if (status.ok() && options_.observer.on_batch) {
      options_.observer.on_batch(static_cast<int>(batch.size()), tokens, compute_time);
    }
    for (Work* work : batch) work->compute_time = compute_time;
    executor.Scatter(batch, status.ok());
    ReportDeviceMemory(instance);
    return status;
  }

  void ReportDeviceMemory(int instance) {
    if (options_.observer.on_device_memory) {
      options_.observer.on_device_memory(instance,
                                         executors_[instance]->device_memory_bytes());
    }
  }

  const BatchingOptions options_;
  std::vector<std::unique_ptr<BatchExecutor<Work>>> executors_;
  // Declared last, so that even without Shutdown its workers are joined first.
  std::unique_ptr<BatchScheduler<Work>> scheduler_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_BATCHING_BATCHER_H_
