#include "core/attention/attention_backend.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/multi_head_attention.h"
#include "core/base/status_macros.h"
#ifdef ATTNSERVE_HAVE_CUDA
#include "core/cuda/cuda_attention.h"
#endif

namespace attnserve::core {
namespace {

// Exactly one of `f32` and `bf16` holds `expected` values.
absl::Status CheckTokens(absl::Span<const float> f32, absl::Span<const uint16_t> bf16,
                         absl::string_view field, int64_t expected,
                         absl::string_view lengths_field) {
  if (!f32.empty() && !bf16.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " and ", field, "_bf16 must not both be set"));
  }
  const int64_t got = static_cast<int64_t>(bf16.empty() ? f32.size() : bf16.size());
  if (got != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, bf16.empty() ? "" : "_bf16", " must hold sum(", lengths_field,
                     ") * d_model = ", expected, " values, got ", got));
  }
  return absl::OkStatus();
}

absl::Status CheckLengths(absl::Span<const int64_t> lengths, absl::string_view field,
                          int64_t& total) {
  total = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] must be >= 1, got ", lengths[i]));
    }
    total += lengths[i];
  }
  return absl::OkStatus();
}

// Rotary pairs must fit in a head, and every frequency must give a finite angle at
// every position.
absl::Status CheckRotary(const AttentionOptions::Rotary& rotary, int64_t head_dim) {
  if (2 * static_cast<int64_t>(rotary.inv_freq.size()) > head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("rotary.inv_freq must hold at most head_dim / 2 = ", head_dim / 2,
                     " values (one per rotated pair), got ", rotary.inv_freq.size()));
  }
  for (size_t i = 0; i < rotary.inv_freq.size(); ++i) {
    const float value = rotary.inv_freq[i];
    if (!(std::isfinite(value) && value >= 0.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rotary.inv_freq[", i, "] must be finite and >= 0, got ", value));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t AttentionWeightsSize(int64_t num_heads, absl::Span<const int64_t> query_lengths,
                             absl::Span<const int64_t> memory_lengths) {
  int64_t total = 0;
  for (size_t i = 0; i < query_lengths.size(); ++i) {
    const int64_t key_length =
        memory_lengths.empty() ? query_lengths[i] : memory_lengths[i];
    total += num_heads * query_lengths[i] * key_length;
  }
  return total;
}

absl::Status CheckForwardArguments(const ModelSpec& spec, const AttentionBatch& batch,
                                   const AttentionOptions& options,
                                   absl::Span<const float> output,
                                   absl::Span<const float> attention_weights) {
  const int64_t d = spec.d_model;
  if (batch.query_lengths.empty()) {
    return absl::InvalidArgumentError("query_lengths must hold at least one sequence");
  }
  int64_t query_tokens = 0;
  ATTN_RETURN_IF_ERROR(CheckLengths(batch.query_lengths, "query_lengths", query_tokens));
  ATTN_RETURN_IF_ERROR(CheckTokens(batch.query, batch.query_bf16, "query",
                                   query_tokens * d, "query_lengths"));
  const bool cross = !batch.memory_lengths.empty() || !batch.memory.empty() ||
                     !batch.memory_bf16.empty();
  if (cross) {
    if (batch.memory_lengths.size() != batch.query_lengths.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "memory_lengths must have one entry per query sequence (",
          batch.query_lengths.size(), "), got ", batch.memory_lengths.size()));
    }
    int64_t memory_tokens = 0;
    ATTN_RETURN_IF_ERROR(
        CheckLengths(batch.memory_lengths, "memory_lengths", memory_tokens));
    ATTN_RETURN_IF_ERROR(CheckTokens(batch.memory, batch.memory_bf16, "memory",
                                     memory_tokens * d, "memory_lengths"));
    if (options.causal) {
      return absl::InvalidArgumentError(
          "causal must be false for cross-attention (memory given): a causal mask is "
          "defined for self-attention only");
    }
    if (!options.relative_bias.empty()) {
      return absl::InvalidArgumentError(
          "relative_bias must be empty for cross-attention (memory given): offsets "
          "between a query and its keys are defined for self-attention only");
    }
    if (!options.rotary.empty()) {
      return absl::InvalidArgumentError(
          "rotary.inv_freq must be empty for cross-attention (memory given): rotary "
          "positions are defined for self-attention only");
    }
    if (options.window != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "window must be 0 for cross-attention (memory given), got ", options.window,
          ": a sliding window is defined for self-attention only"));
    }
  }
  ATTN_RETURN_IF_ERROR(options.relative_bias.Validate(spec.num_heads));
  ATTN_RETURN_IF_ERROR(CheckRotary(options.rotary, spec.head_dim()));
  if (options.window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("window must be >= 0 (0: every key), got ", options.window));
  }
  if (!options.head_mask.empty()) {
    if (static_cast<int64_t>(options.head_mask.size()) != spec.num_heads) {
      return absl::InvalidArgumentError(
          absl::StrCat("head_mask must have num_heads = ", spec.num_heads,
                       " values, got ", options.head_mask.size()));
    }
    for (size_t i = 0; i < options.head_mask.size(); ++i) {
      const float value = options.head_mask[i];
      if (!(value >= 0.0f && value <= 1.0f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("head_mask[", i, "] must be in [0, 1], got ", value));
      }
    }
  }
  if (static_cast<int64_t>(output.size()) != query_tokens * d) {
    return absl::InvalidArgumentError(absl::StrCat("output must hold ", query_tokens * d,
                                                   " floats, got ", output.size()));
  }
  if (!attention_weights.empty()) {
    const int64_t expected =
        AttentionWeightsSize(spec.num_heads, batch.query_lengths, batch.memory_lengths);
    if (static_cast<int64_t>(attention_weights.size()) != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("attention_weights must be empty or hold ", expected,
                       " floats, got ", attention_weights.size()));
    }
  }
  return absl::OkStatus();
}

