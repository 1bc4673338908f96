#include "server/proto_convert.h"

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/bfloat16.h"

namespace attnserve::server {

namespace {

// Far above any real sequence, low enough that products of dimensions cannot overflow.
constexpr int64_t kMaxDimension = int64_t{1} << 31;

struct TensorLayout {
  int64_t count = 1;   // sequences
  int64_t length = 0;  // tokens per sequence
};

std::string ShapeText(const v1::Tensor& tensor) {
  return absl::StrCat("[", absl::StrJoin(tensor.shape(), ", "), "]");
}

// Validates `tensor` (named `field`) as [L, d] or [n, L, d] and appends its values as
// float32 to `values`.
absl::StatusOr<TensorLayout> ReadSequences(const v1::Tensor& tensor,
                                           absl::string_view field,
                                           const core::ModelSpec& spec,
                                           int64_t max_sequence_length,
                                           std::vector<float>& values) {
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
    if (tensor.shape(i) < 1 || tensor.shape(i) > kMaxDimension) {
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
  const int64_t elements = layout.count * layout.length * width;
  const int64_t element_size = tensor.dtype() == v1::DATA_TYPE_FP32 ? 4 : 2;
  if (static_cast<int64_t>(tensor.raw().size()) != elements * element_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".raw must hold product(shape) * ", element_size, " = ",
        elements * element_size, " bytes for ", v1::DataType_Name(tensor.dtype()),
        " shape ", ShapeText(tensor), ", got ", tensor.raw().size()));
  }
  const size_t offset = values.size();
  values.resize(offset + elements);
  float* out = values.data() + offset;
  const char* raw = tensor.raw().data();
  if (tensor.dtype() == v1::DATA_TYPE_FP32) {
    std::memcpy(out, raw, elements * sizeof(float));
  } else {
    for (int64_t i = 0; i < elements; ++i) {
      uint16_t bits;
      std::memcpy(&bits, raw + 2 * i, 2);
      out[i] = core::Bf16ToFloat(bits);
    }
  }
  for (int64_t i = 0; i < elements; ++i) {
    if (!std::isfinite(out[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " must hold finite values; element ", i, " is ", out[i]));
    }
  }
  return layout;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionWork>> WorkFromRequest(
    const v1::AttendRequest& request, const core::ModelSpec& spec,
    int64_t max_sequence_length) {
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
  auto work = std::make_unique<AttentionWork>();
  absl::StatusOr<TensorLayout> query =
      ReadSequences(request.query(), "query", spec, max_sequence_length, work->query);
  if (!query.ok()) return query.status();
  work->query_lengths.assign(query->count, query->length);

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
    absl::StatusOr<TensorLayout> memory = ReadSequences(
        request.memory(), "memory", spec, max_sequence_length, work->memory);
    if (!memory.ok()) return memory.status();
    if (memory->count != query->count) {
      return absl::InvalidArgumentError(
          absl::StrCat("memory.shape[0] must equal query.shape[0]=", query->count,
                       " (one memory per query sequence), got ", memory->count));
    }
    work->memory_lengths.assign(memory->count, memory->length);
  }

  if (request.head_mask_size() > 0) {
    if (request.head_mask_size() != spec.num_heads) {
      return absl::InvalidArgumentError(
          absl::StrCat("head_mask must have num_heads=", spec.num_heads,
                       " values or none, got ", request.head_mask_size()));
    }
    for (int i = 0; i < request.head_mask_size(); ++i) {
      const float factor = request.head_mask(i);
      if (!(factor >= 0.0f && factor <= 1.0f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("head_mask[", i, "] must be in [0, 1], got ", factor));
      }
    }
    work->head_mask.assign(request.head_mask().begin(), request.head_mask().end());
  }
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

void FillResponse(const ReplyFormat& format, const AttentionWork& work,
                  const std::string& model_name, int64_t num_heads,
                  v1::AttendResponse* response) {
  v1::Tensor* output = response->mutable_output();
  output->set_dtype(format.dtype);
  output->mutable_shape()->Add(format.shape.begin(), format.shape.end());
  std::string* raw = output->mutable_raw();
  if (format.dtype == v1::DATA_TYPE_BF16) {
    raw->resize(work.output.size() * 2);
    for (size_t i = 0; i < work.output.size(); ++i) {
      const uint16_t bits = core::FloatToBf16(work.output[i]);
      std::memcpy(raw->data() + 2 * i, &bits, 2);
    }
  } else {
    raw->assign(reinterpret_cast<const char*>(work.output.data()),
                work.output.size() * sizeof(float));
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
    attention->set_raw(reinterpret_cast<const char*>(work.attention.data()),
                       work.attention.size() * sizeof(float));
  }
  response->set_model(model_name);
  response->set_request_id(format.request_id);
  response->set_queue_time_us(absl::ToInt64Microseconds(work.queue_time));
  response->set_compute_time_us(absl::ToInt64Microseconds(work.compute_time));
  response->set_batch_size(work.batch_size);
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share the google.rpc.Code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace attnserve::server
