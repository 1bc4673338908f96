// The one interface the server sees of the attention math: a batch of packed sequences
// in, the multi-head attention output (and optionally the attention weights) out, on
// whichever device computes it. The oneDNN CPU backend
// (core/attention/multi_head_attention.h) and the CUDA backend (core/cuda/) implement it;
// this header includes neither oneDNN nor CUDA headers.
#ifndef ATTNSERVE_CORE_ATTENTION_ATTENTION_BACKEND_H_
#define ATTNSERVE_CORE_ATTENTION_ATTENTION_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/attention/attention_weights.h"
#include "core/attention/model_spec.h"
#include "core/attention/relative_bias.h"
#include "core/base/device.h"

namespace attnserve::core {

// A packed batch: the tokens of every sequence, one after another. Views only: the
// caller owns the memory and keeps it alive during Forward.
struct AttentionBatch {
  // [sum(query_lengths), d_model] row-major, f32.
  absl::Span<const float> query;
  // Length of each sequence, each >= 1.
  absl::Span<const int64_t> query_lengths;
  // Cross-attention: keys and values come from these tokens,
  // [sum(memory_lengths), d_model]. Empty for self-attention.
  absl::Span<const float> memory;
  // Cross-attention only: length of each sequence's memory, one per query sequence,
  // each >= 1. Empty for self-attention.
  absl::Span<const int64_t> memory_lengths;
  // The same tensors as bf16 bits, instead of `query` / `memory` (set one of each
  // pair): a bf16 model uses them as they are, an fp32 model widens them once.
  absl::Span<const uint16_t> query_bf16;
  absl::Span<const uint16_t> memory_bf16;
};

// Options of one Forward call.
struct AttentionOptions {
  // Query position i attends to keys 0..i only. Self-attention only.
  bool causal = false;
  // Empty, or one factor in [0, 1] per head, applied to the head's output before
  // W_out. 0 prunes the head: it is not computed, and its attention weights read as
  // zeros. Applies to every sequence of the batch.
  absl::Span<const float> head_mask;
  // Added to each head's scores (after the 1/sqrt(head_dim) scale, before the
  // softmax), by the key's offset from the query: see relative_bias.h. Empty for none.
  // Self-attention only; indexed by the model's heads (a pruned head's rows unused).
  RelativeBias relative_bias;
  // Rotary position embedding (RoPE) applied to every head's query and key after their
  // projection (and its bias), before the scores; self-attention only. Token t of a
  // sequence (position t, from 0 in each sequence) rotates each pair of a head's first
  // 2 * inv_freq.size() values by the angle t * inv_freq[i], computed in f32 as
  // transformers computes it (float(t) * inv_freq[i], then cos and sin in f32). The
  // pairs are (x[i], x[i + rotary_dims / 2]) (`interleaved` false: GPT-NeoX's and
  // transformers' rotate_half) or (x[2i], x[2i + 1]) (true: GPT-J's), each turned as
  // (a, b) -> (a cos - b sin, b cos + a sin); the values past the rotary dims are left
  // as they are. Empty inv_freq: none. The caller turns a config's rope_theta and
  // rope_scaling into inv_freq (linear scaling divides it). CheckForwardArguments
  // refuses more than head_dim / 2 values, a value not finite or < 0, and rotary with
  // cross-attention.
  struct Rotary {
    absl::Span<const float> inv_freq;  // [rotary_dims / 2], each finite and >= 0
    bool interleaved = false;
    bool empty() const { return inv_freq.empty(); }
  };
  Rotary rotary;
  // Local (sliding-window) attention: query i attends only to keys j with |i - j| <=
  // window (and j <= i when causal), its softmax over those keys alone (the others'
  // attention weights read 0); 0: every key. Self-attention only: CheckForwardArguments
  // refuses a window < 0 and a window with cross-attention.
  int64_t window = 0;
};

// What one head does over some inputs, to choose heads to prune. Zero for a head the
// model prunes.
struct HeadStatistic {
  // Mean over query rows of the entropy (nats) of the head's attention row: ln(L_k)
  // for uniform attention, 0 for attention on one key.
  double mean_entropy = 0.0;
  // Mean over query rows of the row's largest weight.
  double mean_max_weight = 0.0;
  // Mean over query tokens of the L2 norm of the head's term in the output (its
  // context times its columns of W_out, before the output bias).
  double mean_output_norm = 0.0;
};

// Number of floats Forward writes into `attention_weights` for these lengths: sum over
// sequences of num_heads * L_q * L_k (L_k = L_q for self-attention).
int64_t AttentionWeightsSize(int64_t num_heads, absl::Span<const int64_t> query_lengths,
                             absl::Span<const int64_t> memory_lengths);

// The checks every backend's Forward makes before any work: OK, or InvalidArgument
// naming the field (a length < 1, both or neither of query and query_bf16 set, sizes
// that do not match the lengths, memory_lengths count != query_lengths count, causal
// or a relative bias with cross-attention, head_mask size != num_heads or a value
// outside [0, 1], a malformed relative bias, a wrong output or attention_weights size).
absl::Status CheckForwardArguments(const ModelSpec& spec, const AttentionBatch& batch,
                                   const AttentionOptions& options,
                                   absl::Span<const float> output,
                                   absl::Span<const float> attention_weights);

// One model's weights on one device. Thread-compatible: one thread at a time may call
// Forward or HeadStatistics (the server runs one object per instance).
class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;

