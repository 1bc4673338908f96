#include "server/pipeline/proto_convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/bfloat16.h"
#include "core/base/status_macros.h"
#include "core/text/unicode_text.h"

namespace attnserve::server {

namespace {

// A request's head_mask: empty, or one factor in [0, 1] per head of an attention layer
// (`layers` 0), or per layer and head of an encoder (`layers` of them, layer by layer;
// a bad factor's message names its layer and head). InvalidArgument otherwise.
absl::Status CheckHeadMask(const google::protobuf::RepeatedField<float>& mask,
                           int64_t layers, int64_t heads) {
  if (mask.empty()) return absl::OkStatus();
  const bool encoder = layers > 0;
  const int64_t count = encoder ? layers * heads : heads;
  if (mask.size() != count) {
    return absl::InvalidArgumentError(
        encoder
            ? absl::StrCat("head_mask must have num_layers * num_heads = ", layers, " * ",
                           heads, " = ", count, " factors or none, got ", mask.size())
            : absl::StrCat("head_mask must have num_heads=", heads,
                           " values or none, got ", mask.size()));
  }
  for (int i = 0; i < mask.size(); ++i) {
    const float factor = mask.Get(i);
    if (!(factor >= 0.0f && factor <= 1.0f)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "head_mask[", i, "]",
          encoder ? absl::StrCat(" (layer ", i / heads, ", head ", i % heads, ")") : "",
          " must be in [0, 1], got ", factor));
    }
  }
  return absl::OkStatus();
}

// Bytes a response carries beyond its tensors (model name, request_id, shapes, timings,
// protobuf and gRPC framing), counted generously so that the estimate is an upper bound.
constexpr int64_t kResponseOverheadBytes = 4096;

struct TensorLayout {
  int64_t count = 1;     // sequences
  int64_t length = 0;    // tokens per sequence
  int64_t elements = 0;  // count * length * d_model
};

std::string ShapeText(const v1::Tensor& tensor) {
  return absl::StrCat("[", absl::StrJoin(tensor.shape(), ", "), "]");
}

// The product of `factors`, or nullopt when it overflows int64.
std::optional<int64_t> CheckedProduct(std::initializer_list<int64_t> factors) {
  int64_t product = 1;
  for (int64_t factor : factors) {
    if (__builtin_mul_overflow(product, factor, &product)) return std::nullopt;
  }
  return product;
}

int64_t ElementSize(v1::DataType dtype) { return dtype == v1::DATA_TYPE_FP32 ? 4 : 2; }

// Validates `tensor` (named `field`) as [L, d] or [n, L, d] without touching its values.
absl::StatusOr<TensorLayout> CheckSequences(const v1::Tensor& tensor,
                                            absl::string_view field,
                                            const core::ModelSpec& spec,
                                            int64_t max_sequence_length) {
  if (tensor.dtype() != v1::DATA_TYPE_FP32 && tensor.dtype() != v1::DATA_TYPE_BF16) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".dtype must be DATA_TYPE_FP32 or DATA_TYPE_BF16, got ",
                     v1::DataType_Name(tensor.dtype())));
  }
  const int rank = tensor.shape_size();
  if (rank != 2 && rank != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".shape must have rank 2 [L, d_model] or 3 [n, L, d_model], got rank ",
        rank, " ", ShapeText(tensor)));
  }
  for (int i = 0; i < rank; ++i) {
    if (tensor.shape(i) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape[", i, "] must be >= 1, got ", tensor.shape(i),
                       " in shape ", ShapeText(tensor)));
    }
  }
  TensorLayout layout;
  layout.count = rank == 3 ? tensor.shape(0) : 1;
  layout.length = tensor.shape(rank - 2);
  const int64_t width = tensor.shape(rank - 1);
  if (width != spec.d_model) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape[", rank - 1,
                                                   "] must equal d_model=", spec.d_model,
                                                   ", got ", width));
  }
  if (layout.length > max_sequence_length) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " sequence length ", layout.length,
                     " exceeds max_sequence_length=", max_sequence_length));
  }
  const int64_t element_size = ElementSize(tensor.dtype());
  const std::optional<int64_t> bytes =
      CheckedProduct({layout.count, layout.length, width, element_size});
  if (!bytes || *bytes != static_cast<int64_t>(tensor.raw().size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".raw must hold product(shape) * ", element_size, " = ",
                     bytes ? absl::StrCat(*bytes) : std::string("(over 2^63)"),
                     " bytes for ", v1::DataType_Name(tensor.dtype()), " shape ",
                     ShapeText(tensor), ", got ", tensor.raw().size()));
  }
  layout.elements = *bytes / element_size;
  return layout;
}

