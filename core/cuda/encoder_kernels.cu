// The encoder's kernels (declared in core/cuda/kernels.h): embeddings and residual adds
// with their LayerNorm, bias and activation, pooling.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "core/cuda/device_helpers.cuh"
#include "core/cuda/kernels.h"

namespace attnserve::core::cuda {
namespace {

constexpr int kNormThreads = 256;
constexpr int kActivationThreads = 256;
constexpr int kPoolThreads = 128;

__device__ __forceinline__ float LoadAs(const void* base, ElementType type, int64_t i) {
  return type == ElementType::kBf16 ? Load(static_cast<const __nv_bfloat16*>(base) + i)
                                    : Load(static_cast<const float*>(base) + i);
}

// The sum of `value` over the block's threads (kNormThreads), on every thread.
__device__ float BlockSum(float value, float* partial) {
  value = WarpSum(value);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // `partial` may still be read by an earlier call
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  float sum = 0.0f;
  for (int w = 0; w < kNormThreads / 32; ++w) sum += partial[w];
  return sum;
}

// LayerNorm of the row in `row` (shared, d values) into row `r` of out (and of
// out_compute, bf16, when not null), two passes over the row as the CPU's LayerNorm
// does: the mean, then the variance of the differences.
__device__ void NormRow(const float* row, int d, const float* scale, const float* shift,
                        float eps, int64_t r, float* out, void* out_compute,
                        float* partial) {
  out += r * d;
  __nv_bfloat16* narrow =
      out_compute == nullptr ? nullptr : static_cast<__nv_bfloat16*>(out_compute) + r * d;
  float sum = 0.0f;
  for (int c = threadIdx.x; c < d; c += kNormThreads) sum += row[c];
  const float mean = BlockSum(sum, partial) / static_cast<float>(d);
  float squares = 0.0f;
  for (int c = threadIdx.x; c < d; c += kNormThreads) {
    const float centered = row[c] - mean;
    squares += centered * centered;
  }
  const float variance = BlockSum(squares, partial) / static_cast<float>(d);
  const float inverse = rsqrtf(variance + eps);
  for (int c = threadIdx.x; c < d; c += kNormThreads) {
    const float value = (row[c] - mean) * inverse * scale[c] + shift[c];
    out[c] = value;
    if (narrow != nullptr) Store(narrow + c, value);
  }
}

__global__ void __launch_bounds__(kNormThreads) EmbedKernel(EmbedArgs args) {
  extern __shared__ float row[];
  __shared__ float partial[kNormThreads / 32];
  const int64_t t = blockIdx.x;
  const int d = args.d;
  const int64_t word = static_cast<int64_t>(args.ids[t]) * d;
  const float* type = args.type + static_cast<int64_t>(args.types[t]) * d;
  const float* position =
      args.position == nullptr
          ? nullptr
          : args.position + static_cast<int64_t>(args.positions[t]) * d;
  for (int c = threadIdx.x; c < d; c += kNormThreads) {
    float value = LoadAs(args.word, args.word_type, word + c) + type[c];
    if (position != nullptr) value += position[c];
    row[c] = value;
  }
  __syncthreads();
  NormRow(row, d, args.scale, args.shift, args.eps, t, args.out, args.out_compute,
          partial);
}

__global__ void __launch_bounds__(kNormThreads) AddLayerNormKernel(AddNormArgs args) {
  extern __shared__ float row[];
  __shared__ float partial[kNormThreads / 32];
  const int64_t r = blockIdx.x;
  const int d = args.d;
  const float* a = args.a + r * d;
  const float* residual = args.residual + r * d;
  // The whole row is read into shared memory before any of it is written: `out` may
  // be `residual`.
  for (int c = threadIdx.x; c < d; c += kNormThreads) {
    row[c] = a[c] + residual[c] + (args.bias == nullptr ? 0.0f : args.bias[c]);
  }
  __syncthreads();
  NormRow(row, d, args.scale, args.shift, args.eps, r, args.out, args.out_compute,
          partial);
}

__device__ __forceinline__ float Activate(float x, Activation activation) {
  switch (activation) {
    case Activation::kGeluErf:
      return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case Activation::kGeluTanh:
      return 0.5f * x *
             (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case Activation::kRelu:
      return fmaxf(x, 0.0f);
    case Activation::kNone:
      break;
  }
  return x;
}

template <typename T>
__global__ void BiasActivationKernel(T* x, const float* bias, int64_t count, int cols,
                                     Activation activation) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Store(x + i, Activate(Load(x + i) + bias[i % cols], activation));
  }
}

__global__ void PoolKernel(const float* hidden, const int32_t* cu, int d, PoolMode mode,
                           float* out) {
  const int s = blockIdx.x;
  const int c = blockIdx.y * kPoolThreads + threadIdx.x;
  if (c >= d) return;
  const int64_t first = cu[s];
  const int64_t length = cu[s + 1] - first;
  const float* rows = hidden + first * d + c;
  float* to = out + static_cast<int64_t>(s) * d + c;
  switch (mode) {
    case PoolMode::kFirst:
      *to = rows[0];
      return;
    case PoolMode::kLast:
      *to = rows[(length - 1) * d];
      return;
    case PoolMode::kMax: {
      float largest = rows[0];
      for (int64_t t = 1; t < length; ++t) largest = fmaxf(largest, rows[t * d]);
      *to = largest;
      return;
    }
    default:
      break;
  }
  const bool weighted = mode == PoolMode::kWeightedMean;
  double sum = 0.0;
  for (int64_t t = 0; t < length; ++t) {
    sum += (weighted ? static_cast<double>(t + 1) : 1.0) * rows[t * d];
  }
  const double n = static_cast<double>(length);
  const double divisor = weighted                            ? n * (n + 1.0) / 2.0
                         : mode == PoolMode::kMeanSqrtLength ? sqrt(n)
                                                             : n;
  *to = static_cast<float>(sum / divisor);
}

// One block of kNormThreads per row, the row's d floats in dynamic shared memory.
template <typename Args>
cudaError_t LaunchPerRow(void (*kernel)(Args), const Args& args, int64_t rows,
                         cudaStream_t stream) {
  if (args.d < 1 || args.d > kMaxNormWidth || rows < 1) return cudaErrorInvalidValue;
  kernel<<<static_cast<unsigned>(rows), kNormThreads,
           static_cast<size_t>(args.d) * sizeof(float), stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchEmbed(const EmbedArgs& args, cudaStream_t stream) {
  return LaunchPerRow(EmbedKernel, args, args.tokens, stream);
}

cudaError_t LaunchAddLayerNorm(const AddNormArgs& args, cudaStream_t stream) {
  return LaunchPerRow(AddLayerNormKernel, args, args.rows, stream);
}

cudaError_t LaunchBiasActivation(void* x, ElementType type, const float* bias,
                                 int64_t rows, int cols, Activation activation,
                                 cudaStream_t stream) {
  const int64_t count = rows * cols;
  if (count < 1) return cudaErrorInvalidValue;
  const int blocks = Blocks(count, kActivationThreads);
  if (type == ElementType::kBf16) {
    BiasActivationKernel<<<blocks, kActivationThreads, 0, stream>>>(
        static_cast<__nv_bfloat16*>(x), bias, count, cols, activation);
  } else {
    BiasActivationKernel<<<blocks, kActivationThreads, 0, stream>>>(
        static_cast<float*>(x), bias, count, cols, activation);
  }
  return cudaGetLastError();
}

cudaError_t LaunchPool(const float* hidden, const int32_t* cu, int sequences, int d,
                       PoolMode mode, float* out, cudaStream_t stream) {
  if (sequences < 1 || d < 1) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(sequences),
                  static_cast<unsigned>((d + kPoolThreads - 1) / kPoolThreads));
  PoolKernel<<<grid, kPoolThreads, 0, stream>>>(hidden, cu, d, mode, out);
  return cudaGetLastError();
}

}  // namespace attnserve::core::cuda