std::string ComputePath(const ModelSpec& spec, const Device& device) {
  if (device.kind == DeviceKind::kCpu) {
    return MultiHeadAttention::DefaultComputePath(spec);
  }
  return absl::StrCat(PrecisionName(spec.precision), " (", DeviceName(device), ")");
}

std::string CpuProjectionChoices() {
  return MultiHeadAttention::ProcessProjectionChoices();
}

std::vector<CpuProjectionChoice> CpuProjectionChoiceList() {
  std::vector<CpuProjectionChoice> list;
  for (const auto& [key, choice] : MultiHeadAttention::ProcessProjectionChoiceList()) {
    list.push_back({key[0], key[1], key[2], choice.runtime_rows, choice.rows,
                    choice.per_shape_ms, choice.runtime_rows_ms});
  }
  return list;
}

std::string CpuAttentionChoices() {
  return MultiHeadAttention::ProcessAttentionChoices();
}

std::vector<CpuAttentionChoice> CpuAttentionChoiceList() {
  std::vector<CpuAttentionChoice> list;
  for (const auto& [key, choice] : MultiHeadAttention::ProcessAttentionChoiceList()) {
    list.push_back({key[0], key[1], choice.flash ? "flash" : "blocks",
                    absl::StrCat(choice.tiles.query_rows, "x", choice.tiles.keys),
                    choice.timed_heads, choice.timed_length, choice.blocks_ms,
                    choice.flash_ms});
  }
  return list;
}

absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateBackend(
    const ModelSpec& spec, const AttentionWeights& weights, const Device& device,
    const BackendOptions& options) {
  if (device.kind == DeviceKind::kCpu) {
    ATTN_RETURN_IF_ERROR(CheckCpuIndex(device));
    ATTN_ASSIGN_OR_RETURN(const dnnl::engine engine, CreateCpuEngine());
    MultiHeadAttention::Options cpu_options;
    cpu_options.intra_op_threads = options.intra_op_threads;
    ATTN_ASSIGN_OR_RETURN(std::unique_ptr<MultiHeadAttention> attention,
                          MultiHeadAttention::Create(spec, weights, engine, cpu_options));
    return std::unique_ptr<AttentionBackend>(std::move(attention));
  }
  if (spec.precision == Precision::kInt8) return Int8IsCpuOnly(device);
  if (spec.num_kv_heads > 0 || spec.qk_norm || spec.head_size > 0) {
    return absl::UnimplementedError(absl::StrCat(
        spec.num_kv_heads > 0 ? "grouped-query attention (num_kv_heads)"
        : spec.qk_norm        ? "qk_norm"
                              : "head_size",
        " runs on the CPU only for now; device ", DeviceName(device), " has neither"));
  }
#ifdef ATTNSERVE_HAVE_CUDA
  cuda::CudaAttentionOptions cuda_options;
  cuda_options.allow_tf32 = options.allow_tf32;
  ATTN_ASSIGN_OR_RETURN(
      std::unique_ptr<cuda::CudaAttention> attention,
      cuda::CreateCudaAttention(spec, weights, device.index, cuda_options));
  return std::unique_ptr<AttentionBackend>(std::move(attention));
#else
  return NoCudaInThisBuild(device);
#endif
}

