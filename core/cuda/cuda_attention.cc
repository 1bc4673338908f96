#include "core/cuda/cuda_attention.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/device.h"
#include "core/cuda/device_common.h"
#include "core/cuda/kernels.h"
#include "core/cuda/staging.h"

namespace attnserve::core::cuda {
namespace {

class CudaAttentionImpl final : public CudaAttention {
 public:
  CudaAttentionImpl(const ModelSpec& spec, int device,
                    const CudaAttentionOptions& options)
      : spec_(spec),
        device_(device),
        options_(options),
        compute_(ComputeTypeOf(spec.precision)),
        compute_bytes_(BytesOf(compute_)) {
    gemm_.compute = compute_;
    gemm_.allow_tf32 = options.allow_tf32;
  }

  ~CudaAttentionImpl() override {
    cudaSetDevice(device_);
    if (stream() != nullptr) cudaStreamSynchronize(stream());
    for (cudaEvent_t event : events_) {
      if (event != nullptr) cudaEventDestroy(event);
    }
  }

  absl::Status Init(const AttentionWeights& weights);

  absl::Status Forward(const AttentionBatch& batch, const AttentionOptions& options,
                       absl::Span<float> output,
                       absl::Span<float> attention_weights) override;
  absl::Status HeadStatistics(const AttentionBatch& batch, bool causal,
                              absl::Span<HeadStatistic> statistics) override {
    return HeadStatisticsByForward(*this, out_bias_, batch, causal, statistics);
  }
  const ModelSpec& spec() const override { return spec_; }
  int64_t computed_heads() const override { return computed_heads_; }
  std::string device_name() const override { return absl::StrCat("cuda:", device_); }
  int64_t device_memory_bytes() const override {
    size_t total = weights_.capacity() + model_head_.capacity();
    for (const DeviceBuffer* buffer :
         {&input_, &query_, &memory_, &projected_, &key_value_, &context_, &results_,
          &scores_, &probabilities_}) {
      total += buffer->capacity();
    }
    return static_cast<int64_t>(total);
  }
  CudaTimings last_timings() const override { return timings_; }

 private:
  cudaDataType_t DataType() const { return gemm_.DataType(); }
  cublasComputeType_t ComputeType() const { return gemm_.ComputeType(); }
  // out[rows, out_width] (row stride ld_out, type out_type) = bias + in[rows, in_width]
  // W^T, W row-major [out_width, in_width] (row stride ld_weight), in the compute
  // precision, in with row stride ld_in.
  absl::Status Project(const void* in, int64_t ld_in, int64_t rows, int64_t in_width,
                       const void* weight, int64_t ld_weight, const float* bias,
                       int64_t out_width, void* out, ElementType out_type,
                       int64_t ld_out);
  absl::Status Materialized(const AttentionBatch& batch, const uint8_t* q, int64_t ldq,
                            const uint8_t* k, int64_t ldk, const uint8_t* v, int64_t ldv,
                            const float* factors, bool causal, float* weights);

  ModelSpec spec_;
  int device_;
  CudaAttentionOptions options_;
  ElementType compute_;
  int64_t compute_bytes_;
  cudaStream_t stream() const { return device_stream_.stream(); }
  Gemm gemm_;
  // Before and after the upload, the attention step, the rest, the download.
  cudaEvent_t events_[6] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};

  // The model's heads less its pruned ones, and their weights in one device block:
  // W_qkv [3 width, d] (1/sqrt(head_dim) folded into the query rows) and W_out
  // [d, width] in the compute precision, then b_qkv [3 width] and b_out [d] in f32.
  std::vector<int64_t> heads_;
  int64_t width_ = 0;
  DeviceBuffer weights_, model_head_;
  size_t qkv_weight_ = 0, out_weight_ = 0, qkv_bias_ = 0, out_bias_offset_ = 0;
  std::vector<float> out_bias_;

