#include <cuda_bf16.h>
#include <mma.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "core/cuda/kernels.h"

namespace attnserve::core::cuda {
namespace {

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

int Blocks(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

template <typename In, typename Out>
__global__ void ConvertKernel(const In* in, Out* out, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Store(out + i, Load(in + i));
  }
}

// One block row per matrix row (grid.y, strided), threads across its columns: no
// division per element.
template <typename T>
__global__ void FillRowsKernel(T* out, int64_t rows, int64_t cols, int64_t ld,
                               const float* bias) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (col >= cols) return;
  const float value = bias[col];
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    Store(out + row * ld + col, value);
  }
}

// Fused attention: a block of kWarps warps takes kRowsPerWarp query rows each
// (kBlockRows rows of one head of one sequence) and walks the keys in tiles of kTile,
// kept in shared memory as f32 with the query rows. For each tile, lane j scores key j
// against a row; the running maximum, sum and output accumulator are rescaled as in
// flash attention (online softmax), so scores are never stored. Each lane owns the
// output columns lane, lane + 32, ... of its rows.
constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kBlockRows = kWarps * kRowsPerWarp;
constexpr int kTile = 32;

template <int kMaxHeadDim>
constexpr size_t FusedSharedBytes() {
  // Query rows [kBlockRows][kMaxHeadDim], keys [kTile][kMaxHeadDim + 1] (padded so that
  // lane j's reads of row j fall in different banks), values [kTile][kMaxHeadDim].
  return sizeof(float) *
         (kBlockRows * kMaxHeadDim + kTile * (kMaxHeadDim + 1) + kTile * kMaxHeadDim);
}

template <typename T, int kMaxHeadDim>
__global__ void __launch_bounds__(kWarps * 32)
    FusedAttentionKernel(const T* __restrict__ q, int64_t ldq, const T* __restrict__ k,
                         int64_t ldk, const T* __restrict__ v, int64_t ldv,
                         T* __restrict__ ctx, int64_t ldc, const int32_t* cu_query,
                         const int32_t* cu_key, const float* factors, int head_dim,
                         bool causal) {
  constexpr int kColumns = kMaxHeadDim / 32;
  extern __shared__ float shared[];
  float* query_rows = shared;
  float* key_tile = query_rows + kBlockRows * kMaxHeadDim;
  float* value_tile = key_tile + kTile * (kMaxHeadDim + 1);

  const int sequence = blockIdx.z;
  const int head = blockIdx.y;
  const int64_t query_start = cu_query[sequence];
  const int query_length = cu_query[sequence + 1] - cu_query[sequence];
  const int64_t key_start = cu_key[sequence];
  const int key_length = cu_key[sequence + 1] - cu_key[sequence];
  const int first_row = blockIdx.x * kBlockRows;
  if (first_row >= query_length) return;
  const int block_rows = min(kBlockRows, query_length - first_row);
  const float factor = factors[head];
  const int64_t column = static_cast<int64_t>(head) * head_dim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (factor == 0.0f) {
    for (int i = threadIdx.x; i < block_rows * head_dim; i += blockDim.x) {
      Store(ctx + (query_start + first_row + i / head_dim) * ldc + column + i % head_dim,
            0.0f);
    }
    return;
  }
  for (int i = threadIdx.x; i < kBlockRows * head_dim; i += blockDim.x) {
    const int row = i / head_dim, c = i % head_dim;
    query_rows[row * kMaxHeadDim + c] =
        row < block_rows ? Load(q + (query_start + first_row + row) * ldq + column + c)
                         : 0.0f;
  }

  float running_max[kRowsPerWarp], running_sum[kRowsPerWarp];
  float accumulator[kRowsPerWarp][kColumns];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    running_max[r] = -FLT_MAX;
    running_sum[r] = 0.0f;
    for (int t = 0; t < kColumns; ++t) accumulator[r][t] = 0.0f;
  }
  const int key_end = causal ? min(key_length, first_row + block_rows) : key_length;
  for (int tile = 0; tile < key_end; tile += kTile) {
    __syncthreads();
    for (int i = threadIdx.x; i < kTile * head_dim; i += blockDim.x) {
      const int j = i / head_dim, c = i % head_dim;
      const bool inside = tile + j < key_end;
      const int64_t row = key_start + tile + j;
      key_tile[j * (kMaxHeadDim + 1) + c] =
          inside ? Load(k + row * ldk + column + c) : 0.0f;
      value_tile[j * kMaxHeadDim + c] = inside ? Load(v + row * ldv + column + c) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int local_row = warp * kRowsPerWarp + r;
      if (local_row >= block_rows) continue;  // warp-uniform
      const int row = first_row + local_row;
      const int j = tile + lane;
      const bool valid = j < key_end && (!causal || j <= row);
      float score = -FLT_MAX;
      if (valid) {
        const float* qr = query_rows + local_row * kMaxHeadDim;
        const float* kr = key_tile + lane * (kMaxHeadDim + 1);
        float dot = 0.0f;
        for (int c = 0; c < head_dim; ++c) dot = fmaf(qr[c], kr[c], dot);
        score = dot;
      }
      const float tile_max = WarpMax(score);
      const float new_max = fmaxf(running_max[r], tile_max);
      const float p = valid ? expf(score - new_max) : 0.0f;
      const float correction = expf(running_max[r] - new_max);
      running_sum[r] = running_sum[r] * correction + WarpSum(p);
      running_max[r] = new_max;
      float sums[kColumns];
#pragma unroll
      for (int t = 0; t < kColumns; ++t) sums[t] = accumulator[r][t] * correction;
      const int keys = min(kTile, key_end - tile);
      for (int jj = 0; jj < keys; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
        const float* vr = value_tile + jj * kMaxHeadDim + lane;
#pragma unroll
        for (int t = 0; t < kColumns; ++t) sums[t] = fmaf(pj, vr[32 * t], sums[t]);
      }
#pragma unroll
      for (int t = 0; t < kColumns; ++t) accumulator[r][t] = sums[t];
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int local_row = warp * kRowsPerWarp + r;
    if (local_row >= block_rows) continue;
    const float scale = factor / running_sum[r];
    T* out = ctx + (query_start + first_row + local_row) * ldc + column;
#pragma unroll
    for (int t = 0; t < kColumns; ++t) {
      const int c = lane + 32 * t;
      if (c < head_dim) Store(out + c, accumulator[r][t] * scale);
    }
  }
}