// Checks that `tensor`'s values (sizes already checked by CheckSequences) are finite,
// reading the bytes in place: an exponent of all ones is an infinity or a NaN.
absl::Status CheckFinite(const v1::Tensor& tensor, absl::string_view field,
                         const TensorLayout& layout) {
  const char* raw = tensor.raw().data();
  const bool bf16 = tensor.dtype() == v1::DATA_TYPE_BF16;
  const auto first_bad = [&]() -> int64_t {
    if (bf16) {
      for (int64_t i = 0; i < layout.elements; ++i) {
        uint16_t bits;
        std::memcpy(&bits, raw + 2 * i, 2);
        if ((bits & 0x7f80u) == 0x7f80u) return i;
      }
      return -1;
    }
    // Branch-free over blocks so that the compiler vectorizes the common, clean case.
    constexpr int64_t kBlock = 1024;
    for (int64_t begin = 0; begin < layout.elements; begin += kBlock) {
      const int64_t end = std::min(layout.elements, begin + kBlock);
      uint32_t bad = 0;
      for (int64_t i = begin; i < end; ++i) {
        uint32_t bits;
        std::memcpy(&bits, raw + 4 * i, 4);
        bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
      }
      if (bad == 0) continue;
      for (int64_t i = begin; i < end; ++i) {
        uint32_t bits;
        std::memcpy(&bits, raw + 4 * i, 4);
        if ((bits & 0x7f800000u) == 0x7f800000u) return i;
      }
    }
    return -1;
  };
  const int64_t bad = first_bad();
  if (bad < 0) return absl::OkStatus();
  float value;
  if (bf16) {
    uint16_t bits;
    std::memcpy(&bits, raw + 2 * bad, 2);
    value = core::Bf16ToFloat(bits);
  } else {
    std::memcpy(&value, raw + 4 * bad, 4);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, " must hold finite values; element ", bad, " is ", value));
}

// The bytes a request's answer and its work will take, from its validated shapes.
// InvalidArgument when the response could never be sent within max_response_bytes, or
// the work could never fit in max_work_bytes.
absl::StatusOr<int64_t> AdmitSizes(const v1::AttendRequest& request,
                                   const core::ModelSpec& spec, const TensorLayout& query,
                                   const std::optional<TensorLayout>& memory,
                                   const AdmissionLimits& limits) {
  const int64_t key_length = memory ? memory->length : query.length;
  // Attention weights are float32 [n, h, L_q, L_k]; sizes below are exact products of
  // dimensions already bounded by max_sequence_length, computed without wrapping.
  const std::optional<int64_t> attention_bytes =
      request.return_attention()
          ? CheckedProduct({query.count, spec.num_heads, query.length, key_length, 4})
          : std::optional<int64_t>(0);
  const int64_t output_bytes = query.elements * ElementSize(request.query().dtype());
  const int64_t overhead = kResponseOverheadBytes + request.request_id().size();
  if (!attention_bytes ||
      *attention_bytes > limits.max_response_bytes - output_bytes - overhead) {
    if (limits.weights_for_statistics) {
      return absl::InvalidArgumentError(absl::StrCat(
          "head statistics need the attention weights, ",
          attention_bytes ? absl::StrCat(*attention_bytes) : std::string("over 2^63"),
          " bytes, over max_message_bytes=", limits.max_response_bytes,
          " (the most one request's weights may take); send fewer tokens"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "the response would be ",
        attention_bytes ? absl::StrCat(output_bytes + *attention_bytes + overhead)
                        : std::string("over 2^63"),
        " bytes (output ", output_bytes, ", attention weights ",
        attention_bytes ? absl::StrCat(*attention_bytes) : std::string("over 2^63"),
        "), over the largest message the server sends, max_message_bytes=",
        limits.max_response_bytes,
        request.return_attention() ? "; ask without return_attention or send fewer tokens"
                                   : "; send fewer tokens"));
  }
  // Held while queued and computed: float32 inputs and results.
  const int64_t memory_elements = memory ? memory->elements : 0;
  const int64_t work_bytes =
      (2 * query.elements + memory_elements) * int64_t{4} + *attention_bytes;
  if (work_bytes > limits.max_work_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request needs ", work_bytes,
        " bytes of working memory, over max_queue_bytes=", limits.max_work_bytes));
  }
  return work_bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionWork>> WorkFromRequest(
    const v1::AttendRequest& request, const core::ModelSpec& spec,
    const AdmissionLimits& limits) {
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id must be at most ",
                                                   kMaxRequestIdBytes, " bytes, got ",
                                                   request.request_id().size()));
  }
  if (!request.has_query()) {
    return absl::InvalidArgumentError(
        "query is required: a tensor [L, d_model] or "
        "[n, L, d_model]");
  }
  // Shapes and sizes first: nothing is copied or converted for a request that will be
  // refused.
  absl::StatusOr<TensorLayout> query =
      CheckSequences(request.query(), "query", spec, limits.max_sequence_length);
  if (!query.ok()) return query.status();
  std::optional<TensorLayout> memory;
  if (request.has_memory()) {
    if (request.causal()) {
      return absl::InvalidArgumentError(
          "causal must be false when memory is set: a causal mask is defined for "
          "self-attention only");
    }
    if (request.memory().shape_size() != request.query().shape_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "memory.shape must have the query's rank ", request.query().shape_size(),
          ", got rank ", request.memory().shape_size()));
    }
    absl::StatusOr<TensorLayout> checked =
        CheckSequences(request.memory(), "memory", spec, limits.max_sequence_length);
    if (!checked.ok()) return checked.status();
    if (checked->count != query->count) {
      return absl::InvalidArgumentError(
          absl::StrCat("memory.shape[0] must equal query.shape[0]=", query->count,
                       " (one memory per query sequence), got ", checked->count));
    }
    memory = *checked;
  }
  ATTN_RETURN_IF_ERROR(CheckHeadMask(request.head_mask(), 0, spec.num_heads));
  absl::StatusOr<int64_t> work_bytes = AdmitSizes(request, spec, *query, memory, limits);
  if (!work_bytes.ok()) return work_bytes.status();

  if (limits.reject_non_finite) {
    ATTN_RETURN_IF_ERROR(CheckFinite(request.query(), "query", *query));
    if (memory) ATTN_RETURN_IF_ERROR(CheckFinite(request.memory(), "memory", *memory));
  }

  auto work = std::make_unique<AttentionWork>();
  work->reserved_bytes = *work_bytes;
  work->query =
      InputTensor(request.query().raw(), request.query().dtype() == v1::DATA_TYPE_BF16);
  work->query_lengths.assign(query->count, query->length);
  if (memory) {
    work->memory = InputTensor(request.memory().raw(),
                               request.memory().dtype() == v1::DATA_TYPE_BF16);
    work->memory_lengths.assign(memory->count, memory->length);
  }
  work->head_mask.assign(request.head_mask().begin(), request.head_mask().end());
  work->causal = request.causal();
  work->return_attention = request.return_attention();
  return work;
}

