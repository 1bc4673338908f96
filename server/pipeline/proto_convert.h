// The one place where wire messages meet core types: validating an AttendRequest into
// an AttentionWork, writing results back into an AttendResponse, and mapping
// absl::Status to grpc::Status.
#ifndef ATTNSERVE_SERVER_PIPELINE_PROTO_CONVERT_H_
#define ATTNSERVE_SERVER_PIPELINE_PROTO_CONVERT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/v1/attention.pb.h"
#include "core/attention/model_spec.h"
#include "core/encoder/transformer_encoder.h"
#include "core/text/tokenizer.h"
#include "grpcpp/support/status.h"
#include "server/batching/attention_executor.h"
#include "server/batching/encoder_executor.h"

namespace attnserve::server {

// Most bytes of request_id echoed back.
inline constexpr size_t kMaxRequestIdBytes = 256;

// The limits a request is admitted under.
struct AdmissionLimits {
  // Longest query or memory sequence. Range [1, kMaxSequenceLengthCeiling]
  // (model_registry.h).
  int64_t max_sequence_length = 8192;
  // Largest message the server sends; a response that could exceed it is refused before
  // any work. Range [1024, 2^31 - 1] (protobuf cannot serialize 2 GiB).
  int64_t max_response_bytes = 64 << 20;
  // Most bytes one request may hold while queued and computed (the queue's byte budget).
  int64_t max_work_bytes = int64_t{1} << 30;
  // The attention weights are reduced in the server (HeadStatistics) instead of sent.
  // They are bounded by max_response_bytes all the same; only the refusal's wording
  // differs.
  bool weights_for_statistics = false;
  // Refuse a float input holding NaN or an infinity, naming the element. Off, such
  // values are computed through (NaN in, NaN out), as the peers do.
  bool reject_non_finite = false;
  // An encoder's text input: the most tokens one text becomes ([CLS] and [SEP]
  // included). Range [2, max_sequence_length].
  int64_t max_text_tokens = 512;
  // Cut a text over max_text_tokens even when the request does not set `truncate`
  // (the model's auto_truncate).
  bool auto_truncate = false;
  // An encoder's prompts and default prompt (EncoderConfig's; null: none). Not owned.
  const v1::EncoderConfig* text_config = nullptr;
};

// Checks `request` against the model (`spec`) and `limits` and returns its work, whose
// inputs VIEW the request's tensor bytes: `request` must outlive the work (nothing is
// copied here; the batcher reads the bytes once). Shapes and sizes are checked (with
// overflow-checked 64-bit products) before any value is read. InvalidArgument naming the
// field and the expected value for: a missing query, an unsupported dtype, rank not 2 or
// 3, a dimension < 1, last dimension != d_model, a sequence longer than
// max_sequence_length, a raw byte count that does not match the shape, a response larger
// than max_response_bytes, working memory larger than max_work_bytes, a non-finite value
// (with limits.reject_non_finite),
// a memory whose rank or count does not match the query, causal with memory, a head_mask
// of the wrong length or out of [0, 1], an over-long request_id. The work's
// reserved_bytes is set.
absl::StatusOr<std::unique_ptr<AttentionWork>> WorkFromRequest(
    const v1::AttendRequest& request, const core::ModelSpec& spec,
    const AdmissionLimits& limits);

// What a response needs from its request, kept instead of the request's bytes.
struct ReplyFormat {
  v1::DataType dtype = v1::DATA_TYPE_FP32;
  std::vector<int64_t> shape;
  bool return_attention = false;
  std::string request_id;
};
ReplyFormat ReplyFormatOf(const v1::AttendRequest& request);

// Moves `work`'s results into `response` (float32 bytes move without a copy; bf16 is
// narrowed once): output with the query's shape and dtype,
// attention weights (float32, [h, L, L_k] or [n, h, L, L_k]) when asked, timings.
void FillResponse(const ReplyFormat& format, AttentionWork& work,
                  const std::string& model_name, int64_t num_heads,
                  v1::AttendResponse* response);

// Checks an encoder request against the model (`spec`, limits.max_sequence_length)
// and returns its work: token ids (or hidden states) with the padding the attention
// mask marks removed, one vector per field. Shapes, sizes and the response and work
// budgets are checked before any value is read. InvalidArgument naming the field, the
// value and the limit for: neither or both of input_ids and hidden_states, a dtype
// other than INT64/INT32 (FP32/BF16 for hidden states), a rank other than 1 or 2
// (2 or 3), a dimension < 1, a sequence longer than max_sequence_length, a byte count
// not matching the shape, a mask or types tensor of another shape, a mask value other
// than 0/1 or a row that is not ones then zeros or has no one, an id outside
// [0, vocab_size), a type outside [0, type_vocab_size), a non-finite hidden state (with
// limits.reject_non_finite), a
// response over max_response_bytes, work over max_work_bytes, an over-long request_id.
//
// Text (request.text, instead of input_ids) is tokenized by `tokenizer` (null: the model
// takes no text, refused as such), one text at a time, each checked before the next:
// InvalidArgument for an empty list, text that is not valid UTF-8 (naming the text and
// the byte offset), a text of more than limits.max_text_tokens tokens unless
// request.truncate (naming the text, its count and the limit), attention_mask or
// token_type_ids beside text, and the response and work budgets as for ids (checked as
// the tokens add up, so no more than the budget is ever held); first of all, dimensions
// outside [0, the embedding's width], and dimensions or normalize for a model that pools
// nothing; a prompt_name the model lacks, one with pairs or without text. Pairs
// (request.text_pair, a classification model's) are tokenized in the tokenizer's pair
// template; a classification model's scores go through `activation` unless
// request.raw_scores.
// The prompt put before a single text: the one `requested` names, or (empty) the
// default prompt of `config` (may be null: the model has no prompts), or none.
// InvalidArgument naming the prompt and the model's prompts when it has no such one.
absl::StatusOr<std::string> PromptNamed(absl::string_view requested,
                                        const v1::EncoderConfig* config);

absl::StatusOr<std::unique_ptr<EncoderWork>> EncoderWorkFromRequest(
    const v1::EncodeRequest& request, const core::EncoderSpec& spec,
    const AdmissionLimits& limits, const core::Tokenizer* tokenizer = nullptr,
    EncoderWork::ScoreActivation activation = EncoderWork::ScoreActivation::kNone);

// Turns `work` (from EncoderWorkFromRequest) into a head-statistics request: it also
// holds one layer's attention weights while computing (num_heads * sum(L^2) floats),
// counted in its reserved bytes. InvalidArgument naming the bytes and the limit when
// they exceed limits.max_work_bytes.
// With `return_attention`, it also holds the first sequence's weights in every layer
// (num_layers * num_heads * L0^2 floats).
absl::Status AdmitEncoderStatistics(const core::EncoderSpec& spec,
                                    const AdmissionLimits& limits, bool return_attention,
                                    EncoderWork* work);

// `work`'s head statistics into `response`: one entry per layer and head, layer by
// layer, each marked pruned when the model removed it; and, when the work returned
// them, the first sequence's attention weights and (with `tokenizer`) its tokens.
void FillEncoderStatistics(EncoderWork& work, const core::EncoderSpec& spec,
                           const std::string& model_name,
                           const core::Tokenizer* tokenizer,
                           v1::HeadStatisticsResponse* response);

// Moves `work`'s results into `response`: embedding [n, dimensions or d] (or a
// classifier's scores [n, num_labels]) and hidden
// [tokens, d] (float32), lengths, timings.
void FillEncodeResponse(EncoderWork& work, const std::string& model_name,
                        const std::string& request_id, int64_t d_model,
                        v1::EncodeResponse* response);

// The same code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The HTTP status every HTTP door answers a code with (the KServe v2 doors, the
// embedding APIs, the status page's head view): 400 for a bad request, 401, 404, 429,
// 499 for a cancelled call, 503, 504, else 500; and its reason phrase.
int HttpStatusFor(absl::StatusCode code);
const char* HttpReason(int status);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_PIPELINE_PROTO_CONVERT_H_