  PinnedBuffer host_input_, host_results_;
  DeviceBuffer input_, query_, memory_, projected_, key_value_, context_, results_,
      scores_, probabilities_;
  std::vector<float> factors_;
  int64_t computed_heads_ = 0;
  CudaTimings timings_;
  // Last, so that it goes first: its stream is drained before the buffers above are
  // freed.
  DeviceStream device_stream_;
};

absl::Status CudaAttentionImpl::Init(const AttentionWeights& weights) {
  ATTN_RETURN_IF_ERROR(device_stream_.Init(device_));
  for (cudaEvent_t& event : events_) {
    ATTN_CUDA(cudaEventCreate(&event), "create an event");
  }

  gemm_.handle = device_stream_.cublas();
  KeptHeadWeights kept = KeepHeads(spec_, weights);
  heads_ = kept.heads;
  width_ = kept.width;
  out_bias_ = weights.out_proj_bias;
  const bool narrow = compute_ == ElementType::kBf16;
  std::vector<uint8_t> host;
  qkv_weight_ = AppendAligned(kept.qkv, narrow, &host);
  out_weight_ = AppendAligned(kept.out, narrow, &host);
  qkv_bias_ = AppendAligned(kept.qkv_bias, false, &host);
  out_bias_offset_ = AppendAligned(out_bias_, false, &host);
  const size_t total = host.size();
  ATTN_ASSIGN_OR_RETURN(uint8_t * device_weights, weights_.Reserve(total));
  ATTN_CUDA(cudaMemcpy(device_weights, host.data(), total, cudaMemcpyHostToDevice),
            "upload the weights");
  std::vector<int32_t> model_head(heads_.begin(), heads_.end());
  ATTN_ASSIGN_OR_RETURN(uint8_t * device_heads,
                        model_head_.Reserve(model_head.size() * sizeof(int32_t)));
  ATTN_CUDA(cudaMemcpy(device_heads, model_head.data(),
                       model_head.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
            "upload the head map");
  // The copies above ran on the legacy stream, which the stream (non-blocking) does not
  // wait for, and a pageable copy may return before its DMA ends.
  ATTN_CUDA(cudaDeviceSynchronize(), "finish the upload");
  return absl::OkStatus();
}

absl::Status CudaAttentionImpl::Project(const void* in, int64_t ld_in, int64_t rows,
                                        int64_t in_width, const void* weight,
                                        int64_t ld_weight, const float* bias,
                                        int64_t out_width, void* out,
                                        ElementType out_type, int64_t ld_out) {
  ATTN_CUDA(LaunchFillRows(out, out_type, rows, out_width, ld_out, bias, stream()),
            "broadcast a bias");
  return gemm_.Project(in, ld_in, rows, in_width, weight, ld_weight, out_width, out,
                       out_type, ld_out, /*accumulate=*/true);
}

absl::Status CudaAttentionImpl::Materialized(const AttentionBatch& batch,
                                             const uint8_t* q, int64_t ldq,
                                             const uint8_t* k, int64_t ldk,
                                             const uint8_t* v, int64_t ldv,
                                             const float* factors, bool causal,
                                             float* weights) {
  const int64_t head_dim = spec_.head_dim();
  const int64_t heads = static_cast<int64_t>(heads_.size());
  const absl::Span<const int64_t> key_lengths =
      batch.memory_lengths.empty() ? batch.query_lengths : batch.memory_lengths;
  int64_t largest = 0;
  for (size_t s = 0; s < batch.query_lengths.size(); ++s) {
    largest = std::max(largest, batch.query_lengths[s] * key_lengths[s]);
  }
  ATTN_ASSIGN_OR_RETURN(uint8_t * scores_data,
                        scores_.Reserve(static_cast<size_t>(heads * largest) * 4));
  float* scores = reinterpret_cast<float*>(scores_data);
  // fp32 multiplies V by the scaled probabilities in `scores` itself; bf16 by a bf16
  // copy.
  uint8_t* probabilities = nullptr;
  if (compute_ == ElementType::kBf16) {
    ATTN_ASSIGN_OR_RETURN(
        probabilities, probabilities_.Reserve(static_cast<size_t>(heads * largest) * 2));
  }
  const void* probability_matrix =
      compute_ == ElementType::kBf16 ? static_cast<const void*>(probabilities) : scores;
  const float alpha = 1.0f, beta = 0.0f;
  int64_t query_row = 0, key_row = 0, weights_offset = 0;
  uint8_t* context = context_.data();
  for (size_t s = 0; s < batch.query_lengths.size(); ++s) {
    const int64_t query_length = batch.query_lengths[s];
    const int64_t key_length = key_lengths[s];
    const uint8_t* q_s = q + query_row * ldq * compute_bytes_;
    const uint8_t* k_s = k + key_row * ldk * compute_bytes_;
    const uint8_t* v_s = v + key_row * ldv * compute_bytes_;
    // scores_p = Q_p K_p^T per head p, [L_q, L_k] row-major: column-major
    // scores^T [L_k, L_q] = K_p Q_p^T.
    ATTN_CUBLAS(GetCublas().gemm_strided_batched(
                    gemm_.handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(key_length),
                    static_cast<int>(query_length), static_cast<int>(head_dim), &alpha,
                    k_s, DataType(), static_cast<int>(ldk), head_dim, q_s, DataType(),
                    static_cast<int>(ldq), head_dim, &beta, scores, CUDA_R_32F,
                    static_cast<int>(key_length), query_length * key_length,
                    static_cast<int>(heads), ComputeType(), CUBLAS_GEMM_DEFAULT),
                "compute attention scores");
    SoftmaxArgs softmax{scores,
                        compute_,
                        probabilities,
                        weights == nullptr ? nullptr : weights + weights_offset,
                        factors,
                        reinterpret_cast<const int32_t*>(model_head_.data()),
                        static_cast<int>(heads),
                        query_length,
                        key_length,
                        causal};
    ATTN_CUDA(LaunchSoftmax(softmax, stream()), "run the softmax");
    // context_p [L_q, head_dim] = P_p V_p: column-major context^T = V_p^T P_p^T.
    ATTN_CUBLAS(GetCublas().gemm_strided_batched(
                    gemm_.handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(head_dim),
                    static_cast<int>(query_length), static_cast<int>(key_length), &alpha,
                    v_s, DataType(), static_cast<int>(ldv), head_dim, probability_matrix,
                    DataType(), static_cast<int>(key_length), query_length * key_length,
                    &beta, context + query_row * width_ * compute_bytes_, DataType(),
                    static_cast<int>(width_), head_dim, static_cast<int>(heads),
                    ComputeType(), CUBLAS_GEMM_DEFAULT),
                "compute attention context");
    query_row += query_length;
    key_row += key_length;
    weights_offset += spec_.num_heads * query_length * key_length;
  }
  return absl::OkStatus();
}

absl::Status CudaAttentionImpl::Forward(const AttentionBatch& batch,
                                        const AttentionOptions& options,
                                        absl::Span<float> output,
                                        absl::Span<float> attention_weights) {
  ATTN_RETURN_IF_ERROR(
      CheckForwardArguments(spec_, batch, options, output, attention_weights));
  if (!options.relative_bias.empty()) {
    return absl::UnimplementedError(
        "relative_bias is not implemented on CUDA devices yet (the CPU backend has it)");
  }
  if (!options.rotary.empty()) {
    return absl::UnimplementedError(
        "rotary is not implemented on CUDA devices yet (the CPU backend has it)");
  }
  if (options.window != 0) {
    return absl::UnimplementedError(
        "window is not implemented on CUDA devices yet (the CPU backend has it)");
  }
  ATTN_CUDA(cudaSetDevice(device_), absl::StrCat("select device cuda:", device_));
  const int64_t d = spec_.d_model;
  const int64_t head_dim = spec_.head_dim();
  const int64_t heads = static_cast<int64_t>(heads_.size());
  factors_.assign(heads_.size(), 1.0f);
  int64_t computed = heads;
  if (!options.head_mask.empty()) {
    computed = 0;
    for (size_t p = 0; p < heads_.size(); ++p) {
      factors_[p] = options.head_mask[heads_[p]];
      if (factors_[p] != 0.0f) ++computed;
    }
  }
  ATTN_ASSIGN_OR_RETURN(const StagingLayout layout, PlanStaging(batch, d, heads));
  const int64_t query_tokens = layout.query_tokens;
  const int64_t key_tokens = layout.key_tokens;
  const bool cross = layout.memory_bytes > 0;

  // Inputs: one host-to-device copy of the packed staging buffer.
  ATTN_ASSIGN_OR_RETURN(uint8_t * staging, host_input_.Reserve(layout.total_bytes));
  PackStaging(batch, layout, factors_, staging);
  ATTN_ASSIGN_OR_RETURN(uint8_t * input, input_.Reserve(layout.total_bytes));
  ATTN_CUDA(cudaEventRecord(events_[0], stream()), "record an event");
  ATTN_CUDA(cudaMemcpyAsync(input, staging, layout.total_bytes, cudaMemcpyHostToDevice,
                            stream()),
            "upload the batch");
  ATTN_CUDA(cudaEventRecord(events_[1], stream()), "record an event");
  const auto* factors = reinterpret_cast<const float*>(input + layout.factors);

  // Tokens in the compute precision: as they came, or converted on the device.
  const auto in_compute = [&](size_t offset, bool is_bf16, int64_t tokens,
                              DeviceBuffer& buffer) -> absl::StatusOr<const uint8_t*> {
    const ElementType given = is_bf16 ? ElementType::kBf16 : ElementType::kF32;
    if (given == compute_) return input + offset;
    ATTN_ASSIGN_OR_RETURN(
        uint8_t * converted,
        buffer.Reserve(static_cast<size_t>(tokens * d) * compute_bytes_));
    ATTN_CUDA(
        LaunchConvert(input + offset, given, converted, compute_, tokens * d, stream()),
        "convert the tokens");
    return converted;
  };
  ATTN_ASSIGN_OR_RETURN(const uint8_t* x, in_compute(layout.query, layout.query_bf16,
                                                     query_tokens, query_));
  const uint8_t* w = weights_.data();
  const auto* qkv_bias = reinterpret_cast<const float*>(w + qkv_bias_);
  const uint8_t *q, *k, *v;
  int64_t ldq, ldk, ldv;
  if (!cross) {
    // [Q K V] = x W_qkv^T + b_qkv in one product.
    ATTN_ASSIGN_OR_RETURN(
        uint8_t * projected,
        projected_.Reserve(static_cast<size_t>(query_tokens * 3 * width_) *
                           compute_bytes_));
    ATTN_RETURN_IF_ERROR(Project(x, d, query_tokens, d, w + qkv_weight_, d, qkv_bias,
                                 3 * width_, projected, compute_, 3 * width_));
    q = projected;
    k = projected + width_ * compute_bytes_;
    v = projected + 2 * width_ * compute_bytes_;
    ldq = ldk = ldv = 3 * width_;
  } else {
    ATTN_ASSIGN_OR_RETURN(const uint8_t* m, in_compute(layout.memory, layout.memory_bf16,
                                                       key_tokens, memory_));
    ATTN_ASSIGN_OR_RETURN(
        uint8_t * projected,
        projected_.Reserve(static_cast<size_t>(query_tokens * width_) * compute_bytes_));
    ATTN_ASSIGN_OR_RETURN(
        uint8_t * key_value,
        key_value_.Reserve(static_cast<size_t>(key_tokens * 2 * width_) *
                           compute_bytes_));
    ATTN_RETURN_IF_ERROR(Project(x, d, query_tokens, d, w + qkv_weight_, d, qkv_bias,
                                 width_, projected, compute_, width_));
    ATTN_RETURN_IF_ERROR(
        Project(m, d, key_tokens, d, w + qkv_weight_ + width_ * d * compute_bytes_, d,
                qkv_bias + width_, 2 * width_, key_value, compute_, 2 * width_));
    q = projected;
    k = key_value;
    v = key_value + width_ * compute_bytes_;
    ldq = width_;
    ldk = ldv = 2 * width_;
  }

  // Results: output [tokens, d] then the attention weights, f32, one download.
  const size_t output_bytes = static_cast<size_t>(query_tokens * d) * sizeof(float);
  const size_t results_bytes = output_bytes + attention_weights.size() * sizeof(float);
  ATTN_ASSIGN_OR_RETURN(uint8_t * results, results_.Reserve(results_bytes));
  float* weights_out = attention_weights.empty()
                           ? nullptr
                           : reinterpret_cast<float*>(results + output_bytes);
  if (weights_out != nullptr && heads < spec_.num_heads) {
    // The pruned heads' rows stay zero; the softmax writes every other one.
    ATTN_CUDA(cudaMemsetAsync(weights_out, 0, attention_weights.size() * sizeof(float),
                              stream()),
              "clear the attention weights");
  }
  ATTN_RETURN_IF_ERROR(
      context_.Reserve(static_cast<size_t>(query_tokens * width_) * compute_bytes_)
          .status());
  FusedAttentionArgs args{compute_,
                          q,
                          ldq,
                          k,
                          ldk,
                          v,
                          ldv,
                          context_.data(),
                          width_,
                          reinterpret_cast<const int32_t*>(input + layout.cu_query),
                          reinterpret_cast<const int32_t*>(input + layout.cu_key),
                          factors,
                          layout.sequences,
                          static_cast<int>(heads),
                          static_cast<int>(head_dim),
                          static_cast<int>(layout.max_query_length),
                          options.causal};
  using Path = CudaAttentionOptions::AttentionPath;
  const bool long_sequences =
      layout.max_query_length * layout.max_key_length >= options_.materialize_min_scores;
  Path path = options_.path;
  if (path == Path::kTensorCore && !TensorCoreAttentionFits(args)) path = Path::kAuto;
  if (path == Path::kAuto) {
    // Measured on an H200 (tests/gpu/device_check.sh): the tensor-core kernel beats
    // the other paths at every length; in f32, the fused kernel wins below about
    // 256 x 256 scores per head and cuBLAS over materialized scores above.
    path = TensorCoreAttentionFits(args) ? Path::kTensorCore
           : long_sequences              ? Path::kMaterialized
                                         : Path::kFused;
  }
  // Attention weights need the scores; the fused kernel takes heads up to 256 wide.
  if (weights_out != nullptr || (path == Path::kFused && head_dim > kFusedMaxHeadDim)) {
    path = Path::kMaterialized;
  }
  ATTN_CUDA(cudaEventRecord(events_[2], stream()), "record an event");
  if (path == Path::kTensorCore) {
    using Kernel = CudaAttentionOptions::TensorCoreKernel;
    const TensorCoreVariant variant =
        options_.tensor_core_kernel == Kernel::kLdmatrixV ? TensorCoreVariant::kLdmatrixV
        : options_.tensor_core_kernel == Kernel::kLdmatrixV8Warps
            ? TensorCoreVariant::kLdmatrixV8Warps
            : TensorCoreVariant::kTransposedV;
    ATTN_CUDA(LaunchTensorCoreAttention(args, stream(), variant),
              "run tensor-core attention");
  } else if (path == Path::kFused) {
    ATTN_CUDA(LaunchFusedAttention(args, stream()), "run fused attention");
  } else {
    ATTN_RETURN_IF_ERROR(Materialized(batch, q, ldq, k, ldk, v, ldv, factors,
                                      options.causal, weights_out));
  }
  ATTN_CUDA(cudaEventRecord(events_[3], stream()), "record an event");
  // out = context W_out^T + b_out, in f32.
  ATTN_RETURN_IF_ERROR(Project(context_.data(), width_, query_tokens, width_,
                               w + out_weight_, width_,
                               reinterpret_cast<const float*>(w + out_bias_offset_), d,
                               results, ElementType::kF32, d));
  ATTN_CUDA(cudaEventRecord(events_[4], stream()), "record an event");
  ATTN_ASSIGN_OR_RETURN(uint8_t * host_results, host_results_.Reserve(results_bytes));
  ATTN_CUDA(cudaMemcpyAsync(host_results, results, results_bytes, cudaMemcpyDeviceToHost,
                            stream()),
            "download the results");
  ATTN_CUDA(cudaEventRecord(events_[5], stream()), "record an event");
  ATTN_CUDA(cudaStreamSynchronize(stream()), "run the batch");
  std::memcpy(output.data(), host_results, output_bytes);
  if (!attention_weights.empty()) {
    std::memcpy(attention_weights.data(), host_results + output_bytes,
                attention_weights.size() * sizeof(float));
  }
  const auto elapsed = [&](int from, int to) -> absl::StatusOr<double> {
    float milliseconds = 0.0f;
    ATTN_CUDA(cudaEventElapsedTime(&milliseconds, events_[from], events_[to]),
              "read an event");
    return milliseconds;
  };
  ATTN_ASSIGN_OR_RETURN(timings_.upload_ms, elapsed(0, 1));
  ATTN_ASSIGN_OR_RETURN(timings_.compute_ms, elapsed(1, 4));
  ATTN_ASSIGN_OR_RETURN(timings_.attention_ms, elapsed(2, 3));
  ATTN_ASSIGN_OR_RETURN(timings_.download_ms, elapsed(4, 5));
  computed_heads_ = computed;
  return absl::OkStatus();
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the error for later calls
    return 0;
  }
  return count;
}

std::string CudaDeviceDescription(int index) {
  cudaDeviceProp properties;
  const cudaError_t error = cudaGetDeviceProperties(&properties, index);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::StrCat("cuda:", index, ": ", cudaGetErrorString(error));
  }
  return absl::StrFormat("%s, compute capability %d.%d, %d MiB, %d multiprocessors",
                         properties.name, properties.major, properties.minor,
                         static_cast<int>(properties.totalGlobalMem >> 20),
                         properties.multiProcessorCount);
}

