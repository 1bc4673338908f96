#include <cuda_bf16.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "core/cuda/device_helpers.cuh"
#include "core/cuda/kernels.h"

namespace attnserve::core::cuda {
namespace {

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

// Where one block of a fused kernel works (grid: row blocks, heads, sequences): rows
// [first_row, first_row + rows) of head blockIdx.y of sequence blockIdx.z.
struct BlockTask {
  int64_t query_start, key_start, column;
  int query_length, key_length, first_row, rows;
  float factor;
};

// Fills `task` for blocks of `block_rows` query rows. False when the block has nothing
// to compute: past its sequence's rows, or its head's factor is 0 (then the block has
// written the head's zeros).
template <typename T>
__device__ bool StartBlock(int block_rows, const int32_t* cu_query, const int32_t* cu_key,
                           const float* factors, int head_dim, T* ctx, int64_t ldc,
                           BlockTask& task) {
  const int sequence = blockIdx.z;
  task.query_start = cu_query[sequence];
  task.query_length = cu_query[sequence + 1] - cu_query[sequence];
  task.key_start = cu_key[sequence];
  task.key_length = cu_key[sequence + 1] - cu_key[sequence];
  task.first_row = blockIdx.x * block_rows;
  if (task.first_row >= task.query_length) return false;
  task.rows = min(block_rows, task.query_length - task.first_row);
  task.factor = factors[blockIdx.y];
  task.column = static_cast<int64_t>(blockIdx.y) * head_dim;
  if (task.factor != 0.0f) return true;
  for (int i = threadIdx.x; i < task.rows * head_dim; i += blockDim.x) {
    Store(ctx + (task.query_start + task.first_row + i / head_dim) * ldc + task.column +
              i % head_dim,
          0.0f);
  }
  return false;
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

  BlockTask task;
  if (!StartBlock(kBlockRows, cu_query, cu_key, factors, head_dim, ctx, ldc, task))
    return;
  const int64_t query_start = task.query_start, key_start = task.key_start;
  const int64_t column = task.column;
  const int key_length = task.key_length, first_row = task.first_row;
  const int block_rows = task.rows;
  const float factor = task.factor;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

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

// Launches `kernel` (either fused kernel: both take the same arguments, in T) over
// blocks of `block_rows` query rows, every head, every sequence.
template <typename T, typename Kernel>
cudaError_t LaunchOverSequences(Kernel* kernel, size_t shared, int block_rows,
                                int threads, const FusedAttentionArgs& args,
                                cudaStream_t stream) {
  if (shared > 48 * 1024) {
    const cudaError_t error = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    if (error != cudaSuccess) return error;
  }
  const int row_blocks = (args.max_query_length + block_rows - 1) / block_rows;
  // gridDim.z holds at most 65535 sequences per launch.
  for (int first = 0; first < args.sequences; first += 65535) {
    const int count = min(65535, args.sequences - first);
    kernel<<<dim3(row_blocks, args.heads, count), threads, shared, stream>>>(
        static_cast<const T*>(args.q), args.ldq, static_cast<const T*>(args.k), args.ldk,
        static_cast<const T*>(args.v), args.ldv, static_cast<T*>(args.ctx), args.ldc,
        args.cu_query + first, args.cu_key + first, args.factors, args.head_dim,
        args.causal);
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) return error;
  }
  return cudaSuccess;
}

template <typename T, int kMaxHeadDim>
cudaError_t LaunchFusedFor(const FusedAttentionArgs& args, cudaStream_t stream) {
  return LaunchOverSequences<T>(&FusedAttentionKernel<T, kMaxHeadDim>,
                                FusedSharedBytes<kMaxHeadDim>(), kBlockRows, kWarps * 32,
                                args, stream);
}

template <typename T>
cudaError_t LaunchFusedTyped(const FusedAttentionArgs& args, cudaStream_t stream) {
  if (args.head_dim <= 32) return LaunchFusedFor<T, 32>(args, stream);
  if (args.head_dim <= 64) return LaunchFusedFor<T, 64>(args, stream);
  if (args.head_dim <= 128) return LaunchFusedFor<T, 128>(args, stream);
  return LaunchFusedFor<T, 256>(args, stream);
}

// Tensor-core flash attention (bf16), as flash attention 2 does it: a block of warps
// takes 16 query rows per warp of one head of one sequence and walks the keys in tiles
// of 64; each tile's Q K^T and P V are mma.sync products (m16n8k16, bf16 in, f32
// accumulate) with the operand layouts PTX defines, so each warp's scores and output
// stay in registers (a thread holds rows group and group + 8), the softmax needs only
// shuffles within a quad, and the probabilities go from the scores' accumulator layout
// straight into the next product's A operand. Shared memory holds Q, K [key][c] and V,
// rows padded by 8 elements so that a quad's loads fall in distinct banks. Columns past
// head_dim are zero-padded up to kHeadDim.
constexpr int kTcKeys = 64;
constexpr int kTcWarpRows = 16;

__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
      "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t PackBf16(float low, float high) {
  __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<uint32_t*>(&pair);
}

__device__ __forceinline__ uint32_t Load32(const __nv_bfloat16* pointer) {
  return *reinterpret_cast<const uint32_t*>(pointer);
}

// V in shared memory: kLdmatrix keeps it [key][c] and reads the B operand with
// ldmatrix.trans; otherwise it is stored transposed, [c][key], on the way in.
template <int kHeadDim, int kWarps, bool kLdmatrix>
constexpr size_t RegisterFlashSharedBytes() {
  return 2 * ((kWarps * kTcWarpRows + kTcKeys) * (kHeadDim + 8) +
              (kLdmatrix ? kTcKeys * (kHeadDim + 8) : kHeadDim * (kTcKeys + 8)));
}

template <int kHeadDim, int kWarps, bool kLdmatrix>
__global__ void __launch_bounds__(kWarps * 32)
    RegisterFlashKernel(const __nv_bfloat16* __restrict__ q, int64_t ldq,
                        const __nv_bfloat16* __restrict__ k, int64_t ldk,
                        const __nv_bfloat16* __restrict__ v, int64_t ldv,
                        __nv_bfloat16* __restrict__ ctx, int64_t ldc,
                        const int32_t* cu_query, const int32_t* cu_key,
                        const float* factors, int head_dim, bool causal) {
  constexpr int kRows = kWarps * kTcWarpRows;
  constexpr int kStride = kHeadDim + 8;
  constexpr int kVtStride = kTcKeys + 8;
  constexpr int kSteps = kHeadDim / 16;   // k-steps of Q K^T
  constexpr int kColumns = kHeadDim / 8;  // n-tiles of P V
  extern __shared__ __align__(128) unsigned char shared_bytes[];
  auto* q_tile = reinterpret_cast<__nv_bfloat16*>(shared_bytes);
  __nv_bfloat16* k_tile = q_tile + kRows * kStride;
  __nv_bfloat16* vt_tile = k_tile + kTcKeys * kStride;  // V, or V^T

  BlockTask task;
  if (!StartBlock(kRows, cu_query, cu_key, factors, head_dim, ctx, ldc, task)) return;
  const int64_t query_start = task.query_start, key_start = task.key_start;
  const int64_t column = task.column;
  const int key_length = task.key_length, first_row = task.first_row;
  const int block_rows = task.rows;
  const float factor = task.factor;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane >> 2, quad = lane & 3;

  constexpr int kVectors = kHeadDim / 8;
  for (int i = threadIdx.x; i < kRows * kVectors; i += blockDim.x) {
    const int row = i / kVectors, c = (i % kVectors) * 8;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (row < block_rows && c < head_dim) {
      value = *reinterpret_cast<const uint4*>(q + (query_start + first_row + row) * ldq +
                                              column + c);
    }
    *reinterpret_cast<uint4*>(q_tile + row * kStride + c) = value;
  }
  __syncthreads();
  uint32_t q_fragment[kSteps][4];
  const __nv_bfloat16* q_warp = q_tile + warp * kTcWarpRows * kStride;
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const __nv_bfloat16* base = q_warp + step * 16 + quad * 2;
    q_fragment[step][0] = Load32(base + group * kStride);
    q_fragment[step][1] = Load32(base + (group + 8) * kStride);
    q_fragment[step][2] = Load32(base + group * kStride + 8);
    q_fragment[step][3] = Load32(base + (group + 8) * kStride + 8);
  }
  float out[kColumns][4];
#pragma unroll
  for (int n = 0; n < kColumns; ++n) out[n][0] = out[n][1] = out[n][2] = out[n][3] = 0.0f;
  float running_max[2] = {-INFINITY, -INFINITY}, running_sum[2] = {0.0f, 0.0f};
  const int rows[2] = {first_row + warp * kTcWarpRows + group,
                       first_row + warp * kTcWarpRows + group + 8};
  const int key_end = causal ? min(key_length, first_row + block_rows) : key_length;