absl::StatusOr<int64_t> RowStatisticsByForward(AttentionBackend& backend,
                                               const AttentionBatch& batch, bool causal,
                                               absl::Span<HeadStatistic> statistics) {
  const ModelSpec& spec = backend.spec();
  const int64_t heads = spec.num_heads;
  if (static_cast<int64_t>(statistics.size()) != heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "statistics must have num_heads = ", heads, " entries, got ", statistics.size()));
  }
  int64_t tokens = 0;
  for (int64_t length : batch.query_lengths) tokens += std::max<int64_t>(length, 0);
  const absl::Span<const int64_t> key_lengths =
      batch.memory_lengths.empty() ? batch.query_lengths : batch.memory_lengths;
  std::vector<float> output(static_cast<size_t>(tokens * spec.d_model));
  std::vector<float> weights(static_cast<size_t>(
      AttentionWeightsSize(heads, batch.query_lengths, batch.memory_lengths)));
  AttentionOptions options;
  options.causal = causal;
  ATTN_RETURN_IF_ERROR(
      backend.Forward(batch, options, absl::MakeSpan(output), absl::MakeSpan(weights)));
  std::fill(statistics.begin(), statistics.end(), HeadStatistic());
  int64_t offset = 0;
  for (size_t i = 0; i < batch.query_lengths.size(); ++i) {
    const int64_t query_length = batch.query_lengths[i];
    const int64_t key_length = key_lengths[i];
    for (int64_t head = 0; head < heads; ++head) {
      for (int64_t row = 0; row < query_length; ++row) {
        const float* p =
            weights.data() + offset + (head * query_length + row) * key_length;
        double entropy = 0.0;
        float largest = 0.0f;
        for (int64_t j = 0; j < key_length; ++j) {
          if (p[j] > 0.0f) entropy -= p[j] * std::log(static_cast<double>(p[j]));
          largest = std::max(largest, p[j]);
        }
        statistics[head].mean_entropy += entropy;
        statistics[head].mean_max_weight += largest;
      }
    }
    offset += heads * query_length * key_length;
  }
  for (int64_t head = 0; head < heads; ++head) {
    if (spec.IsPruned(head)) {
      statistics[head] = HeadStatistic();
      continue;
    }
    statistics[head].mean_entropy /= static_cast<double>(tokens);
    statistics[head].mean_max_weight /= static_cast<double>(tokens);
  }
  return tokens;
}

absl::Status HeadStatisticsByForward(AttentionBackend& backend,
                                     absl::Span<const float> out_bias,
                                     const AttentionBatch& batch, bool causal,
                                     absl::Span<HeadStatistic> statistics) {
  ATTN_ASSIGN_OR_RETURN(const int64_t tokens,
                        RowStatisticsByForward(backend, batch, causal, statistics));
  const ModelSpec& spec = backend.spec();
  const int64_t d = spec.d_model;
  const int64_t heads = spec.num_heads;
  // A head's term in the output: the output with that head alone, less b_out.
  std::vector<float> alone(static_cast<size_t>(tokens * d));
  std::vector<float> mask(static_cast<size_t>(heads));
  AttentionOptions options;
  options.causal = causal;
  for (int64_t head = 0; head < heads; ++head) {
    if (spec.IsPruned(head)) continue;
    std::fill(mask.begin(), mask.end(), 0.0f);
    mask[head] = 1.0f;
    options.head_mask = mask;
    ATTN_RETURN_IF_ERROR(backend.Forward(batch, options, absl::MakeSpan(alone), {}));
    double norms = 0.0;
    for (int64_t t = 0; t < tokens; ++t) {
      double squares = 0.0;
      for (int64_t c = 0; c < d; ++c) {
        const double term =
            static_cast<double>(alone[t * d + c]) - static_cast<double>(out_bias[c]);
        squares += term * term;
      }
      norms += std::sqrt(squares);
    }
    statistics[head].mean_output_norm = norms / static_cast<double>(tokens);
  }
  return absl::OkStatus();
}

}  // namespace attnserve::core