ReplyFormat ReplyFormatOf(const v1::AttendRequest& request) {
  ReplyFormat format;
  format.dtype = request.query().dtype();
  format.shape.assign(request.query().shape().begin(), request.query().shape().end());
  format.return_attention = request.return_attention();
  format.request_id = request.request_id();
  return format;
}

void FillResponse(const ReplyFormat& format, AttentionWork& work,
                  const std::string& model_name, int64_t num_heads,
                  v1::AttendResponse* response) {
  v1::Tensor* output = response->mutable_output();
  output->set_dtype(format.dtype);
  output->mutable_shape()->Add(format.shape.begin(), format.shape.end());
  if (format.dtype == v1::DATA_TYPE_BF16) {
    const absl::Span<const float> values = work.output_values();
    std::string* raw = output->mutable_raw();
    raw->resize(values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t bits = core::FloatToBf16(values[i]);
      std::memcpy(raw->data() + 2 * i, &bits, 2);
    }
  } else {
    output->set_raw(std::move(work.output));  // the bytes move; nothing is copied
  }
  if (format.return_attention) {
    v1::Tensor* attention = response->mutable_attention();
    attention->set_dtype(v1::DATA_TYPE_FP32);
    const int rank = static_cast<int>(format.shape.size());
    const int64_t key_length = work.memory_lengths.empty() ? work.query_lengths.front()
                                                           : work.memory_lengths.front();
    if (rank == 3) attention->add_shape(static_cast<int64_t>(work.query_lengths.size()));
    attention->add_shape(num_heads);
    attention->add_shape(work.query_lengths.front());
    attention->add_shape(key_length);
    attention->set_raw(std::move(work.attention));
  }
  response->set_model(model_name);
  response->set_request_id(format.request_id);
  response->set_queue_time_us(absl::ToInt64Microseconds(work.queue_time));
  response->set_compute_time_us(absl::ToInt64Microseconds(work.compute_time));
  response->set_batch_size(work.batch_size);
}

namespace {

// An integer tensor's layout: [L] or [n, L].
struct IdsLayout {
  int64_t count = 1;
  int64_t length = 0;
};

// Validates `tensor` (named `field`) as INT64/INT32 [L] or [n, L] without reading its
// values.
absl::StatusOr<IdsLayout> CheckIds(const v1::Tensor& tensor, absl::string_view field,
                                   int64_t max_sequence_length) {
  if (tensor.dtype() != v1::DATA_TYPE_INT64 && tensor.dtype() != v1::DATA_TYPE_INT32) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".dtype must be DATA_TYPE_INT64 or DATA_TYPE_INT32, got ",
                     v1::DataType_Name(tensor.dtype())));
  }
  const int rank = tensor.shape_size();
  if (rank != 1 && rank != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".shape must have rank 1 [L] or 2 [n, L], got rank ", rank,
                     " ", ShapeText(tensor)));
  }
  for (int i = 0; i < rank; ++i) {
    if (tensor.shape(i) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape[", i, "] must be >= 1, got ", tensor.shape(i),
                       " in shape ", ShapeText(tensor)));
    }
  }
  IdsLayout layout;
  layout.count = rank == 2 ? tensor.shape(0) : 1;
  layout.length = tensor.shape(rank - 1);
  if (layout.length > max_sequence_length) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " sequence length ", layout.length,
                     " exceeds max_sequence_length=", max_sequence_length));
  }
  const int64_t element_size = tensor.dtype() == v1::DATA_TYPE_INT64 ? 8 : 4;
  const std::optional<int64_t> bytes =
      CheckedProduct({layout.count, layout.length, element_size});
  if (!bytes || *bytes != static_cast<int64_t>(tensor.raw().size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".raw must hold product(shape) * ", element_size, " = ",
                     bytes ? absl::StrCat(*bytes) : std::string("(over 2^63)"),
                     " bytes for ", v1::DataType_Name(tensor.dtype()), " shape ",
                     ShapeText(tensor), ", got ", tensor.raw().size()));
  }
  return layout;
}

