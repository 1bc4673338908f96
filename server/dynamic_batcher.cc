#include "server/dynamic_batcher.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/bfloat16.h"

namespace attnserve::server {

namespace {

// How far gRPC's deadline timer and absl::Now() may disagree (see TakeBatch).
constexpr absl::Duration kDeadlineClockSlack = absl::Milliseconds(20);

absl::Status CheckRange(absl::string_view name, int64_t value, int64_t low,
                        int64_t high) {
  if (value < low || value > high) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be in [", low, ", ", high, "], got ", value));
  }
  return absl::OkStatus();
}

// Requests share a batch only when the core can run them in one call.
bool SameSettings(const AttentionWork& a, const AttentionWork& b) {
  return a.memory_lengths.empty() == b.memory_lengths.empty() && a.causal == b.causal &&
         a.head_mask == b.head_mask && a.return_attention == b.return_attention;
}

}  // namespace

InputTensor InputTensor::FromFloats(absl::Span<const float> values) {
  InputTensor tensor;
  tensor.owned_.assign(reinterpret_cast<const char*>(values.data()),
                       values.size() * sizeof(float));
  tensor.bytes_ = tensor.owned_;
  return tensor;
}

InputTensor& InputTensor::operator=(InputTensor&& other) noexcept {
  if (this == &other) return *this;
  bf16_ = other.bf16_;
  const bool owning = !other.owned_.empty() && other.bytes_.data() == other.owned_.data();
  owned_ = std::move(other.owned_);
  // A moved string may have new storage (short strings live inside the object).
  bytes_ = owning ? absl::string_view(owned_) : other.bytes_;
  other.bytes_ = {};
  return *this;
}

void InputTensor::CopyTo(float* out) const {
  const int64_t count = elements();
  if (!bf16_) {
    std::memcpy(out, bytes_.data(), static_cast<size_t>(count) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, bytes_.data() + 2 * i, 2);
    out[i] = core::Bf16ToFloat(bits);
  }
}

absl::Span<const float> InputTensor::InPlace() const {
  if (bf16_ || reinterpret_cast<uintptr_t>(bytes_.data()) % alignof(float) != 0)
    return {};
  return absl::MakeConstSpan(reinterpret_cast<const float*>(bytes_.data()),
                             static_cast<size_t>(elements()));
}

absl::Span<float> AttentionWork::output_values() {
  return absl::MakeSpan(reinterpret_cast<float*>(output.data()), output.size() / 4);
}

absl::Span<float> AttentionWork::attention_values() {
  return absl::MakeSpan(reinterpret_cast<float*>(attention.data()), attention.size() / 4);
}

int64_t AttentionWork::tokens() const {
  int64_t total = 0;
  for (int64_t length : query_lengths) total += length;
  return total;
}

absl::StatusOr<std::unique_ptr<DynamicBatcher>> DynamicBatcher::Create(
    const Options& options,
    const std::function<absl::StatusOr<std::unique_ptr<core::MultiHeadAttention>>()>&
        make_attention) {
  for (const absl::Status& status : {
           CheckRange("max_batch_size", options.max_batch_size, 1, 65536),
           CheckRange("max_batch_tokens", options.max_batch_tokens, 1, int64_t{1} << 40),
           CheckRange("max_queue_size", options.max_queue_size, 1, 1 << 30),
           CheckRange("max_queue_bytes", options.max_queue_bytes, 1, int64_t{1} << 50),
           CheckRange("instances", options.instances, 1, 256),
       }) {
    if (!status.ok()) return status;
  }
  if (options.max_queue_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_queue_delay must be >= 0, got ",
                     absl::FormatDuration(options.max_queue_delay)));
  }
  Clock* clock = options.clock != nullptr ? options.clock : RealClock::Get();
  std::unique_ptr<DynamicBatcher> batcher(new DynamicBatcher(options, clock));
  for (int i = 0; i < options.instances; ++i) {
    absl::StatusOr<std::unique_ptr<core::MultiHeadAttention>> attention =
        make_attention();
    if (!attention.ok()) return attention.status();
    batcher->attention_.push_back(std::move(attention).value());
  }
  for (auto& attention : batcher->attention_) {
    batcher->workers_.emplace_back(&DynamicBatcher::WorkerLoop, batcher.get(),
                                   attention.get());
  }
  return batcher;
}

DynamicBatcher::DynamicBatcher(const Options& options, Clock* clock)
    : options_(options), clock_(clock) {}

DynamicBatcher::~DynamicBatcher() { Shutdown(); }