template <typename T, int kMaxHeadDim>
cudaError_t LaunchFusedFor(const FusedAttentionArgs& args, cudaStream_t stream) {
  constexpr size_t kShared = FusedSharedBytes<kMaxHeadDim>();
  auto* kernel = &FusedAttentionKernel<T, kMaxHeadDim>;
  if (kShared > 48 * 1024) {
    const cudaError_t error = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kShared));
    if (error != cudaSuccess) return error;
  }
  const int row_blocks = (args.max_query_length + kBlockRows - 1) / kBlockRows;
  // gridDim.z holds at most 65535 sequences per launch.
  for (int first = 0; first < args.sequences; first += 65535) {
    const int count = min(65535, args.sequences - first);
    kernel<<<dim3(row_blocks, args.heads, count), kWarps * 32, kShared, stream>>>(
        static_cast<const T*>(args.q), args.ldq, static_cast<const T*>(args.k), args.ldk,
        static_cast<const T*>(args.v), args.ldv, static_cast<T*>(args.ctx), args.ldc,
        args.cu_query + first, args.cu_key + first, args.factors, args.head_dim,
        args.causal);
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) return error;
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t LaunchFusedTyped(const FusedAttentionArgs& args, cudaStream_t stream) {
  if (args.head_dim <= 32) return LaunchFusedFor<T, 32>(args, stream);
  if (args.head_dim <= 64) return LaunchFusedFor<T, 64>(args, stream);
  if (args.head_dim <= 128) return LaunchFusedFor<T, 128>(args, stream);
  return LaunchFusedFor<T, 256>(args, stream);
}

// Tensor-core flash attention (bf16). A block of 4 warps takes 64 query rows of one
// head of one sequence, 16 per warp, and walks the keys in tiles of 64:
//   S_w = Q_w K_tile^T               (WMMA, f32, into shared memory)
//   online softmax over S_w's rows   (two lanes per row, f32)
//   O_w = O_w * correction + P_w V    (WMMA; O_w kept in shared memory as f32, since a
//                                     fragment's element-to-row mapping is opaque)
// Columns past head_dim are zero-padded up to kHeadDim.
namespace wmma = nvcuda::wmma;
constexpr int kTcRows = 64;
constexpr int kTcKeys = 64;
constexpr int kTcWarpRows = 16;

template <int kHeadDim>
constexpr size_t TensorCoreSharedBytes() {
  return 2 * (kTcRows + 2 * kTcKeys) * kHeadDim  // Q, K, V tiles (bf16)
         + 4 * 4 * kTcWarpRows * kTcKeys         // S per warp (f32)
         + 2 * 4 * kTcWarpRows * kTcKeys         // P per warp (bf16)
         + 4 * 4 * kTcWarpRows * kHeadDim;       // O per warp (f32)
}

