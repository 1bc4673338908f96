// The CUDA backend: multi-head attention on an NVIDIA GPU. cuBLAS runs the projections
// and, for long fp32 sequences and when attention weights are asked for, the score and
// context products over materialized scores; core/cuda/kernels.cu holds fused
// online-softmax kernels (scores never stored) over the packed sequences, on tensor
// cores for bf16. Includes no CUDA header: the server reaches it through
// core/attention/attention_backend.h.
#ifndef ATTNSERVE_CORE_CUDA_CUDA_ATTENTION_H_
#define ATTNSERVE_CORE_CUDA_CUDA_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/attention/attention_backend.h"

namespace attnserve::core::cuda {

struct CudaAttentionOptions {
  // fp32 models: cuBLAS may run products on TF32 tensor cores (about 1e-3 relative
  // error instead of about 1e-6). Off by default.
  bool allow_tf32 = false;
  // How the softmax(Q K^T) V step runs when no attention weights are asked for
  // (asking for them always materializes the scores).
  enum class AttentionPath {
    // Sequences with L_q * L_k from materialize_min_scores on: kMaterialized; below:
    // kTensorCore for bf16 with head_dim a multiple of 16 up to 128, else kFused.
    kAuto,
    // The fused kernel on the CUDA cores, f32 arithmetic (head_dim <= 256, else
    // materialized).
    kFused,
    // The fused kernel on tensor cores (bf16 only, head_dim a multiple of 16 up to
    // 128; otherwise as kAuto): mma.sync with scores and output in registers.
    kTensorCore,
    // Scores in device memory, products on cuBLAS.
    kMaterialized,
  };
  AttentionPath path = AttentionPath::kAuto;
  // How the tensor-core kernel reads V: transposed into shared memory as it is loaded,
  // or kept as it is and read with ldmatrix.trans, by blocks of 4 or 8 warps (64 or
  // 128 query rows). The default was the fastest on an H200 at every shape measured
  // (L = 4096, d = 1024, h = 16: 0.514 ms of attention against 0.592 and 0.637).
  enum class TensorCoreKernel { kTransposedV, kLdmatrixV, kLdmatrixV8Warps };
  TensorCoreKernel tensor_core_kernel = TensorCoreKernel::kLdmatrixV8Warps;
  // kAuto: batches whose longest sequence has at least this many scores per head
  // (L_q * L_k) materialize them. Range >= 1.
  int64_t materialize_min_scores = int64_t{256} * 256;
};

// Device time of the last successful Forward, measured with CUDA events.
struct CudaTimings {
  double upload_ms = 0.0;     // the one host-to-device copy
  double compute_ms = 0.0;    // every kernel and product
  double attention_ms = 0.0;  // of which softmax(Q K^T) V
  double download_ms = 0.0;   // the one device-to-host copy
};

// One model on one GPU: its weights (uploaded once, the model's pruned heads left
// out), a CUDA stream, cuBLAS handle, device scratch and pinned staging buffers, all
// its own. Thread-compatible, like every AttentionBackend.
class CudaAttention : public AttentionBackend {
 public:
  virtual CudaTimings last_timings() const = 0;
};

// CUDA devices visible to this process; 0 when there is no GPU or no driver.
int CudaDeviceCount();

// "NVIDIA H200, compute capability 9.0, 143771 MiB" for device `index`, or why not.
std::string CudaDeviceDescription(int index);

// Errors: InvalidArgument for a bad spec, weights or option (naming it); Unavailable
// when there is no device `device_index` (naming it and how many CUDA found);
// ResourceExhausted when its memory cannot hold the weights; Internal when CUDA or
// cuBLAS fails.
absl::StatusOr<std::unique_ptr<CudaAttention>> CreateCudaAttention(
    const ModelSpec& spec, const AttentionWeights& weights, int device_index,
    const CudaAttentionOptions& options);

}  // namespace attnserve::core::cuda

#endif  // ATTNSERVE_CORE_CUDA_CUDA_ATTENTION_H_