  for (int tile = 0; tile < key_end; tile += kTcKeys) {
    __syncthreads();
    const int keys = min(kTcKeys, key_end - tile);
    for (int i = threadIdx.x; i < kTcKeys * kVectors; i += blockDim.x) {
      // Consecutive threads take consecutive keys: V^T's stores are then consecutive.
      const int key = i % kTcKeys, c = (i / kTcKeys) * 8;
      uint4 key_value = make_uint4(0, 0, 0, 0), value = make_uint4(0, 0, 0, 0);
      if (key < keys && c < head_dim) {
        const int64_t row = key_start + tile + key;
        key_value = *reinterpret_cast<const uint4*>(k + row * ldk + column + c);
        value = *reinterpret_cast<const uint4*>(v + row * ldv + column + c);
      }
      *reinterpret_cast<uint4*>(k_tile + key * kStride + c) = key_value;
      if constexpr (kLdmatrix) {
        *reinterpret_cast<uint4*>(vt_tile + key * kStride + c) = value;
      } else {
        const auto* elements = reinterpret_cast<const __nv_bfloat16*>(&value);
#pragma unroll
        for (int e = 0; e < 8; ++e) vt_tile[(c + e) * kVtStride + key] = elements[e];
      }
    }
    __syncthreads();
    // scores = Q_w K_tile^T: 8 tiles of 16 rows x 8 keys.
    float scores[kTcKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kTcKeys / 8; ++n) {
      scores[n][0] = scores[n][1] = scores[n][2] = scores[n][3] = 0.0f;
      const __nv_bfloat16* key_row = k_tile + (n * 8 + group) * kStride + quad * 2;
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        const uint32_t b[2] = {Load32(key_row + step * 16),
                               Load32(key_row + step * 16 + 8)};
        MmaBf16(scores[n], q_fragment[step], b);
      }
    }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kTcKeys / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = tile + n * 8 + quad * 2 + (e & 1);
        const bool valid = key < key_end && (!causal || key <= rows[e >> 1]);
        if (!valid) scores[n][e] = -INFINITY;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], scores[n][e]);
      }
    }
    float correction[2], row_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
      const float new_max = fmaxf(running_max[i], tile_max[i]);
      correction[i] =
          running_max[i] == -INFINITY ? 0.0f : __expf(running_max[i] - new_max);
      running_max[i] = new_max;
    }