template <int kHeadDim>
__device__ __forceinline__ void LoadTile(const __nv_bfloat16* source, int64_t ld,
                                         int64_t first, int rows, int head_dim,
                                         __nv_bfloat16* tile, int tile_rows) {
  constexpr int kVectors = kHeadDim / 8;
  for (int i = threadIdx.x; i < tile_rows * kVectors; i += blockDim.x) {
    const int row = i / kVectors, c = (i % kVectors) * 8;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (row < rows && c < head_dim) {
      value = *reinterpret_cast<const uint4*>(source + (first + row) * ld + c);
    }
    *reinterpret_cast<uint4*>(tile + row * kHeadDim + c) = value;
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(128)
    TensorCoreAttentionKernel(const __nv_bfloat16* __restrict__ q, int64_t ldq,
                              const __nv_bfloat16* __restrict__ k, int64_t ldk,
                              const __nv_bfloat16* __restrict__ v, int64_t ldv,
                              __nv_bfloat16* __restrict__ ctx, int64_t ldc,
                              const int32_t* cu_query, const int32_t* cu_key,
                              const float* factors, int head_dim, bool causal) {
  extern __shared__ __align__(128) unsigned char shared_bytes[];
  auto* q_tile = reinterpret_cast<__nv_bfloat16*>(shared_bytes);
  __nv_bfloat16* k_tile = q_tile + kTcRows * kHeadDim;
  __nv_bfloat16* v_tile = k_tile + kTcKeys * kHeadDim;
  auto* s_all = reinterpret_cast<float*>(v_tile + kTcKeys * kHeadDim);
  auto* p_all = reinterpret_cast<__nv_bfloat16*>(s_all + 4 * kTcWarpRows * kTcKeys);
  auto* o_all = reinterpret_cast<float*>(p_all + 4 * kTcWarpRows * kTcKeys);

  const int sequence = blockIdx.z;
  const int head = blockIdx.y;
  const int64_t query_start = cu_query[sequence];
  const int query_length = cu_query[sequence + 1] - cu_query[sequence];
  const int64_t key_start = cu_key[sequence];
  const int key_length = cu_key[sequence + 1] - cu_key[sequence];
  const int first_row = blockIdx.x * kTcRows;
  if (first_row >= query_length) return;
  const int block_rows = min(kTcRows, query_length - first_row);
  const float factor = factors[head];
  const int64_t column = static_cast<int64_t>(head) * head_dim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (factor == 0.0f) {
    for (int i = threadIdx.x; i < block_rows * head_dim; i += blockDim.x) {
      ctx[(query_start + first_row + i / head_dim) * ldc + column + i % head_dim] =
          __float2bfloat16_rn(0.0f);
    }
    return;
  }
  LoadTile<kHeadDim>(q + column, ldq, query_start + first_row, block_rows, head_dim,
                     q_tile, kTcRows);
  float* s_warp = s_all + warp * kTcWarpRows * kTcKeys;
  __nv_bfloat16* p_warp = p_all + warp * kTcWarpRows * kTcKeys;
  float* o_warp = o_all + warp * kTcWarpRows * kHeadDim;
  for (int i = lane; i < kTcWarpRows * kHeadDim; i += 32) o_warp[i] = 0.0f;

  // Each lane keeps every row's running maximum and sum (rows are walked in turn, the
  // lanes across a row's keys and columns: consecutive addresses, no bank conflicts).
  float running_max[kTcWarpRows], running_sum[kTcWarpRows];
#pragma unroll
  for (int r = 0; r < kTcWarpRows; ++r) {
    running_max[r] = -INFINITY;
    running_sum[r] = 0.0f;
  }
  const int warp_first_row = first_row + warp * kTcWarpRows;
  const int key_end = causal ? min(key_length, first_row + block_rows) : key_length;
  for (int tile = 0; tile < key_end; tile += kTcKeys) {
    __syncthreads();
    const int keys = min(kTcKeys, key_end - tile);
    LoadTile<kHeadDim>(k + column, ldk, key_start + tile, keys, head_dim, k_tile,
                       kTcKeys);
    LoadTile<kHeadDim>(v + column, ldv, key_start + tile, keys, head_dim, v_tile,
                       kTcKeys);
    __syncthreads();
    // S_w = Q_w K^T: K row-major [key][c] is K^T column-major.
#pragma unroll
    for (int n = 0; n < kTcKeys / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> scores;
      wmma::fill_fragment(scores, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
        wmma::load_matrix_sync(a, q_tile + warp * kTcWarpRows * kHeadDim + kk * 16,
                               kHeadDim);
        wmma::load_matrix_sync(b, k_tile + n * 16 * kHeadDim + kk * 16, kHeadDim);
        wmma::mma_sync(scores, a, b, scores);
      }
      wmma::store_matrix_sync(s_warp + n * 16, scores, kTcKeys, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < kTcWarpRows; ++r) {
      const int row = warp_first_row + r;
      float score[kTcKeys / 32];
      float tile_max = -INFINITY;
#pragma unroll
      for (int h = 0; h < kTcKeys / 32; ++h) {
        const int j = tile + lane + 32 * h;
        const bool valid = j < key_end && (!causal || j <= row);
        score[h] = valid ? s_warp[r * kTcKeys + lane + 32 * h] : -INFINITY;
        tile_max = fmaxf(tile_max, score[h]);
      }
      tile_max = WarpMax(tile_max);
      const float new_max = fmaxf(running_max[r], tile_max);
      const float correction =
          running_max[r] == -INFINITY ? 0.0f : expf(running_max[r] - new_max);
      float sum = 0.0f;
#pragma unroll
      for (int h = 0; h < kTcKeys / 32; ++h) {
        const float p = score[h] == -INFINITY ? 0.0f : expf(score[h] - new_max);
        p_warp[r * kTcKeys + lane + 32 * h] = __float2bfloat16_rn(p);
        sum += p;
      }
      running_sum[r] = running_sum[r] * correction + WarpSum(sum);
      running_max[r] = new_max;
#pragma unroll
      for (int c = lane; c < kHeadDim; c += 32) o_warp[r * kHeadDim + c] *= correction;
    }
    __syncwarp();
    // O_w += P_w V
#pragma unroll
    for (int n = 0; n < kHeadDim / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> out;
      wmma::load_matrix_sync(out, o_warp + n * 16, kHeadDim, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kTcKeys / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
        wmma::load_matrix_sync(a, p_warp + kk * 16, kTcKeys);
        wmma::load_matrix_sync(b, v_tile + kk * 16 * kHeadDim + n * 16, kHeadDim);
        wmma::mma_sync(out, a, b, out);
      }
      wmma::store_matrix_sync(o_warp + n * 16, out, kHeadDim, wmma::mem_row_major);
    }
    __syncwarp();
  }
#pragma unroll
  for (int r = 0; r < kTcWarpRows; ++r) {
    if (warp * kTcWarpRows + r >= block_rows) continue;
    const float scale = factor / running_sum[r];
    __nv_bfloat16* out = ctx + (query_start + warp_first_row + r) * ldc + column;
    for (int c = lane; c < head_dim; c += 32) {
      out[c] = __float2bfloat16_rn(o_warp[r * kHeadDim + c] * scale);
    }
  }
}

template <int kHeadDim>
cudaError_t LaunchTensorCoreFor(const FusedAttentionArgs& args, cudaStream_t stream) {
  constexpr size_t kShared = TensorCoreSharedBytes<kHeadDim>();
  auto* kernel = &TensorCoreAttentionKernel<kHeadDim>;
  const cudaError_t error = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kShared));
  if (error != cudaSuccess) return error;
  const int row_blocks = (args.max_query_length + kTcRows - 1) / kTcRows;
  for (int first = 0; first < args.sequences; first += 65535) {
    const int count = min(65535, args.sequences - first);
    kernel<<<dim3(row_blocks, args.heads, count), 128, kShared, stream>>>(
        static_cast<const __nv_bfloat16*>(args.q), args.ldq,
        static_cast<const __nv_bfloat16*>(args.k), args.ldk,
        static_cast<const __nv_bfloat16*>(args.v), args.ldv,
        static_cast<__nv_bfloat16*>(args.ctx), args.ldc, args.cu_query + first,
        args.cu_key + first, args.factors, args.head_dim, args.causal);
    const cudaError_t launched = cudaGetLastError();
    if (launched != cudaSuccess) return launched;
  }
  return cudaSuccess;
}

// One block per (row, head) of one sequence's scores.
constexpr int kSoftmaxThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kSoftmaxThreads)
    SoftmaxKernel(float* scores, T* probabilities, float* weights, const float* factors,
                  const int32_t* model_head, int64_t query_length, int64_t key_length,
                  bool causal) {
  __shared__ float partial[kSoftmaxThreads / 32];
  const int64_t row = blockIdx.x;
  const int head = blockIdx.y;
  const int64_t offset = (static_cast<int64_t>(head) * query_length + row) * key_length;
  float* s = scores + offset;
  const int64_t valid = causal ? row + 1 : key_length;
  const float factor = factors[head];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  float largest = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x)
    largest = fmaxf(largest, s[j]);
  largest = WarpMax(largest);
  if (lane == 0) partial[warp] = largest;
  __syncthreads();
  largest = partial[0];
  for (int w = 1; w < kSoftmaxThreads / 32; ++w) largest = fmaxf(largest, partial[w]);
  __syncthreads();
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) sum += expf(s[j] - largest);
  sum = WarpSum(sum);
  if (lane == 0) partial[warp] = sum;
  __syncthreads();
  sum = 0.0f;
  for (int w = 0; w < kSoftmaxThreads / 32; ++w) sum += partial[w];
  const float inverse = 1.0f / sum;
  float* w_row =
      weights == nullptr
          ? nullptr
          : weights + (static_cast<int64_t>(model_head[head]) * query_length + row) *
                          key_length;
  T* p_row = probabilities == nullptr ? nullptr : probabilities + offset;
  for (int64_t j = threadIdx.x; j < key_length; j += blockDim.x) {
    const float p = j < valid ? expf(s[j] - largest) * inverse : 0.0f;
    s[j] = p * factor;
    if (p_row != nullptr) Store(p_row + j, p * factor);
    if (w_row != nullptr) w_row[j] = factor == 0.0f ? 0.0f : p;
  }
}

}  // namespace

