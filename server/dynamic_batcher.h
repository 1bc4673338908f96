// DynamicBatcher: groups concurrent attention requests for one model into packed
// batches and runs them on a pool of compute workers.
#ifndef ATTNSERVE_SERVER_DYNAMIC_BATCHER_H_
#define ATTNSERVE_SERVER_DYNAMIC_BATCHER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/multi_head_attention.h"
#include "server/clock.h"

namespace attnserve::server {

// A request tensor's values as they arrived: little-endian float32 or bfloat16 bytes,
// already validated (shape and finiteness). They are read once, by the batcher: the core
// uses float32 bytes in place when a request runs alone; otherwise they are copied (or
// widened, for bf16) straight into the batch's packed buffer.
class InputTensor {
 public:
  InputTensor() = default;
  // Views `bytes`, which must outlive this tensor (the server views the request message,
  // which lives until the call's answer is sent).
  InputTensor(absl::string_view bytes, bool bf16) : bytes_(bytes), bf16_(bf16) {}
  // Owns a copy of `values` (tests, tools).
  static InputTensor FromFloats(absl::Span<const float> values);
  InputTensor(const InputTensor&) = delete;
  InputTensor& operator=(const InputTensor&) = delete;
  InputTensor(InputTensor&& other) noexcept { *this = std::move(other); }
  InputTensor& operator=(InputTensor&& other) noexcept;

  int64_t elements() const {
    return static_cast<int64_t>(bytes_.size()) / (bf16_ ? 2 : 4);
  }
  bool empty() const { return bytes_.empty(); }
  // Writes elements() float32 values to `out`: one copy, or one widening for bf16.
  void CopyTo(float* out) const;
  // The values as float32 without a copy: float32 bytes aligned to 4; else empty.
  absl::Span<const float> InPlace() const;

 private:
  absl::string_view bytes_;
  bool bf16_ = false;
  std::string owned_;  // FromFloats only; bytes_ views it
};

// One request's work: validated inputs in, results out. Owned by the batcher from
// Enqueue until its callback, which receives it back.
struct AttentionWork {
  // Inputs, already validated against the model.
  InputTensor query;                    // [sum(query_lengths), d_model]
  std::vector<int64_t> query_lengths;   // n sequences
  InputTensor memory;                   // cross-attention: [sum(memory_lengths), d]
  std::vector<int64_t> memory_lengths;  // empty for self-attention
  bool causal = false;
  std::vector<float> head_mask;  // empty or num_heads factors
  bool return_attention = false;
  // The caller's deadline; the request is dropped (DEADLINE_EXCEEDED) if still queued
  // when it passes.
  absl::Time deadline = absl::InfiniteFuture();
  // Set by the caller when its call was cancelled; the request is then dropped
  // (CANCELLED) if still queued. May be null.
  std::shared_ptr<const std::atomic<bool>> cancelled;
  // Bytes this request holds from Enqueue until its callback returns (inputs and
  // results), counted against Options::max_queue_bytes. Set at validation.
  int64_t reserved_bytes = 0;

  // Results, filled in before the callback: float32 bytes, so that a float32 answer
  // moves into the response message without another copy.
  std::string output;     // [sum(query_lengths), d_model]
  std::string attention;  // per sequence [h, L_q, L_k], when asked
  absl::Duration queue_time;
  absl::Duration compute_time;
  int batch_size = 0;