#pragma unroll
    for (int n = 0; n < kTcKeys / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p =
            scores[n][e] == -INFINITY ? 0.0f : __expf(scores[n][e] - running_max[e >> 1]);
        scores[n][e] = p;
        row_sum[e >> 1] += p;
      }
    }
    // Each thread keeps its part of the row sums; the quad adds them up at the end.
    running_sum[0] = running_sum[0] * correction[0] + row_sum[0];
    running_sum[1] = running_sum[1] * correction[1] + row_sum[1];
#pragma unroll
    for (int n = 0; n < kColumns; ++n) {
      out[n][0] *= correction[0];
      out[n][1] *= correction[0];
      out[n][2] *= correction[1];
      out[n][3] *= correction[1];
    }
    // out += P V, 16 keys per step: the scores' tiles 2j and 2j+1 are P's A operand.
#pragma unroll
    for (int j = 0; j < kTcKeys / 16; ++j) {
      const uint32_t a[4] = {PackBf16(scores[2 * j][0], scores[2 * j][1]),
                             PackBf16(scores[2 * j][2], scores[2 * j][3]),
                             PackBf16(scores[2 * j + 1][0], scores[2 * j + 1][1]),
                             PackBf16(scores[2 * j + 1][2], scores[2 * j + 1][3])};
#pragma unroll
      for (int n = 0; n < kColumns; ++n) {
        uint32_t b[2];
        if constexpr (kLdmatrix) {
          // Lanes 0-15 address keys j*16 + 0..15 at columns n*8..n*8+7; .trans hands
          // each lane the (key pair, column) elements of the B operand.
          const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(
              vt_tile + (j * 16 + (lane & 15)) * kStride + n * 8));
          asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                       : "=r"(b[0]), "=r"(b[1])
                       : "r"(address));
        } else {
          const __nv_bfloat16* value_row =
              vt_tile + (n * 8 + group) * kVtStride + j * 16 + quad * 2;
          b[0] = Load32(value_row);
          b[1] = Load32(value_row + 8);
        }
        MmaBf16(out[n], a, b);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    running_sum[i] += __shfl_xor_sync(0xffffffffu, running_sum[i], 1);
    running_sum[i] += __shfl_xor_sync(0xffffffffu, running_sum[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (rows[i] - first_row >= block_rows) continue;
    const float scale = factor / running_sum[i];
    __nv_bfloat16* row_out = ctx + (query_start + rows[i]) * ldc + column;
#pragma unroll
    for (int n = 0; n < kColumns; ++n) {
      const int c = n * 8 + quad * 2;
      if (c < head_dim) {
        *reinterpret_cast<__nv_bfloat162*>(row_out + c) =
            __floats2bfloat162_rn(out[n][2 * i] * scale, out[n][2 * i + 1] * scale);
      }
    }
  }
}

