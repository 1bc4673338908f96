#include "server/batching/batch_scheduler.h"

namespace attnserve::server {

namespace {

absl::Status CheckRange(absl::string_view name, int64_t value, int64_t low,
                        int64_t high) {
  if (value < low || value > high) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be in [", low, ", ", high, "], got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckBatchingOptions(const BatchingOptions& options) {
  for (const absl::Status& status : {
           CheckRange("max_batch_size", options.max_batch_size, 1, 65536),
           CheckRange("max_batch_tokens", options.max_batch_tokens, 1, int64_t{1} << 40),
           CheckRange("max_queue_size", options.max_queue_size, 1, 1 << 30),
           CheckRange("max_queue_bytes", options.max_queue_bytes, 1, int64_t{1} << 50),
           CheckRange("instances", options.instances, 1, 256),
           CheckRange("answer_threads", options.answer_threads, 0, 256),
       }) {
    if (!status.ok()) return status;
  }
  if (options.max_queue_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_queue_delay must be >= 0, got ",
                     absl::FormatDuration(options.max_queue_delay)));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::server