// Element `i` of an INT64 or INT32 tensor whose size was checked.
int64_t IntAt(const v1::Tensor& tensor, int64_t i) {
  if (tensor.dtype() == v1::DATA_TYPE_INT64) {
    int64_t value;
    std::memcpy(&value, tensor.raw().data() + 8 * i, 8);
    return value;
  }
  int32_t value;
  std::memcpy(&value, tensor.raw().data() + 4 * i, 4);
  return value;
}

// The sequences' lengths from the attention mask (all L without one): each row ones
// then zeros, at least one one.
absl::StatusOr<std::vector<int64_t>> MaskLengths(const v1::EncodeRequest& request,
                                                 absl::string_view input_field, int rank,
                                                 const IdsLayout& layout,
                                                 int64_t max_sequence_length) {
  if (!request.has_attention_mask()) {
    return std::vector<int64_t>(static_cast<size_t>(layout.count), layout.length);
  }
  ATTN_ASSIGN_OR_RETURN(
      const IdsLayout mask,
      CheckIds(request.attention_mask(), "attention_mask", max_sequence_length));
  if (request.attention_mask().shape_size() != rank || mask.count != layout.count ||
      mask.length != layout.length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention_mask.shape must be ", input_field, "'s [n, L] ",
        rank == 1 ? absl::StrCat("[", layout.length, "]")
                  : absl::StrCat("[", layout.count, ", ", layout.length, "]"),
        ", got ", ShapeText(request.attention_mask())));
  }
  std::vector<int64_t> lengths;
  for (int64_t row = 0; row < layout.count; ++row) {
    int64_t length = 0;
    for (int64_t j = 0; j < layout.length; ++j) {
      const int64_t value = IntAt(request.attention_mask(), row * layout.length + j);
      if (value != 0 && value != 1) {
        return absl::InvalidArgumentError(absl::StrCat("attention_mask[", row, "][", j,
                                                       "] must be 0 or 1, got ", value));
      }
      if (value == 1) {
        if (length != j) {
          return absl::InvalidArgumentError(
              absl::StrCat("attention_mask[", row,
                           "] must be ones then zeros (padding on the right); "
                           "position ",
                           j, " is 1 after a 0"));
        }
        ++length;
      }
    }
    if (length == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attention_mask[", row, "] has no 1: every sequence needs a token"));
    }
    lengths.push_back(length);
  }
  return lengths;
}

// The bytes an encoder request's answer takes (embedding, hidden states, lengths,
// token ids) and the bytes it holds while queued and computed (inputs, results, and the
// core's activations for its tokens: hidden state, residual, feed-forward width).
struct EncodeBytes {
  int64_t embedding = 0;
  int64_t hidden = 0;
  int64_t response = 0;
  int64_t work = 0;
};
EncodeBytes EncodeBytesFor(int64_t count, int64_t tokens, bool hidden_in,
                           const v1::EncodeRequest& request,
                           const core::EncoderSpec& spec) {
  const int64_t d = spec.d_model;
  EncodeBytes bytes;
  bytes.embedding = spec.pools() ? count * spec.pooled_width() * 4 : 0;
  bytes.hidden = request.return_hidden() ? tokens * d * 4 : 0;
  bytes.response = bytes.embedding + bytes.hidden + count * 10 +
                   (request.return_token_ids() ? tokens * 10 : 0) +
                   kResponseOverheadBytes +
                   static_cast<int64_t>(request.request_id().size());
  bytes.work = tokens * 16 + (hidden_in ? tokens * d * 4 : 0) + bytes.embedding +
               bytes.hidden + tokens * (2 * d + spec.ffn_dim) * 4;
  return bytes;
}

absl::Status CheckEncodeBytes(const EncodeBytes& bytes, const v1::EncodeRequest& request,
                              const AdmissionLimits& limits) {
  if (bytes.response > limits.max_response_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the response would be ", bytes.response, " bytes (embedding ", bytes.embedding,
        ", hidden ", bytes.hidden,
        "), over the largest message the server sends, max_message_bytes=",
        limits.max_response_bytes,
        request.return_hidden() ? "; ask without return_hidden or send fewer tokens"
                                : "; send fewer sequences"));
  }
  if (bytes.work > limits.max_work_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request needs ", bytes.work,
        " bytes of working memory, over max_queue_bytes=", limits.max_work_bytes));
  }
  return absl::OkStatus();
}

