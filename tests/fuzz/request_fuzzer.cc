// libFuzzer target: wire bytes -> AttendRequest -> validated AttentionWork, and the
// same bytes -> EncodeRequest -> validated EncoderWork (text through a tokenizer
// included): the paths every request takes before it is queued. Any input must give a
// Status, never a crash, an overflow or a read out of bounds.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnserve/v1/attention.pb.h"
#include "core/attention/model_spec.h"
#include "core/encoder/transformer_encoder.h"
#include "core/text/wordpiece_tokenizer.h"
#include "google/protobuf/stubs/logging.h"
#include "server/pipeline/proto_convert.h"

// Invalid UTF-8 in string fields is logged by protobuf on every such input; quiet.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

// The encoder's path: what is admitted matches its own lengths and the model's limits.
void FuzzEncode(const uint8_t* data, size_t size) {
  attnserve::v1::EncodeRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  attnserve::core::EncoderSpec spec;
  spec.num_layers = 1;
  spec.d_model = 8;
  spec.num_heads = 2;
  spec.ffn_dim = 16;
  spec.vocab_size = 100;
  spec.max_positions = 64;
  attnserve::server::AdmissionLimits limits;
  limits.max_sequence_length = 64;
  limits.max_response_bytes = 1 << 16;
  limits.max_work_bytes = 1 << 18;
  limits.max_text_tokens = 16;
  // Both policies for NaN and infinities, chosen by the input.
  limits.reject_non_finite = size % 2 == 0;
  // Text goes through a small vocabulary's tokenizer.
  static const auto* const tokenizer =
      attnserve::core::WordPieceTokenizer::FromVocab(
          "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\n##b\nab\n,\n\xc3\xa9\n", {})
          ->release();
  auto work = attnserve::server::EncoderWorkFromRequest(request, spec, limits, tokenizer);
  if (!work.ok()) return;
  const int64_t tokens = (*work)->tokens();
  const int64_t longest =
      request.text_size() > 0 ? limits.max_text_tokens : limits.max_sequence_length;
  for (int64_t length : (*work)->lengths) {
    if (length < 1 || length > longest) __builtin_trap();
  }
  if ((*work)->token_ids.empty()) {
    if (static_cast<int64_t>((*work)->hidden_states.size()) != tokens * spec.d_model) {
      __builtin_trap();
    }
    for (float value : (*work)->hidden_states) {
      if (limits.reject_non_finite && !std::isfinite(value)) __builtin_trap();
    }
  } else {
    if (static_cast<int64_t>((*work)->token_ids.size()) != tokens) __builtin_trap();
    for (int64_t id : (*work)->token_ids) {
      if (id < 0 || id >= spec.vocab_size) __builtin_trap();
    }
    if (!(*work)->token_types.empty() &&
        (*work)->token_types.size() != (*work)->token_ids.size()) {
      __builtin_trap();
    }
  }
  if ((*work)->reserved_bytes > limits.max_work_bytes) __builtin_trap();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzEncode(data, size);
  attnserve::v1::AttendRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  attnserve::core::ModelSpec spec;
  spec.d_model = 8;
  spec.num_heads = 2;
  attnserve::server::AdmissionLimits limits;
  limits.max_sequence_length = 64;
  limits.max_response_bytes = 1 << 16;
  limits.max_work_bytes = 1 << 16;
  // Both policies for NaN and infinities, chosen by the input.
  limits.reject_non_finite = size % 2 == 0;
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
      // Finiteness was checked when asked for.
      if (limits.reject_non_finite && !std::isfinite(value)) __builtin_trap();
    }
    if ((*work)->reserved_bytes > limits.max_work_bytes) __builtin_trap();
  }
  return 0;
}