absl::StatusOr<std::unique_ptr<CudaAttention>> CreateCudaAttention(
    const ModelSpec& spec, const AttentionWeights& weights, int device_index,
    const CudaAttentionOptions& options) {
  ATTN_RETURN_IF_ERROR(spec.Validate());
  ATTN_RETURN_IF_ERROR(weights.CheckShapes(spec));
  if (spec.precision == Precision::kInt8) {
    return Int8IsCpuOnly(Device{DeviceKind::kCuda, device_index});
  }
  if (spec.num_kv_heads > 0 || spec.qk_norm || spec.head_size > 0) {
    return absl::UnimplementedError(
        absl::StrCat(spec.num_kv_heads > 0 ? "grouped-query attention (num_kv_heads)"
                     : spec.qk_norm        ? "qk_norm"
                                           : "head_size",
                     " is not implemented on CUDA devices yet (the CPU backend has it)"));
  }
  if (options.materialize_min_scores < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "materialize_min_scores must be >= 1, got ", options.materialize_min_scores));
  }
  ATTN_RETURN_IF_ERROR(CheckCudaDevice(device_index));
  auto attention = std::make_unique<CudaAttentionImpl>(spec, device_index, options);
  ATTN_RETURN_IF_ERROR(attention->Init(weights));
  return std::unique_ptr<CudaAttention>(std::move(attention));
}

}  // namespace attnserve::core::cuda
