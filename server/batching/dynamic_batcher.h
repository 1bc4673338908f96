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
class DynamicBatcher final : public ScheduledBatcher<AttentionWork> {
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

 private:
  explicit DynamicBatcher(const Options& options) : options_(options) {}
  // The executor: packs `batch` and runs it on `attention`.
  absl::Status RunBatch(core::AttentionBackend* attention,
                        absl::Span<AttentionWork* const> batch);

  const Options options_;
  // The destructor joins the workers (Shutdown) before these go.
  std::vector<std::unique_ptr<core::AttentionBackend>> attention_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_BATCHING_DYNAMIC_BATCHER_H_