  // Computes the batch. `output` receives [sum(query_lengths), d_model] and must have
  // exactly that size. `attention_weights` is empty, or receives per sequence, one
  // after another, the softmax weights [num_heads, L_q, L_k] (rows sum to 1) and then
  // must have exactly AttentionWeightsSize(...) floats; a pruned head's are zeros.
  // Errors: those of CheckForwardArguments; ResourceExhausted when the device cannot
  // hold the batch; Internal when the device library fails. Blocks the calling thread
  // until the results are in `output` and `attention_weights`.
  virtual absl::Status Forward(const AttentionBatch& batch,
                               const AttentionOptions& options, absl::Span<float> output,
                               absl::Span<float> attention_weights) = 0;
  // The same without attention weights.
  absl::Status Forward(const AttentionBatch& batch, const AttentionOptions& options,
                       absl::Span<float> output) {
    return Forward(batch, options, output, {});
  }

  // Statistics of every head (num_heads entries; a pruned head's are zero) over
  // `batch`, computed with all the model's heads (no head mask). Same errors as
  // Forward, and InvalidArgument when `statistics` does not have num_heads entries.
  virtual absl::Status HeadStatistics(const AttentionBatch& batch, bool causal,
                                      absl::Span<HeadStatistic> statistics) = 0;

  virtual const ModelSpec& spec() const = 0;
  // Heads the last successful Forward computed: the model's heads less those its head
  // mask zeroed.
  virtual int64_t computed_heads() const = 0;
  // Where it runs, as --device names it: "cpu" or "cuda:0".
  virtual std::string device_name() const = 0;
  // Device memory this object holds (weights and scratch), in bytes; 0 on the CPU,
  // whose memory the process's RSS already counts.
  virtual int64_t device_memory_bytes() const = 0;
};

struct BackendOptions {
  // CPU: OpenMP threads oneDNN uses inside Forward; 0 keeps OpenMP's default. Range
  // [0, 1024]. Ignored on CUDA.
  int intra_op_threads = 0;
  // CUDA, fp32 models: let cuBLAS run the projections on TF32 tensor cores (about 1e-3
  // relative error instead of 1e-6). Off by default. Ignored on the CPU and for bf16.
  bool allow_tf32 = false;
};

// What the CPU backend's timing chose for f32 projections so far, process-wide, for logs
// ("" before any): MultiHeadAttention::ProcessProjectionChoices.
std::string CpuProjectionChoices();

// The same as data: one entry per weight matrix shape and thread count, ascending.
struct CpuProjectionChoice {
  int64_t in_features = 0, out_features = 0;
  int64_t intra_op_threads = 0;  // 0: OpenMP's default
  bool runtime_rows = false;     // else one primitive per row count, weights prepacked
  int64_t timed_rows = 0;        // the row count both were timed at
  double per_shape_ms = 0, runtime_rows_ms = 0;
};
std::vector<CpuProjectionChoice> CpuProjectionChoiceList();

// What the CPU backend's timing chose for attention over long f32 sequences (flash or
// query-row blocks, and the flash tiles), process-wide, for logs ("" before any):
// MultiHeadAttention::ProcessAttentionChoices.
std::string CpuAttentionChoices();

// The same as data: one entry per head size and thread count, ascending.
struct CpuAttentionChoice {
  int64_t head_dim = 0;
  int64_t intra_op_threads = 0;  // 0: OpenMP's default
  std::string kernel;            // "flash" or "blocks"
  std::string flash_tiles;       // "ROWSxKEYS", the fastest tiles timed
  int64_t timed_heads = 0, timed_length = 0;
  double blocks_ms = 0, flash_ms = 0;
};
std::vector<CpuAttentionChoice> CpuAttentionChoiceList();

// The backend for `device`, holding its own copy of `weights` (uploaded once on a
// GPU). Errors: InvalidArgument for a bad `spec`, `weights` shapes or option, naming
// the field; Unavailable when the device does not exist or this build has no backend
// for it (the message names the device and what was found); FailedPrecondition for a
// precision the device cannot run (int8 off the CPU);
// ResourceExhausted when device memory runs out; Internal when the device library
// fails. A bf16 model runs on every CPU: natively where it has AVX512_BF16 or AMX,
// else on bf16-valued weights in f32 (ComputePath says which).

absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateBackend(
    const ModelSpec& spec, const AttentionWeights& weights, const Device& device,
    const BackendOptions& options);

// How a model of `spec` computes on `device`, for logs: "fp32", "bf16 (native, ISA)",
// "bf16 weights, f32 compute (ISA has no native bf16)", or the CUDA backend's.
std::string ComputePath(const ModelSpec& spec, const Device& device);

// The attention-row half of head statistics, for any backend: checks that
// `statistics` has num_heads entries (InvalidArgument), runs Forward with every head
// and the attention weights, and sets each head's mean_entropy and mean_max_weight
// (zero for pruned heads; mean_output_norm is left 0). Returns the number of query
// tokens. Same errors as Forward.
absl::StatusOr<int64_t> RowStatisticsByForward(AttentionBackend& backend,
                                               const AttentionBatch& batch, bool causal,
                                               absl::Span<HeadStatistic> statistics);

// Head statistics through Forward alone, for backends without a faster way: one
// Forward with every head for the attention rows, then one per head with only that
// head unmasked (its output less `out_bias`, the model's b_out, is its term). Same
// contract as AttentionBackend::HeadStatistics.
absl::Status HeadStatisticsByForward(AttentionBackend& backend,
                                     absl::Span<const float> out_bias,
                                     const AttentionBatch& batch, bool causal,
                                     absl::Span<HeadStatistic> statistics);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_ATTENTION_ATTENTION_BACKEND_H_
