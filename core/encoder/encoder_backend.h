// The one interface the server sees of an encoder: a packed batch of token ids (or
// hidden states) in, pooled embeddings or a head's logits and the last hidden state
// out, on whichever device computes it. The CPU encoder
// (core/encoder/transformer_encoder.h, oneDNN) and the CUDA one
// (core/cuda/cuda_encoder.h) implement it, and share what this header declares: the
// argument checks (so every device refuses a batch with the same words before any work)
// and the host-side end of the pass (pooling a sequence, sentence-transformers' Dense and
// Normalize, the classification head). Includes neither oneDNN nor CUDA headers.
#ifndef ATTNSERVE_CORE_ENCODER_ENCODER_BACKEND_H_
#define ATTNSERVE_CORE_ENCODER_ENCODER_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/base/device.h"
#include "core/encoder/encoder_spec.h"

namespace attnserve::core {

// One encoder's weights on one device. Thread-compatible: one thread at a time may call
// Forward (the server runs one object per instance).
class EncoderBackend {
 public:
  virtual ~EncoderBackend() = default;

  // Computes the batch. `pooled` receives [n, spec().pooled_width()] (n =
  // lengths.size(): the pooled embeddings, or a head's logits) and must have exactly
  // that size, or be empty; it must be empty when the spec pools nothing.
  // `hidden` receives the last hidden state [sum(lengths), d], or is empty.
  // `statistics` is empty, or receives each layer's and head's figures over the batch,
  // [num_layers * num_heads] layer by layer, from the attention weights of this same
  // pass; a pruned or masked-out head's are zero.
  // `attention` is empty, or receives the first sequence's attention weights in every
  // layer and head, [num_layers, num_heads, L0, L0] (query rows, key columns), from
  // the same pass; a pruned head's are zero.
  // Errors: those of CheckEncoderForward; Unimplemented for what this device does not
  // compute (named); ResourceExhausted when the device cannot hold the batch; Internal
  // when the device library fails. Blocks the calling thread while computing.
  virtual absl::Status Forward(const EncoderBatch& batch, absl::Span<float> pooled,
                               absl::Span<float> hidden,
                               absl::Span<EncoderHeadStatistic> statistics = {},
                               absl::Span<float> attention = {}) = 0;

  virtual const EncoderSpec& spec() const = 0;
  // How it computes, for logs: "fp32", "bf16 (native, ISA)", ... on the CPU
  // (MultiHeadAttention::ComputePath's words), the CUDA encoder's on a GPU.
  virtual std::string ComputePath() const = 0;
  // Where it runs, as --device names it: "cpu" or "cuda:0".
  virtual std::string device_name() const = 0;
  // Device memory this object holds (weights and scratch), in bytes; 0 on the CPU,
  // whose memory the process's RSS already counts.
  virtual int64_t device_memory_bytes() const = 0;
};

struct EncoderBackendOptions {
  // CPU: OpenMP threads oneDNN uses inside Forward; 0 keeps OpenMP's default. Range
  // [0, 1024]. Ignored on CUDA.
  int intra_op_threads = 0;
  // CPU: how a bf16 encoder computes. kAuto: bf16 products where the CPU has
  // AVX512_BF16 or AMX; elsewhere f32 products on the bf16-valued weights (oneDNN would
  // emulate bf16, slower than f32). kNative: bf16 products or FailedPrecondition.
  // kFloat32: always f32 products. Ignored for fp32 encoders and on CUDA.
  enum class Bf16Compute { kAuto, kNative, kFloat32 };
  Bf16Compute bf16_compute = Bf16Compute::kAuto;
  // CUDA, fp32 encoders: let cuBLAS run the products on TF32 tensor cores (about 1e-3
  // relative error instead of 1e-6). Off by default. Ignored on the CPU and for bf16.
  bool allow_tf32 = false;
};

// The encoder for `device`, holding `weights` (uploaded once on a GPU; pass an rvalue
// to spare a copy). Errors: InvalidArgument for a bad spec, weights or option, naming
// the field; Unimplemented for what the device cannot compute yet (naming it: a GPU
// runs BERT-shaped post-LN encoders); Unavailable when the device does not exist or
// this build has no backend for it (naming the device and what was found);
// FailedPrecondition for a precision the device cannot run (int8 off the CPU);
// ResourceExhausted when device memory runs out; Internal when the device library
// fails.
absl::StatusOr<std::unique_ptr<EncoderBackend>> CreateEncoderBackend(
    const EncoderSpec& spec, EncoderWeights weights, const Device& device,
    const EncoderBackendOptions& options);

// The checks every encoder's Forward makes before any work: OK, or InvalidArgument
// naming the field and the value (empty lengths, a length outside [1, max_positions],
// an id or token type out of range, a head_mask factor outside [0, 1], token ids with
// hidden states, or a size of
// head_mask, hidden_states, token_ids, token_types, pooled, hidden, statistics or
// attention that does not match).
absl::Status CheckEncoderForward(const EncoderSpec& spec, const EncoderBatch& batch,
                                 absl::Span<const float> pooled,
                                 absl::Span<const float> hidden,
                                 absl::Span<const EncoderHeadStatistic> statistics,
                                 absl::Span<const float> attention);

// The host-side end of a pass, in f32 with sums in double, for every device.
//
// One sequence's tokens ([length, d], row-major) pooled as `pooling` says (not kNone)
// into out [d].
void PoolTokens(EncoderSpec::Pooling pooling, const float* tokens, int64_t length,
                int64_t d, float* out);
// `row` scaled to unit L2 norm as sentence-transformers' Normalize does: divided by
// max(||row||, 1e-12), the squares summed in double. The one place the rule lives:
// the spec's Normalize and a request's `normalize` both call it.
void NormalizeL2(absl::Span<float> row);
// A pooled row made the embedding: sentence-transformers' Dense layers in order, then
// Normalize when the spec says so. `row` holds d_model values in and
// spec.pooled_width() out; `scratch` is working space.
void FinishEmbedding(const EncoderSpec& spec, const EncoderWeights& weights,
                     std::vector<float>* row, std::vector<float>* scratch);
// The classification head on a sequence's first token `cls` [d]: the pooler (tanh;
// ELECTRA's GELU) and the classifier, into logits [num_labels].
void ClassifyToken(const EncoderSpec& spec, const EncoderWeights& weights,
                   const float* cls, float* logits);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_ENCODER_ENCODER_BACKEND_H_
