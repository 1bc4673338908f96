// Device helpers both kernel files use (core/cuda/kernels.cu,
// core/cuda/encoder_kernels.cu): f32/bf16 loads and stores, warp reductions, and the
// grid size of a grid-stride loop. Compiled by nvcc only.
#ifndef ATTNSERVE_CORE_CUDA_DEVICE_HELPERS_CUH_
#define ATTNSERVE_CORE_CUDA_DEVICE_HELPERS_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace attnserve::core::cuda {

__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ void Store(float* p, float value) { *p = value; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float value) {
  *p = __float2bfloat16_rn(value);
}

__device__ __forceinline__ float WarpMax(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

__device__ __forceinline__ float WarpSum(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

inline int Blocks(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

}  // namespace attnserve::core::cuda

#endif  // ATTNSERVE_CORE_CUDA_DEVICE_HELPERS_CUH_