// The serving options of the embedding (dimensions, normalize), checked against the
// model before any input is read.
absl::Status CheckEmbeddingOptions(const v1::EncodeRequest& request,
                                   const core::EncoderSpec& spec) {
  if (request.dimensions() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dimensions must be 0 (all of them) or positive, got ", request.dimensions()));
  }
  if (spec.sparse != core::EncoderSpec::Sparse::kNone &&
      (request.dimensions() > 0 || request.normalize())) {
    return absl::InvalidArgumentError(absl::StrCat(
        request.dimensions() > 0 ? "dimensions" : "normalize",
        " applies to a dense embedding, and this model's is sparse (SPLADE: one weight "
        "per vocabulary entry, ",
        spec.vocab_size, " of them)"));
  }
  if (spec.num_labels == 0 && request.dimensions() > spec.pooled_width()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dimensions must be at most ", spec.pooled_width(),
        spec.dense.empty() ? " (the model's d_model)"
                           : " (the model's embedding width, its last Dense layer's)",
        ", got ", request.dimensions()));
  }
  const bool classifies = spec.num_labels > 0;
  if (classifies && (request.dimensions() > 0 || request.normalize())) {
    return absl::InvalidArgumentError(absl::StrCat(
        request.dimensions() > 0 ? "dimensions" : "normalize",
        " applies to an embedding, and this model classifies (its answer is scores)"));
  }
  if (!classifies && (request.raw_scores() || request.text_pair_size() > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        request.raw_scores() ? "raw_scores" : "text_pair",
        " applies to a classification model (a cross-encoder), and this model embeds"));
  }
  ATTN_RETURN_IF_ERROR(
      CheckHeadMask(request.head_mask(), spec.num_layers, spec.num_heads));
  if ((request.dimensions() > 0 || request.normalize()) &&
      spec.pooling == core::EncoderSpec::Pooling::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(
        request.dimensions() > 0 ? "dimensions" : "normalize",
        " applies to the pooled embedding, and this model pools nothing (pooling NONE)"));
  }
  return absl::OkStatus();
}

// Shortened, a normalized model's embedding is normalized again; asked for, a model
// that does not normalize is; otherwise the embedding stays bit for bit as the model
// made it.
void SetEmbeddingOptions(const v1::EncodeRequest& request, const core::EncoderSpec& spec,
                         EncoderWork::ScoreActivation activation, EncoderWork* work) {
  work->score_activation =
      request.raw_scores() ? EncoderWork::ScoreActivation::kNone : activation;
  work->dimensions = request.dimensions();
  work->head_mask.assign(request.head_mask().begin(), request.head_mask().end());
  const bool shortened =
      request.dimensions() > 0 && request.dimensions() < spec.pooled_width();
  work->normalize = spec.normalize ? shortened : request.normalize();
}

// The prompt put before each text: the request's prompt_name's, else the model's
// default's; none for pairs. InvalidArgument for a name the model does not have, or a
// prompt_name with pairs.
absl::StatusOr<std::string> PromptFor(const v1::EncodeRequest& request,
                                      const AdmissionLimits& limits, bool pairs) {
  const v1::EncoderConfig* config = limits.text_config;
  if (pairs) {
    if (!request.prompt_name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt_name \"", request.prompt_name(),
          "\" applies to single texts; pairs (text with text_pair) take no prompt"));
    }
    return std::string();
  }
  return PromptNamed(request.prompt_name(), config);
}