cudaError_t LaunchConvert(const void* in, ElementType from, void* out, ElementType to,
                          int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int blocks = Blocks(count, 256);
  if (from == ElementType::kF32 && to == ElementType::kBf16) {
    ConvertKernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(in),
                                              static_cast<__nv_bfloat16*>(out), count);
  } else if (from == ElementType::kBf16 && to == ElementType::kF32) {
    ConvertKernel<<<blocks, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(in),
                                              static_cast<float*>(out), count);
  } else {
    return cudaMemcpyAsync(out, in, count * (from == ElementType::kF32 ? 4 : 2),
                           cudaMemcpyDeviceToDevice, stream);
  }
  return cudaGetLastError();
}

cudaError_t LaunchFillRows(void* out, ElementType type, int64_t rows, int64_t cols,
                           int64_t ld, const float* bias, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((cols + 255) / 256),
                  static_cast<unsigned>(rows < 65535 ? rows : 65535));
  if (type == ElementType::kF32) {
    FillRowsKernel<<<grid, 256, 0, stream>>>(static_cast<float*>(out), rows, cols, ld,
                                             bias);
  } else {
    FillRowsKernel<<<grid, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(out), rows, cols,
                                             ld, bias);
  }
  return cudaGetLastError();
}

cudaError_t LaunchFusedAttention(const FusedAttentionArgs& args, cudaStream_t stream) {
  if (args.head_dim < 1 || args.head_dim > kFusedMaxHeadDim) return cudaErrorInvalidValue;
  return args.type == ElementType::kF32 ? LaunchFusedTyped<float>(args, stream)
                                        : LaunchFusedTyped<__nv_bfloat16>(args, stream);
}

