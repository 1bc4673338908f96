// TransformerEncoder: a BERT-family transformer encoder on the CPU, around the core's
// multi-head attention. Token ids in; the last hidden state and a pooled embedding out.
// Sequences stay packed end to end ([sum(L_i), d], no padding work): the embeddings,
// every projection, the feed-forward network and the layer norms run over all tokens
// at once; attention runs per sequence inside MultiHeadAttention.
//
// One block, post-LN (BERT):
//   x = LayerNorm(x + Attention(x))
//   x = LayerNorm(x + W_2 act(W_1 x + b_1) + b_2)
// or pre-LN (Megatron-BERT), with one more LayerNorm after the last block and none after
// the embeddings:
//   x = x + Attention(LayerNorm(x))
//   x = x + W_2 act(W_1 LayerNorm(x) + b_1) + b_2
// Weights load from Hugging Face safetensors under their own names (LoadBertWeights).
// The server reaches it through core/encoder/encoder_backend.h. The header includes no
// oneDNN (pimpl).
#ifndef ATTNSERVE_CORE_ENCODER_TRANSFORMER_ENCODER_H_
#define ATTNSERVE_CORE_ENCODER_TRANSFORMER_ENCODER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/encoder/encoder_backend.h"
#include "core/encoder/encoder_spec.h"

namespace attnserve::core {

// Thread-compatible: one thread at a time may call Forward (run several objects for
// parallel workers). Owns its copy of the weights (the word-embedding table, read-only,
// is shared with the other copies) and its scratch buffers.
class TransformerEncoder final : public EncoderBackend {
 public:
  // intra_op_threads and bf16_compute apply; allow_tf32 is CUDA's.
  using Options = EncoderBackendOptions;

  // InvalidArgument naming the field for a bad spec, weights or option; Internal when
  // oneDNN fails. The encoder keeps the embeddings and layer norms of `weights` and
  // packs the attention and feed-forward weights (the plain copies are dropped): pass
  // an rvalue to spare a copy.
  static absl::StatusOr<std::unique_ptr<TransformerEncoder>> Create(
      const EncoderSpec& spec, EncoderWeights weights, const Options& options);
  ~TransformerEncoder();
  TransformerEncoder(const TransformerEncoder&) = delete;
  TransformerEncoder& operator=(const TransformerEncoder&) = delete;

  // EncoderBackend::Forward; Internal when oneDNN fails. Statistics and attention
  // weights take num_heads * sum(L^2) floats of scratch, reused by every layer.
  absl::Status Forward(const EncoderBatch& batch, absl::Span<float> pooled,
                       absl::Span<float> hidden,
                       absl::Span<EncoderHeadStatistic> statistics = {},
                       absl::Span<float> attention = {}) override;

  const EncoderSpec& spec() const override { return spec_; }
  // MultiHeadAttention::ComputePath's words.
  std::string ComputePath() const override;
  std::string device_name() const override { return "cpu"; }
  int64_t device_memory_bytes() const override { return 0; }

 private:
  struct State;
  TransformerEncoder(const EncoderSpec& spec, const Options& options);
  // The SPLADE head's weights [n, vocab_size] from the last hidden state.
  absl::Status SpladeHead(const float* last, absl::Span<const int64_t> lengths,
                          absl::Span<float> weights);

  const EncoderSpec spec_;
  const Options options_;
  std::unique_ptr<State> state_;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_ENCODER_TRANSFORMER_ENCODER_H_