// Text in: each text tokenized and checked in turn.
absl::StatusOr<std::unique_ptr<EncoderWork>> TextWork(
    const v1::EncodeRequest& request, const core::EncoderSpec& spec,
    const AdmissionLimits& limits, const core::Tokenizer* tokenizer,
    EncoderWork::ScoreActivation activation) {
  if (tokenizer == nullptr) {
    return absl::InvalidArgumentError(
        "text needs a tokenizer, and this model's folder has neither tokenizer.json nor "
        "vocab.txt: send input_ids");
  }
  if (request.has_input_ids() || request.has_hidden_states()) {
    return absl::InvalidArgumentError(
        "set one of text, input_ids and hidden_states, not several");
  }
  if (request.has_attention_mask() || request.has_token_type_ids()) {
    return absl::InvalidArgumentError(
        absl::StrCat(request.has_attention_mask() ? "attention_mask" : "token_type_ids",
                     " must be unset with text (the tokenizer makes the ids)"));
  }
  const bool pairs = request.text_pair_size() > 0;
  if (pairs && request.text_pair_size() != request.text_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("text_pair has ", request.text_pair_size(), " texts and text ",
                     request.text_size(), ": each text needs its second text"));
  }
  const int64_t limit = limits.max_text_tokens;
  // Room for the template's own tokens ([CLS] and [SEP]s, <s> and </s>s) at least.
  if (const int64_t added = tokenizer->added_tokens(pairs); limit < added) {
    return absl::InvalidArgumentError(
        absl::StrCat(pairs ? "pairs" : "texts", " need max_text_tokens >= ", added,
                     " (the tokenizer's special tokens), and it is ", limit));
  }
  ATTN_ASSIGN_OR_RETURN(const std::string prompt, PromptFor(request, limits, pairs));
  const bool truncate = request.truncate() || limits.auto_truncate;
  std::string prompted;  // a prompted text, reused from text to text
  auto work = std::make_unique<EncoderWork>();
  work->lengths.reserve(static_cast<size_t>(request.text_size()));
  for (int i = 0; i < request.text_size(); ++i) {
    const size_t before = work->token_ids.size();
    absl::string_view text = request.text(i);
    if (!prompt.empty()) {
      // Offsets in errors count from the text's start, not the prompt's.
      if (absl::Status utf8 = core::CheckUtf8(text); !utf8.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("text[", i, "] is ", utf8.message()));
      }
      prompted.assign(prompt);
      prompted.append(text.data(), text.size());
      text = prompted;
    }
    absl::StatusOr<core::Tokenizer::Encoding> encoding =
        pairs ? tokenizer->EncodePair(text, request.text_pair(i), limit, &work->token_ids,
                                      &work->token_types)
              : tokenizer->Encode(text, limit, &work->token_ids);
    const std::string which = pairs
                                  ? absl::StrCat("text[", i, "] with text_pair[", i, "]")
                                  : absl::StrCat("text[", i, "]");
    if (!encoding.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, " is ", encoding.status().message()));
    }
    if (encoding->truncated) {
      if (!truncate) {
        return absl::InvalidArgumentError(absl::StrCat(
            which, " is ", encoding->tokens, " tokens, over the model's limit of ", limit,
            " (max_text_tokens): shorten it, or set truncate to cut it (a model with "
            "auto_truncate cuts every such text)"));
      }
      ++work->truncated;
    }
    work->lengths.push_back(static_cast<int64_t>(work->token_ids.size() - before));
    ATTN_RETURN_IF_ERROR(CheckEncodeBytes(
        EncodeBytesFor(i + 1, static_cast<int64_t>(work->token_ids.size()), false,
                       request, spec),
        request, limits));
  }
  const EncodeBytes bytes =
      EncodeBytesFor(request.text_size(), static_cast<int64_t>(work->token_ids.size()),
                     false, request, spec);
  work->reserved_bytes = bytes.work;
  work->pooled = bytes.embedding > 0;
  work->return_hidden = request.return_hidden();
  work->return_token_ids = request.return_token_ids();
  SetEmbeddingOptions(request, spec, activation, work.get());
  return work;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EncoderWork>> EncoderWorkFromRequest(
    const v1::EncodeRequest& request, const core::EncoderSpec& spec,
    const AdmissionLimits& limits, const core::Tokenizer* tokenizer,
    EncoderWork::ScoreActivation activation) {
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id must be at most ",
                                                   kMaxRequestIdBytes, " bytes, got ",
                                                   request.request_id().size()));
  }
  ATTN_RETURN_IF_ERROR(CheckEmbeddingOptions(request, spec));
  if (request.text_size() > 0) {
    return TextWork(request, spec, limits, tokenizer, activation);
  }
  if (request.text_pair_size() > 0) {
    return absl::InvalidArgumentError(
        "text_pair needs text: the first text of each pair");
  }
  if (request.truncate() || request.return_token_ids() ||
      !request.prompt_name().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(request.truncate()           ? "truncate"
                     : request.return_token_ids() ? "return_token_ids"
                                                  : "prompt_name",
                     " applies to text input only; it is set, and text is empty"));
  }
  const bool ids = request.has_input_ids();
  if (ids == request.has_hidden_states()) {
    return absl::InvalidArgumentError(
        ids ? "set input_ids or hidden_states, not both"
            : "input_ids is required: token ids [L] or [n, L] (or hidden_states "
              "[L, d_model] or [n, L, d_model])");
  }
  const int64_t d = spec.d_model;
  IdsLayout layout;
  int rank = 0;
  std::optional<TensorLayout> hidden;
  if (ids) {
    ATTN_ASSIGN_OR_RETURN(
        layout, CheckIds(request.input_ids(), "input_ids", limits.max_sequence_length));
    rank = request.input_ids().shape_size();
  } else {
    core::ModelSpec attention;
    attention.d_model = d;
    attention.num_heads = spec.num_heads;
    ATTN_ASSIGN_OR_RETURN(hidden, CheckSequences(request.hidden_states(), "hidden_states",
                                                 attention, limits.max_sequence_length));
    layout.count = hidden->count;
    layout.length = hidden->length;
    rank = request.hidden_states().shape_size() - 1;
    if (request.has_token_type_ids()) {
      return absl::InvalidArgumentError(
          "token_type_ids must be unset with hidden_states (the embeddings are skipped)");
    }
  }
  const absl::string_view input_field = ids ? "input_ids" : "hidden_states";
  if (request.has_token_type_ids()) {
    ATTN_ASSIGN_OR_RETURN(
        const IdsLayout types,
        CheckIds(request.token_type_ids(), "token_type_ids", limits.max_sequence_length));
    if (request.token_type_ids().shape_size() != rank || types.count != layout.count ||
        types.length != layout.length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token_type_ids.shape must equal input_ids.shape ",
          ShapeText(request.input_ids()), ", got ", ShapeText(request.token_type_ids())));
    }
  }
  ATTN_ASSIGN_OR_RETURN(
      std::vector<int64_t> lengths,
      MaskLengths(request, input_field, rank, layout, limits.max_sequence_length));
  int64_t tokens = 0;
  for (const int64_t length : lengths) tokens += length;
  // Sizes before values. Every product below is of dimensions bounded by the checked
  // byte count of a message, so none overflows.
  const EncodeBytes bytes =
      EncodeBytesFor(layout.count, tokens, hidden.has_value(), request, spec);
  ATTN_RETURN_IF_ERROR(CheckEncodeBytes(bytes, request, limits));
  auto work = std::make_unique<EncoderWork>();
  work->reserved_bytes = bytes.work;
  work->pooled = bytes.embedding > 0;
  work->return_hidden = request.return_hidden();
  SetEmbeddingOptions(request, spec, activation, work.get());
  if (ids) {
    work->token_ids.reserve(static_cast<size_t>(tokens));
    if (request.has_token_type_ids()) {
      work->token_types.reserve(static_cast<size_t>(tokens));
    }
    for (int64_t row = 0; row < layout.count; ++row) {
      for (int64_t j = 0; j < lengths[row]; ++j) {
        const int64_t at = row * layout.length + j;
        const int64_t id = IntAt(request.input_ids(), at);
        if (id < 0 || id >= spec.vocab_size) {
          return absl::InvalidArgumentError(
              absl::StrCat("input_ids", rank == 2 ? absl::StrCat("[", row, "]") : "", "[",
                           j, "] must be in [0, ", spec.vocab_size,
                           ") (the model's vocab_size), got ", id));
        }
        work->token_ids.push_back(id);
        if (request.has_token_type_ids()) {
          const int64_t type = IntAt(request.token_type_ids(), at);
          if (type < 0 || type >= spec.type_vocab_size) {
            return absl::InvalidArgumentError(absl::StrCat(
                "token_type_ids", rank == 2 ? absl::StrCat("[", row, "]") : "", "[", j,
                "] must be in [0, ", spec.type_vocab_size,
                ") (the model's type_vocab_size), got ", type));
          }
          work->token_types.push_back(type);
        }
      }
    }
  } else {
    if (limits.reject_non_finite) {
      ATTN_RETURN_IF_ERROR(
          CheckFinite(request.hidden_states(), "hidden_states", *hidden));
    }
    // Each sequence's tokens, read once (widened for bf16) without its padding.
    const bool bf16 = request.hidden_states().dtype() == v1::DATA_TYPE_BF16;
    const auto row_bytes = static_cast<size_t>(layout.length * d * (bf16 ? 2 : 4));
    const absl::string_view raw = request.hidden_states().raw();
    work->hidden_states.resize(static_cast<size_t>(tokens * d));
    float* out = work->hidden_states.data();
    for (int64_t row = 0; row < layout.count; ++row) {
      const InputTensor tokens_of_row(
          raw.substr(row * row_bytes,
                     static_cast<size_t>(lengths[row] * d * (bf16 ? 2 : 4))),
          bf16);
      tokens_of_row.CopyTo(out);
      out += tokens_of_row.elements();
    }
  }
  work->lengths = std::move(lengths);
  return work;
}