bool TensorCoreAttentionFits(const FusedAttentionArgs& args) {
  const auto aligned = [](const void* pointer) {
    return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
  };
  return args.type == ElementType::kBf16 && args.head_dim % 16 == 0 &&
         args.head_dim <= 128 && args.ldq % 8 == 0 && args.ldk % 8 == 0 &&
         args.ldv % 8 == 0 && aligned(args.q) && aligned(args.k) && aligned(args.v);
}

cudaError_t LaunchTensorCoreAttention(const FusedAttentionArgs& args,
                                      cudaStream_t stream) {
  if (!TensorCoreAttentionFits(args)) return cudaErrorInvalidValue;
  return args.head_dim <= 64 ? LaunchTensorCoreFor<64>(args, stream)
                             : LaunchTensorCoreFor<128>(args, stream);
}

cudaError_t LaunchSoftmax(const SoftmaxArgs& args, cudaStream_t stream) {
  if (args.query_length > 2147483647 || args.heads > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(args.query_length), args.heads);
  if (args.type == ElementType::kF32) {
    SoftmaxKernel<<<grid, kSoftmaxThreads, 0, stream>>>(
        args.scores, static_cast<float*>(args.probabilities), args.weights, args.factors,
        args.model_head, args.query_length, args.key_length, args.causal);
  } else {
    SoftmaxKernel<<<grid, kSoftmaxThreads, 0, stream>>>(
        args.scores, static_cast<__nv_bfloat16*>(args.probabilities), args.weights,
        args.factors, args.model_head, args.query_length, args.key_length, args.causal);
  }
  return cudaGetLastError();
}

}  // namespace attnserve::core::cuda
