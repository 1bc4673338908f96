// The CUDA backend's own kernels (core/cuda/kernels.cu), launched on a caller's stream.
// Plain C++ declarations: cuda_attention.cc calls them, cuBLAS does the matrix
// products. Every launcher returns the launch's error (cudaSuccess when it was queued).
#ifndef ATTNSERVE_CORE_CUDA_KERNELS_H_
#define ATTNSERVE_CORE_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace attnserve::core::cuda {

// Element types of device tensors.
enum class ElementType { kF32, kBf16 };

// out[i] = in[i] converted from `from` to `to` (f32 <-> bf16, round to nearest even).
cudaError_t LaunchConvert(const void* in, ElementType from, void* out, ElementType to,
                          int64_t count, cudaStream_t stream);

// Each of `rows` rows of `out` (row stride `ld` elements, type `type`) gets the first
// `cols` values of `bias` (f32): the C of a matrix product whose beta is 1 then adds
// the bias.
cudaError_t LaunchFillRows(void* out, ElementType type, int64_t rows, int64_t cols,
                           int64_t ld, const float* bias, cudaStream_t stream);

// The largest head_dim the fused kernel takes.
inline constexpr int kFusedMaxHeadDim = 256;

// Fused attention over packed sequences (online softmax, scores never stored), per
// sequence s, computed head p, query row i:
//   ctx[i, p] = factor[p] softmax_j(q[i, p] . k[j, p]) v[j, p]
// with rows of sequence s at cu_query[s] .. cu_query[s+1] of q and ctx and at
// cu_key[s] .. cu_key[s+1] of k and v; head p is columns [p hd, (p+1) hd) of each
// (row strides ldq, ldk, ldv, ldc elements). The 1/sqrt(hd) scale is already in q.
// Causal: key j only for j <= i (L_q = L_k). factor 0 writes zeros without computing.
// `type` is the element type of q, k, v and ctx; arithmetic is f32.
// REQUIRES: head_dim <= kFusedMaxHeadDim; max_query_length >= every L_q.
struct FusedAttentionArgs {
  ElementType type;
  const void* q;
  int64_t ldq;
  const void* k;
  int64_t ldk;
  const void* v;
  int64_t ldv;
  void* ctx;
  int64_t ldc;
  const int32_t* cu_query;  // [sequences + 1], device
  const int32_t* cu_key;    // [sequences + 1], device
  const float* factors;     // [heads], device
  int sequences;
  int heads;
  int head_dim;
  int max_query_length;
  bool causal;
};
cudaError_t LaunchFusedAttention(const FusedAttentionArgs& args, cudaStream_t stream);

// The same on tensor cores, for bf16: each tile's Q K^T and P V are mma.sync products
// (bf16 in, f32 accumulate), scores and output kept in registers, the online softmax
// in f32.
// Whether `args` can take it: bf16, head_dim a multiple of 16 up to 128, every row
// stride a multiple of 8 elements and q, k, v 16-byte aligned (vector loads).
bool TensorCoreAttentionFits(const FusedAttentionArgs& args);
// How V reaches the P V products: transposed into shared memory by the loads, or kept
// as it is and read with ldmatrix.trans (4 or 8 warps, 64 or 128 query rows a block).
enum class TensorCoreVariant { kTransposedV, kLdmatrixV, kLdmatrixV8Warps };
// REQUIRES: TensorCoreAttentionFits(args) (else cudaErrorInvalidValue).
cudaError_t LaunchTensorCoreAttention(const FusedAttentionArgs& args, cudaStream_t stream,
                                      TensorCoreVariant variant);

// Softmax of one sequence's scores in place: `scores` f32 [heads, L_q, L_k], each row
// over j (j <= i when causal; masked keys get 0). Row of head p is multiplied by
// factors[p] (device) in `scores` and, when `probabilities` is not null, written there
// too in `type`. When `weights` is not null, the unscaled row is also written to
// weights + (model_head[p] L_q + i) L_k (f32), zeros for a head whose factor is 0.
// `model_head` maps computed head p to the model head index (device, [heads]).
struct SoftmaxArgs {
  float* scores;
  ElementType type;
  void* probabilities;
  float* weights;
  const float* factors;
  const int32_t* model_head;  // device, [heads]
  int heads;
  int64_t query_length;
  int64_t key_length;
  bool causal;
};
cudaError_t LaunchSoftmax(const SoftmaxArgs& args, cudaStream_t stream);

// The encoder's kernels (core/cuda/encoder_kernels.cu): one block per token row for the
// norms, d_model up to kMaxNormWidth (the row sits in shared memory).
inline constexpr int kMaxNormWidth = 8192;

// The feed-forward network's activations: GELU with erf, GELU's tanh approximation,
// ReLU, or none (a bias alone).
enum class Activation { kNone, kGeluErf, kGeluTanh, kRelu };

// BERT's embeddings, normalized: for token t,
//   out[t] = LayerNorm(word[ids[t]] + position[positions[t]] + type[types[t]])
// (position omitted when `position` is null), in f32 into `out` and, when
// `out_compute` is not null, bf16 into it too.
struct EmbedArgs {
  const int32_t* ids;        // device [tokens]
  const int32_t* types;      // device [tokens]
  const int32_t* positions;  // device [tokens]
  const void* word;          // [vocab, d], in word_type
  ElementType word_type;
  const float* position;  // [max_positions, d] or null
  const float* type;      // [type_vocab, d]
  const float* scale;     // [d]
  const float* shift;     // [d]
  float eps;
  int64_t tokens;
  int d;
  float* out;         // [tokens, d]
  void* out_compute;  // bf16 [tokens, d] or null
};
cudaError_t LaunchEmbed(const EmbedArgs& args, cudaStream_t stream);

// out[r] = LayerNorm(a[r] + bias + residual[r]) per row r (bias null: none), in f32
// into `out` (which may be `residual`) and, when `out_compute` is not null, bf16 into
// it too.
struct AddNormArgs {
  const float* a;         // [rows, d]
  const float* bias;      // [d] or null
  const float* residual;  // [rows, d]
  const float* scale;     // [d]
  const float* shift;     // [d]
  float eps;
  int64_t rows;
  int d;
  float* out;         // [rows, d]
  void* out_compute;  // bf16 [rows, d] or null
};
cudaError_t LaunchAddLayerNorm(const AddNormArgs& args, cudaStream_t stream);

// x[r, c] = act(x[r, c] + bias[c]) in place, x [rows, cols] dense in `type`, the
// arithmetic in f32.
cudaError_t LaunchBiasActivation(void* x, ElementType type, const float* bias,
                                 int64_t rows, int cols, Activation activation,
                                 cudaStream_t stream);

// Pooling of each sequence's rows of `hidden` (f32 [tokens, d], sequence s at rows
// cu[s] .. cu[s+1]) into out [sequences, d], summed in double: the mean, the first
// row, the element-wise maximum, the sum over sqrt(length), the mean weighted by
// position (row i weighs i + 1), or the last row.
enum class PoolMode { kMean, kFirst, kMax, kMeanSqrtLength, kWeightedMean, kLast };
cudaError_t LaunchPool(const float* hidden, const int32_t* cu, int sequences, int d,
                       PoolMode mode, float* out, cudaStream_t stream);

}  // namespace attnserve::core::cuda

#endif  // ATTNSERVE_CORE_CUDA_KERNELS_H_