absl::Status AdmitEncoderStatistics(const core::EncoderSpec& spec,
                                    const AdmissionLimits& limits, bool return_attention,
                                    EncoderWork* work) {
  int64_t weights = 0;
  for (const int64_t length : work->lengths) weights += length * length;
  const int64_t first = work->lengths.front() * work->lengths.front();
  // Every factor is bounded by an admitted message's size: no overflow.
  const int64_t bytes =
      (spec.num_heads * weights + spec.num_layers * spec.num_heads * 8 +
       (return_attention ? spec.num_layers * spec.num_heads * first : 0)) *
      static_cast<int64_t>(sizeof(float));
  if (work->reserved_bytes + bytes > limits.max_work_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "head statistics need ", work->reserved_bytes + bytes,
        " bytes of working memory (each layer's attention weights: num_heads * sum(L^2) "
        "floats), over max_queue_bytes=",
        limits.max_work_bytes, "; send fewer or shorter sequences"));
  }
  work->reserved_bytes += bytes;
  work->head_statistics = true;
  work->return_attention = return_attention;
  return absl::OkStatus();
}

void FillEncoderStatistics(EncoderWork& work, const core::EncoderSpec& spec,
                           const std::string& model_name,
                           const core::Tokenizer* tokenizer,
                           v1::HeadStatisticsResponse* response) {
  response->set_model(model_name);
  response->set_tokens(work.tokens());
  if (work.return_attention && !work.attention.empty()) {
    const int64_t length = work.lengths.front();
    v1::Tensor* attention = response->mutable_attention();
    attention->set_dtype(v1::DATA_TYPE_FP32);
    for (const int64_t extent : {spec.num_layers, spec.num_heads, length, length}) {
      attention->add_shape(extent);
    }
    attention->set_raw(std::move(work.attention));
    if (tokenizer != nullptr && !work.token_ids.empty()) {
      for (int64_t t = 0; t < length; ++t) {
        response->add_token_texts(std::string(tokenizer->TokenOf(work.token_ids[t])));
      }
    }
  }
  for (int64_t layer = 0; layer < spec.num_layers; ++layer) {
    const absl::Span<const int64_t> pruned = spec.PrunedHeads(layer);
    for (int64_t head = 0; head < spec.num_heads; ++head) {
      const core::EncoderHeadStatistic& figures =
          work.statistics[static_cast<size_t>(layer * spec.num_heads + head)];
      v1::HeadStatistic* entry = response->add_heads();
      entry->set_layer(layer);
      entry->set_head(head);
      entry->set_pruned(std::find(pruned.begin(), pruned.end(), head) != pruned.end());
      entry->set_mean_entropy(figures.mean_entropy);
      entry->set_mean_max_weight(figures.mean_max_weight);
      entry->set_mean_distance(figures.mean_distance);
      entry->set_share_first(figures.share_first);
      entry->set_share_last(figures.share_last);
      entry->set_share_self(figures.share_self);
      entry->set_share_previous(figures.share_previous);
    }
  }
}