absl::Status DynamicBatcher::Enqueue(std::unique_ptr<AttentionWork> work,
                                     WorkCallback done) {
  int64_t depth = 0;
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
    if (work->reserved_bytes > options_.max_queue_bytes - held_bytes_) {
      ++stats_.rejected_queue_bytes;
      return absl::ResourceExhaustedError(
          absl::StrCat("queue full: queued and running requests hold ", held_bytes_,
                       " bytes and this one needs ", work->reserved_bytes,
                       " (max_queue_bytes=", options_.max_queue_bytes, "); retry later"));
    }
    held_bytes_ += work->reserved_bytes;
    queue_.push_back(Pending{std::move(work), std::move(done), clock_->Now()});
    ++stats_.enqueued;
    ++generation_;
    depth = static_cast<int64_t>(queue_.size());
  }
  if (options_.observer.on_queue_depth) options_.observer.on_queue_depth(depth);
  return absl::OkStatus();
}

void DynamicBatcher::Wake() {
  absl::MutexLock lock(&mu_);
  ++generation_;
}

void DynamicBatcher::Flush() {
  absl::MutexLock lock(&mu_);
  flushing_ = true;
  ++generation_;
}

void DynamicBatcher::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  absl::MutexLock lock(&join_mu_);
  if (joined_) return;
  for (std::thread& worker : workers_) worker.join();
  joined_ = true;
}

BatcherStats DynamicBatcher::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

int64_t DynamicBatcher::queue_depth() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

int64_t DynamicBatcher::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return held_bytes_;
}

void DynamicBatcher::Answer(Pending& pending, absl::Status status) {
  const int64_t bytes = pending.work->reserved_bytes;
  pending.done(std::move(status), std::move(pending.work));
  absl::MutexLock lock(&mu_);
  held_bytes_ -= bytes;
}

std::optional<absl::Time> DynamicBatcher::TakeBatch(absl::Time now, Batch& batch) {
  // Drop what can no longer be answered usefully, before it costs compute.
  for (auto it = queue_.begin(); it != queue_.end();) {
    const AttentionWork& work = *it->work;
    absl::Status drop;
    // The deadline is checked first: gRPC cancels a call when its deadline passes, and
    // that is a deadline, not a caller's cancellation. gRPC's deadline timer runs on its
    // own clock and a cancellation wakes this worker at once, so a call cancelled just
    // before the deadline by this clock was cancelled by its deadline too.
    const bool cancelled =
        work.cancelled != nullptr && work.cancelled->load(std::memory_order_acquire);
    if (now >= work.deadline ||
        (cancelled && now >= work.deadline - kDeadlineClockSlack)) {
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
    const AttentionWork& work = *queue_[i].work;
    if (!SameSettings(*oldest.work, work)) continue;
    if (!chosen.empty() && tokens + work.tokens() > options_.max_batch_tokens) {
      full = true;
      break;
    }
    chosen.push_back(i);
    tokens += work.tokens();
    if (static_cast<int>(chosen.size()) == options_.max_batch_size ||
        tokens >= options_.max_batch_tokens) {
      full = true;
      break;
    }
  }
  const absl::Time due_time = oldest.enqueue_time + options_.max_queue_delay;
  if (!full && !stopping_ && !flushing_ && now < due_time) {
    absl::Time next = due_time;
    for (const Pending& pending : queue_) next = std::min(next, pending.work->deadline);
    return next;
  }
  // Move the chosen requests out, keeping the others in arrival order.
  std::deque<Pending> rest;
  size_t next_chosen = 0;
  for (size_t i = 0; i < queue_.size(); ++i) {
    if (next_chosen < chosen.size() && chosen[next_chosen] == i) {
      batch.requests.push_back(std::move(queue_[i]));
      ++next_chosen;
    } else {
      rest.push_back(std::move(queue_[i]));
    }
  }
  queue_.swap(rest);
  return std::nullopt;
}

void DynamicBatcher::WorkerLoop(core::MultiHeadAttention* attention) {
  while (true) {
    Batch batch;
    int64_t depth = 0;
    {
      absl::MutexLock lock(&mu_);
      while (true) {
        const std::optional<absl::Time> next = TakeBatch(clock_->Now(), batch);
        if (!batch.requests.empty() || !batch.dropped.empty()) break;
        if (stopping_ && queue_.empty()) return;
        const int64_t seen = generation_;
        const auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return generation_ != seen || stopping_;
        };
        clock_->AwaitWithDeadline(&mu_, absl::Condition(&changed),
                                  next.value_or(absl::InfiniteFuture()));
      }
      depth = static_cast<int64_t>(queue_.size());
    }
    if (options_.observer.on_queue_depth) options_.observer.on_queue_depth(depth);
    const absl::Time now = clock_->Now();
    for (size_t i = 0; i < batch.dropped.size(); ++i) {
      Pending& pending = batch.dropped[i];
      pending.work->queue_time = now - pending.enqueue_time;
      if (options_.observer.on_dequeue) {
        options_.observer.on_dequeue(pending.work->queue_time);
      }
      Answer(pending, batch.drop_status[i]);
    }
    if (!batch.requests.empty()) RunBatch(attention, batch);
  }
}