template <int kHeadDim, int kWarps, bool kLdmatrix>
cudaError_t LaunchRegisterFlashFor(const FusedAttentionArgs& args, cudaStream_t stream) {
  return LaunchOverSequences<__nv_bfloat16>(
      &RegisterFlashKernel<kHeadDim, kWarps, kLdmatrix>,
      RegisterFlashSharedBytes<kHeadDim, kWarps, kLdmatrix>(), kWarps * kTcWarpRows,
      kWarps * 32, args, stream);
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

cudaError_t LaunchTensorCoreAttention(const FusedAttentionArgs& args, cudaStream_t stream,
                                      TensorCoreVariant variant) {
  if (!TensorCoreAttentionFits(args)) return cudaErrorInvalidValue;
  const bool narrow = args.head_dim <= 64;
  switch (variant) {
    case TensorCoreVariant::kTransposedV:
      return narrow ? LaunchRegisterFlashFor<64, 4, false>(args, stream)
                    : LaunchRegisterFlashFor<128, 4, false>(args, stream);
    case TensorCoreVariant::kLdmatrixV:
      return narrow ? LaunchRegisterFlashFor<64, 4, true>(args, stream)
                    : LaunchRegisterFlashFor<128, 4, true>(args, stream);
    case TensorCoreVariant::kLdmatrixV8Warps:
      return narrow ? LaunchRegisterFlashFor<64, 8, true>(args, stream)
                    : LaunchRegisterFlashFor<128, 8, true>(args, stream);
  }
  return cudaErrorInvalidValue;
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
