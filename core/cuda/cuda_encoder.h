// The CUDA encoder: a BERT-shaped transformer encoder on an NVIDIA GPU, end to end.
// The embeddings and their LayerNorm, every block (cuBLAS products; attention over the
// packed sequences on the backend's tensor-core or fused kernels, no padding work; the
// residual adds with their biases fused into the LayerNorm kernel; bias and activation
// in one pass) and the pooling run on the GPU; one upload of the batch (ids, types,
// positions, lengths, head factors) and one download of the pooled rows (and the last
// hidden state when asked) per Forward. sentence-transformers' Dense and Normalize and
// the classification head run on the host on those rows, with the CPU encoder's code
// (core/encoder/encoder_backend.h). Head statistics and attention weights come from the
// CPU encoder only: asked of this one, Forward answers Unimplemented. Includes no CUDA
// header: the server reaches it through core/encoder/encoder_backend.h.
#ifndef ATTNSERVE_CORE_CUDA_CUDA_ENCODER_H_
#define ATTNSERVE_CORE_CUDA_CUDA_ENCODER_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/encoder/encoder_backend.h"
#include "core/encoder/encoder_spec.h"

namespace attnserve::core::cuda {

struct CudaEncoderOptions {
  // fp32 encoders: cuBLAS may run the products on TF32 tensor cores (about 1e-3
  // relative error instead of about 1e-6). Off by default.
  bool allow_tf32 = false;
};

// OK when the GPU computes what `spec` describes: a post-LN encoder with LayerNorm,
// learned absolute positions and token types, a plain feed-forward network (GELU, its
// tanh approximation, or ReLU) and global bidirectional attention, heads of d/h up to
// 256 wide, d_model up to 8192, with any pooling, Dense modules or classification head
// (BERT, DistilBERT, RoBERTa, ELECTRA and what is built on them: MiniLM, BGE, E5,
// GTE-small, their cross-encoders). Unimplemented naming the first thing it does not
// compute otherwise (pre-LN, RMSNorm, rotary positions, windows, a relative bias, a
// gated feed-forward, a causal mask, grouped-query attention, query/key norms, heads of
// their own width, a SPLADE head). Needs no GPU.
absl::Status CudaEncoderSupports(const EncoderSpec& spec);

// Errors: InvalidArgument for a bad spec or weights (naming them); Unimplemented from
// CudaEncoderSupports; FailedPrecondition for int8; Unavailable when there is no device
// `device_index` (naming it and how many CUDA found) or cuBLAS cannot be opened;
// ResourceExhausted when its memory cannot hold the weights; Internal when CUDA or
// cuBLAS fails. The checks on the spec come before any CUDA call.
absl::StatusOr<std::unique_ptr<EncoderBackend>> CreateCudaEncoder(
    const EncoderSpec& spec, EncoderWeights weights, int device_index,
    const CudaEncoderOptions& options);

}  // namespace attnserve::core::cuda

#endif  // ATTNSERVE_CORE_CUDA_CUDA_ENCODER_H_