void DynamicBatcher::RunBatch(core::MultiHeadAttention* attention, Batch& batch) {
  const absl::Time start = clock_->Now();
  const int batch_size = static_cast<int>(batch.requests.size());
  const AttentionWork& first = *batch.requests.front().work;
  const int64_t heads = attention->spec().num_heads;
  const int64_t d_model = attention->spec().d_model;

  // Each input is read once: a lone float32 request is computed straight from its
  // message's bytes and into its own result buffers; otherwise the inputs are copied
  // (or widened from bf16) into one packed buffer, never zero-filled first, and the
  // packed results are copied once into each request's result buffers.
  std::vector<int64_t> query_lengths, memory_lengths;
  int64_t tokens = 0, memory_tokens = 0, weights_size = 0;
  for (Pending& pending : batch.requests) {
    AttentionWork& work = *pending.work;
    work.queue_time = start - pending.enqueue_time;
    work.batch_size = batch_size;
    tokens += work.tokens();
    memory_tokens += work.memory.elements() / d_model;
    work.output.resize(static_cast<size_t>(work.query.elements()) * sizeof(float));
    if (work.return_attention) {
      const int64_t size = core::MultiHeadAttention::AttentionWeightsSize(
          heads, work.query_lengths, work.memory_lengths);
      work.attention.resize(static_cast<size_t>(size) * sizeof(float));
      weights_size += size;
    }
    if (options_.observer.on_dequeue) options_.observer.on_dequeue(work.queue_time);
    query_lengths.insert(query_lengths.end(), work.query_lengths.begin(),
                         work.query_lengths.end());
    memory_lengths.insert(memory_lengths.end(), work.memory_lengths.begin(),
                          work.memory_lengths.end());
  }

  core::AttentionBatch packed{{}, query_lengths, {}, memory_lengths};
  core::AttentionOptions attention_options;
  attention_options.causal = first.causal;
  attention_options.head_mask = first.head_mask;
  absl::Span<float> output_span, weights_span;
  std::unique_ptr<float[]> query, memory, output, weights;  // packed; not zero-filled
  const auto pack = [](const InputTensor& input, std::unique_ptr<float[]>& buffer) {
    buffer.reset(new float[static_cast<size_t>(input.elements())]);
    input.CopyTo(buffer.get());
    return absl::MakeConstSpan(buffer.get(), static_cast<size_t>(input.elements()));
  };
  if (batch_size == 1) {
    AttentionWork& work = *batch.requests.front().work;
    packed.query = work.query.InPlace();
    if (packed.query.empty()) packed.query = pack(work.query, query);
    packed.memory = work.memory.InPlace();
    if (packed.memory.empty() && !work.memory.empty()) {
      packed.memory = pack(work.memory, memory);
    }
    output_span = work.output_values();
    weights_span = work.attention_values();
  } else {
    query.reset(new float[static_cast<size_t>(tokens * d_model)]);
    if (memory_tokens > 0) {
      memory.reset(new float[static_cast<size_t>(memory_tokens * d_model)]);
    }
    int64_t query_offset = 0, memory_offset = 0;
    for (Pending& pending : batch.requests) {
      const AttentionWork& work = *pending.work;
      work.query.CopyTo(query.get() + query_offset);
      query_offset += work.query.elements();
      if (!work.memory.empty()) work.memory.CopyTo(memory.get() + memory_offset);
      memory_offset += work.memory.elements();
    }
    packed.query = absl::MakeConstSpan(query.get(), static_cast<size_t>(query_offset));
    packed.memory = absl::MakeConstSpan(memory.get(), static_cast<size_t>(memory_offset));
    output.reset(new float[static_cast<size_t>(query_offset)]);
    output_span = absl::MakeSpan(output.get(), static_cast<size_t>(query_offset));
    if (weights_size > 0) {
      weights.reset(new float[static_cast<size_t>(weights_size)]);
      weights_span = absl::MakeSpan(weights.get(), static_cast<size_t>(weights_size));
    }
  }
  const absl::Time compute_start = absl::Now();
  const absl::Status status =
      attention->Forward(packed, attention_options, output_span, weights_span);
  const absl::Duration compute_time = absl::Now() - compute_start;
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
  if (status.ok() && options_.observer.on_batch) {
    options_.observer.on_batch(batch_size, tokens, compute_time);
  }
  int64_t output_offset = 0, weights_offset = 0;
  for (Pending& pending : batch.requests) {
    AttentionWork& work = *pending.work;
    work.compute_time = compute_time;
    if (status.ok() && batch_size > 1) {
      std::memcpy(work.output.data(), output.get() + output_offset, work.output.size());
      if (!work.attention.empty()) {
        std::memcpy(work.attention.data(), weights.get() + weights_offset,
                    work.attention.size());
      }
    }
    output_offset += static_cast<int64_t>(work.output.size() / sizeof(float));
    weights_offset += static_cast<int64_t>(work.attention.size() / sizeof(float));
    Answer(pending, status);
  }
}

}  // namespace attnserve::server