  int64_t tokens() const;
  int64_t output_elements() const { return static_cast<int64_t>(output.size()) / 4; }
  // The results as float32 values (views of `output` / `attention`).
  absl::Span<float> output_values();
  absl::Span<float> attention_values();
};

// Called exactly once per enqueued request, on a batcher worker thread, with OK and the
// results, or with the error (DEADLINE_EXCEEDED, CANCELLED, UNAVAILABLE on shutdown,
// INTERNAL from the core). Must not block for long: it delays the next batch.
using WorkCallback = std::function<void(absl::Status, std::unique_ptr<AttentionWork>)>;

// Counters of what the batcher did; for tests, logs and metrics.
struct BatcherStats {
  int64_t enqueued = 0;
  int64_t rejected_queue_full = 0;   // max_queue_size reached
  int64_t rejected_queue_bytes = 0;  // max_queue_bytes would be exceeded
  int64_t dropped_deadline = 0;
  int64_t dropped_cancelled = 0;
  int64_t batches = 0;            // batches computed
  int64_t computed_requests = 0;  // requests inside computed batches
  int64_t max_batch_size_seen = 0;
  int64_t failed_requests = 0;  // requests whose batch failed in the core
};

// Observer hooks (for metrics). All optional; called on worker threads without the
// batcher's lock held.
struct BatcherObserver {
  // A batch finished computing.
  std::function<void(int batch_size, int64_t tokens, absl::Duration compute_time)>
      on_batch;
  // A request left the queue (into a batch, or dropped) after `queue_time`.
  std::function<void(absl::Duration queue_time)> on_dequeue;
  // The number of queued requests changed.
  std::function<void(int64_t depth)> on_queue_depth;
};

// Thread-safe. Owns its worker threads (started by Create, joined by Shutdown or the
// destructor) and one MultiHeadAttention per worker.
//
// Policy: a batch holds requests in arrival order that share the oldest request's
// settings (self/cross, causal, head mask, return_attention), at most max_batch_size of
// them and max_batch_tokens query tokens (a longer single request runs alone). It is
// dispatched when full, or when its oldest request has waited max_queue_delay, or at
// once while shutting down.
class DynamicBatcher {
 public:
  struct Options {
    // Most requests per batch. Range [1, 65536].
    int max_batch_size = 32;
    // Most query tokens per batch. Range >= 1.
    int64_t max_batch_tokens = 8192;
    // How long the oldest request may wait for company. Range >= 0; 0 dispatches at
    // once with whatever is queued (under load, requests queue up while a batch
    // computes, so batches still form).
    absl::Duration max_queue_delay = absl::ZeroDuration();
    // Queued requests beyond which Enqueue fails with RESOURCE_EXHAUSTED. Range >= 1.
    int max_queue_size = 1024;
    // Bytes that requests may hold together from Enqueue until their callbacks return
    // (AttentionWork::reserved_bytes); beyond it Enqueue fails with RESOURCE_EXHAUSTED.
    // A batch's packed copies are not counted. Range >= 1.
    int64_t max_queue_bytes = int64_t{1} << 30;
    // Compute workers, each with its own MultiHeadAttention. Range [1, 256].
    int instances = 1;
    // Source of time; not owned; must outlive the batcher. Null means RealClock.
    Clock* clock = nullptr;
    BatcherObserver observer;
  };

  // Creates one attention object per instance with `make_attention` and starts the
  // workers. InvalidArgument naming a bad option; the factory's error otherwise.
  static absl::StatusOr<std::unique_ptr<DynamicBatcher>> Create(
      const Options& options,
      const std::function<absl::StatusOr<std::unique_ptr<core::MultiHeadAttention>>()>&
          make_attention);

  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;
  // Shuts down (see Shutdown) and joins the workers.
  ~DynamicBatcher();

  // Queues `work`; `done` is called later on a worker thread. Never blocks on compute.
  // Returns RESOURCE_EXHAUSTED when max_queue_size requests are queued or the work's
  // reserved_bytes would take the held bytes past max_queue_bytes, UNAVAILABLE after
  // Shutdown began; `done` is then not called and `work` is dropped.
  absl::Status Enqueue(std::unique_ptr<AttentionWork> work, WorkCallback done);

  // Makes the workers re-check the queue now: a request whose call was cancelled is
  // dropped (and its bytes returned) without waiting for the next batch. Does not block.
  void Wake();

  // From now on batches are dispatched without waiting for max_queue_delay, so queued
  // work finishes promptly while a server drains; Enqueue still accepts work. Does not
  // block. Idempotent.
  void Flush();

  // Stops accepting work, computes everything already queued, then joins the workers.
  // Blocks until done. Idempotent.
  void Shutdown();

  BatcherStats stats() const;
  int64_t queue_depth() const;
  // Bytes held now by queued and computing requests.
  int64_t held_bytes() const;

 private:
  struct Pending {
    std::unique_ptr<AttentionWork> work;
    WorkCallback done;
    absl::Time enqueue_time;
  };
  struct Batch {
    std::vector<Pending> requests;
    std::vector<Pending> dropped;  // with their status in `drop_status`
    std::vector<absl::Status> drop_status;
  };

  DynamicBatcher(const Options& options, Clock* clock);
  void WorkerLoop(core::MultiHeadAttention* attention);
  // Removes expired and cancelled requests into `batch.dropped`, then takes a batch if
  // one is due at `now`. Returns the time of the next check when none is due.
  std::optional<absl::Time> TakeBatch(absl::Time now, Batch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunBatch(core::MultiHeadAttention* attention, Batch& batch);
  // Calls `pending.done`, then returns the request's bytes to the budget.
  void Answer(Pending& pending, absl::Status status);

  const Options options_;
  Clock* const clock_;
  std::vector<std::unique_ptr<core::MultiHeadAttention>> attention_;
  std::vector<std::thread> workers_;

  mutable absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool flushing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Bumped on every Enqueue so that waiting workers re-evaluate the policy.
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  BatcherStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Mutex join_mu_;
  bool joined_ ABSL_GUARDED_BY(join_mu_) = false;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_DYNAMIC_BATCHER_H_