void FillEncodeResponse(EncoderWork& work, const std::string& model_name,
                        const std::string& request_id, int64_t d_model,
                        v1::EncodeResponse* response) {
  const auto sequences = static_cast<int64_t>(work.lengths.size());
  if (!work.scores.empty()) {
    v1::Tensor* scores = response->mutable_scores();
    scores->set_dtype(v1::DATA_TYPE_FP32);
    scores->add_shape(sequences);
    scores->add_shape(static_cast<int64_t>(work.scores.size() / sizeof(float)) /
                      std::max<int64_t>(sequences, 1));
    scores->set_raw(std::move(work.scores));
  }
  if (!work.embedding.empty()) {
    v1::Tensor* embedding = response->mutable_embedding();
    embedding->set_dtype(v1::DATA_TYPE_FP32);
    embedding->add_shape(static_cast<int64_t>(work.lengths.size()));
    // Its width: d_model, a Dense layer's, or the dimensions asked for.
    embedding->add_shape(static_cast<int64_t>(work.embedding.size() / sizeof(float)) /
                         std::max<int64_t>(sequences, 1));
    embedding->set_raw(std::move(work.embedding));
  }
  if (work.return_hidden) {
    v1::Tensor* hidden = response->mutable_hidden();
    hidden->set_dtype(v1::DATA_TYPE_FP32);
    hidden->add_shape(work.tokens());
    hidden->add_shape(d_model);
    hidden->set_raw(std::move(work.hidden));
  }
  response->mutable_lengths()->Add(work.lengths.begin(), work.lengths.end());
  if (work.return_token_ids) {
    response->mutable_token_ids()->Add(work.token_ids.begin(), work.token_ids.end());
  }
  response->set_truncated(static_cast<int32_t>(work.truncated));
  response->set_model(model_name);
  response->set_request_id(request_id);
  response->set_queue_time_us(absl::ToInt64Microseconds(work.queue_time));
  response->set_compute_time_us(absl::ToInt64Microseconds(work.compute_time));
  response->set_batch_size(work.batch_size);
}

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

const char* HttpReason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 499:
      return "Client Closed Request";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Internal Server Error";
  }
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share the google.rpc.Code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::StatusOr<std::string> PromptNamed(absl::string_view requested,
                                        const v1::EncoderConfig* config) {
  const std::string name(requested.empty() && config != nullptr
                             ? absl::string_view(config->default_prompt_name())
                             : requested);
  if (name.empty()) return std::string();
  if (config != nullptr) {
    if (const auto it = config->prompts().find(name); it != config->prompts().end()) {
      return it->second;
    }
  }
  std::vector<std::string> names;
  if (config != nullptr) {
    for (const auto& [known, unused] : config->prompts()) names.push_back(known);
  }
  std::sort(names.begin(), names.end());
  return absl::InvalidArgumentError(absl::StrCat(
      "prompt_name \"", name.substr(0, 64), "\" is not one of the model's prompts (",
      names.empty() ? "it has none: config_sentence_transformers.json lists them"
                    : absl::StrJoin(names, ", "),
      ")"));
}

}  // namespace attnserve::server
