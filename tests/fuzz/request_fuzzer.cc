// libFuzzer target: wire bytes -> AttendRequest -> validated AttentionWork, the path
// every request takes before it is queued. Any input must give a Status, never a crash,
// an overflow or a read out of bounds.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnserve/v1/attention.pb.h"
#include "core/model_spec.h"
#include "google/protobuf/stubs/logging.h"
#include "server/pipeline/proto_convert.h"

// Invalid UTF-8 in string fields is logged by protobuf on every such input; quiet.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attnserve::v1::AttendRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  attnserve::core::ModelSpec spec;
  spec.d_model = 8;
  spec.num_heads = 2;
  attnserve::server::AdmissionLimits limits;
  limits.max_sequence_length = 64;
  limits.max_response_bytes = 1 << 16;
  limits.max_work_bytes = 1 << 16;
  auto work = attnserve::server::WorkFromRequest(request, spec, limits);
  if (work.ok()) {
    // What was admitted is consistent with its own shapes.
    int64_t tokens = 0;
    for (int64_t length : (*work)->query_lengths) tokens += length;
    if ((*work)->query.elements() != tokens * spec.d_model) __builtin_trap();
    // The batcher reads every admitted byte (ASan checks the views stay inside it).
    std::vector<float> values(static_cast<size_t>((*work)->query.elements()));
    (*work)->query.CopyTo(values.data());
    for (float value : values) {
      if (!std::isfinite(value)) __builtin_trap();  // finiteness was checked
    }
    if ((*work)->reserved_bytes > limits.max_work_bytes) __builtin_trap();
  }
  return 0;
}
