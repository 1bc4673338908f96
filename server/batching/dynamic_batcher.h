// DynamicBatcher: groups concurrent attention requests for one model into packed
// batches and runs them on a pool of compute workers.
#ifndef ATTNSERVE_SERVER_BATCHING_DYNAMIC_BATCHER_H_
#define ATTNSERVE_SERVER_BATCHING_DYNAMIC_BATCHER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/attention_backend.h"
#include "server/batching/attention_work.h"
#include "server/batching/batch_scheduler.h"

namespace attnserve::server {

// Called exactly once per enqueued request, on a batcher worker thread, with OK and the
// results, or with the error (DEADLINE_EXCEEDED, CANCELLED, UNAVAILABLE on shutdown,
// INTERNAL from the core). Must not block for long: it delays the next batch.
using WorkCallback = BatchScheduler<AttentionWork>::Callback;

// Batches attention requests for one model: a BatchScheduler<AttentionWork> (queue,
// budgets, policy, workers) whose executor packs each batch and runs it on that worker's
// own AttentionBackend. Thread-safe.
class DynamicBatcher final : public BatchQueue {
 public:
  using Options = BatchingOptions;

  // Creates one attention object per instance with `make_attention` and starts the
  // workers. InvalidArgument naming a bad option; the factory's error otherwise.
  static absl::StatusOr<std::unique_ptr<DynamicBatcher>> Create(
      const Options& options,
      const std::function<absl::StatusOr<std::unique_ptr<core::AttentionBackend>>()>&
          make_attention);

  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;
  // Shuts down (see Shutdown) and joins the workers.
  ~DynamicBatcher() override;

  // See BatchScheduler: Enqueue never blocks on compute and fails with
  // RESOURCE_EXHAUSTED (count or bytes) or UNAVAILABLE (shutting down), `done` then not
  // being called; Wake re-checks cancellations now; Hold/Release count results held
  // after their callback against max_queue_bytes; Flush stops waiting for
  // max_queue_delay; Shutdown computes what is queued and joins the workers.
  absl::Status Enqueue(std::unique_ptr<AttentionWork> work, WorkCallback done) {
    return scheduler_->Enqueue(std::move(work), std::move(done));
  }
  void Wake() override { scheduler_->Wake(); }
  void Hold(int64_t bytes) override { scheduler_->Hold(bytes); }
  void Release(int64_t bytes) override { scheduler_->Release(bytes); }
  void Flush() override { scheduler_->Flush(); }
  void Shutdown() override;

  BatcherStats stats() const override { return scheduler_->stats(); }
  int64_t queue_depth() const override { return scheduler_->queue_depth(); }
  // Bytes held now by queued and computing requests.
  int64_t held_bytes() const override { return scheduler_->held_bytes(); }

 private:
  explicit DynamicBatcher(const Options& options) : options_(options) {}
  // The executor: packs `batch` and runs it on `attention`.
  absl::Status RunBatch(core::AttentionBackend* attention,
                        absl::Span<AttentionWork* const> batch);

  const Options options_;
  // Declared before scheduler_, so the workers are joined before these are destroyed.
  std::vector<std::unique_ptr<core::AttentionBackend>> attention_;
  std::unique_ptr<BatchScheduler<AttentionWork>> scheduler_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_BATCHING_DYNAMIC_BATCHER_H_
