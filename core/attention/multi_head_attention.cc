#include "core/attention/multi_head_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/base/bfloat16.h"
#include "core/base/row_chunks.h"
#include "core/base/status_macros.h"
#include "core/base/thread_sanitizer.h"

namespace attnserve::core {

namespace {

using dnnl::memory;
using Dims = memory::dims;

constexpr int kMaxThreads = 1024;

// TSan builds take the serial long-sequence path (thread_sanitizer.h); the parallel one
// is tested by the other builds.
constexpr bool kParallelBlocks = !kThreadSanitizer;
// Fewer query rows per block would starve the matmuls; a longer block may exceed the
// byte budget for very long keys.
constexpr int64_t kMinBlockRows = 16;
// Causal sequences at least this long are split into about kCausalBlocks row blocks so
// that the masked upper triangle is skipped; shorter ones cost more in primitive calls
// than the triangle saves.
constexpr int64_t kCausalBlockedLength = 256;
constexpr int64_t kCausalBlocks = 8;
// ProjectionPrimitives::kAuto times a projection at this many rows (a chunk size of
// row_chunks.h, and the common sequence length), or fewer where that would exceed
// kLargestTimedProjection multiply-adds (about 3 ms on one core).
constexpr int64_t kTimedProjectionRows = 128;
constexpr int64_t kLargestTimedProjection = int64_t{1} << 28;

// What a kAuto option timed, for the whole process: ProjectionChoice by (in, out,
// threads), AttentionChoice by (head_dim, threads, block bytes).
template <typename Choice>
struct SharedChoices {
  absl::Mutex mu;
  std::map<std::array<int64_t, 3>, Choice> choices ABSL_GUARDED_BY(mu);

  static SharedChoices& Get() {
    static auto* shared = new SharedChoices();  // never destroyed
    return *shared;
  }
};
using SharedProjectionChoices = SharedChoices<MultiHeadAttention::ProjectionChoice>;
using SharedAttentionChoices = SharedChoices<MultiHeadAttention::AttentionChoice>;

absl::Status FromDnnlError(const dnnl::error& e, absl::string_view what) {
  return absl::InternalError(absl::StrCat("oneDNN failed to ", what, ": ", e.what()));
}

dnnl::primitive_attr UserScratchpadAttr() {
  dnnl::primitive_attr attr;
  // A user scratchpad per object: a cached primitive implementation may be shared by
  // several objects through oneDNN's global cache, and library-managed scratchpads
  // would then be shared across threads.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// Row-major [rows, cols] tensor.
memory::desc Plain2d(int64_t rows, int64_t cols,
                     memory::data_type type = memory::data_type::f32) {
  return memory::desc({rows, cols}, type, memory::format_tag::ab);
}

// A projection's weights W, row-major f32 [out, in], read as [in, out] (W^T).
memory::desc ProjectionWeights(int64_t in, int64_t out) {
  return memory::desc({in, out}, memory::data_type::f32, memory::format_tag::ba);
}

// oneDNN's name for its effective ISA, for error messages.
absl::string_view IsaName() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

// Scores of `heads` heads [heads, rows, L_k] (of `count` sequences when count > 1:
// [count, heads, rows, L_k]), dense, in `type`.
memory::desc ScoresDesc(int64_t count, int64_t heads, int64_t rows, int64_t key_length,
                        memory::data_type type = memory::data_type::f32) {
  if (count > 1) {
    return memory::desc({count, heads, rows, key_length}, type, memory::format_tag::abcd);
  }
  return memory::desc({heads, rows, key_length}, type, memory::format_tag::abc);
}

// The same scores with the heads as heads / share groups of `share` (the grouped
// products' output: one more dimension, the same memory).
memory::desc GroupedScoresDesc(int64_t count, int64_t heads, int64_t rows,
                               int64_t key_length, int64_t share,
                               memory::data_type type = memory::data_type::f32) {
  if (share <= 1) return ScoresDesc(count, heads, rows, key_length, type);
  if (count > 1) {
    return memory::desc({count, heads / share, share, rows, key_length}, type,
                        memory::format_tag::abcde);
  }
  return memory::desc({heads / share, share, rows, key_length}, type,
                      memory::format_tag::abcd);
}

// x / sqrt(mean(x^2) + eps) * scale over each head_dim slice of `rows` rows of
// `heads` heads (row stride `width`), in place, in f32 (Qwen3's RMSNorm order).
void RmsNormHeads(int64_t rows, int64_t width, int64_t heads, int64_t head_dim,
                  const float* scale, float eps, float* values) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* x = values + t * width + h * head_dim;
      float squares = 0.0f;
      for (int64_t c = 0; c < head_dim; ++c) squares += x[c] * x[c];
      const float inverse =
          1.0f / std::sqrt(squares / static_cast<float>(head_dim) + eps);
      for (int64_t c = 0; c < head_dim; ++c) x[c] = scale[c] * (x[c] * inverse);
    }
  }
}

// scores [planes, rows, keys] of query rows first_row.. against keys first_key..,
// plane p of the model head heads[p % heads.size()]: + the relative bias.
void AddBiasToScores(const RelativeBias& bias, absl::Span<const int64_t> heads,
                     int64_t planes, int64_t first_row, int64_t rows, int64_t first_key,
                     int64_t keys, float* scores) {
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float* table = bias.Head(heads[static_cast<size_t>(plane) % heads.size()]);
    for (int64_t r = 0; r < rows; ++r) {
      AddRelativeBias(scores + (plane * rows + r) * keys, keys,
                      first_key - (first_row + r), table, bias.radius);
    }
  }
}

// The keys [begin, end) that query rows [first_row, first_row + rows) of a sequence
// may see: up to the last row when the masked triangle is skipped (`skip_masked`), and
// within `window` (> 0) of the first and last rows. The keys outside cost nothing.
struct KeyRange {
  int64_t begin = 0, end = 0;
};
KeyRange BlockKeys(int64_t first_row, int64_t rows, int64_t key_length, bool skip_masked,
                   int64_t window) {
  KeyRange range{0, skip_masked ? std::min(key_length, first_row + rows) : key_length};
  if (window > 0) {
    range.begin = std::max<int64_t>(0, first_row - window);
    range.end = std::min(range.end, first_row + rows + window);
  }
  return range;
}

// -inf over the scores [planes, rows, keys] of query rows first_row.. against keys
// first_key.. that a row does not see: those after it (causal) and those more than
// `window` (> 0) away. Writing -inf in place is cheaper than a mask post-op on oneDNN
// 2.6; the softmax turns them into weights of exactly 0, and each row keeps its own
// key.
void MaskScores(int64_t planes, int64_t first_row, int64_t rows, int64_t first_key,
                int64_t keys, bool causal, int64_t window, float* scores) {
  const float hidden = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = first_row + r;
    int64_t low = 0;
    int64_t high = causal ? i + 1 : first_key + keys;
    if (window > 0) {
      low = i - window;
      high = std::min(high, i + window + 1);
    }
    const int64_t visible_begin = std::clamp<int64_t>(low - first_key, 0, keys);
    const int64_t visible_end =
        std::clamp<int64_t>(high - first_key, visible_begin, keys);
    if (visible_begin == 0 && visible_end == keys) {
      continue;
    }
    for (int64_t plane = 0; plane < planes; ++plane) {
      float* row = scores + (plane * rows + r) * keys;
      std::fill(row, row + visible_begin, hidden);
      std::fill(row + visible_end, row + keys, hidden);
    }
  }
}

// Rotary position embedding of the rows [sum(lengths), width] of packed sequences, in
// place: in each of `heads` head slices (head_dim apart), pair (a, b) of frequency c
// turns by the angle of the row's position t in its sequence (from 0):
//   x_a' = x_a cos - x_b sin,  x_b' = x_b cos + x_a sin
// (transformers' q * cos + rotate_half(q) * sin, in its order of f32 operations), with
// (a, b) = (c, c + pairs), or (2c, 2c + 1) when `interleaved`. `table` row t holds the
// pairs' cosines, then their sines (MultiHeadAttention::RotaryTable).
void RotateHeads(absl::Span<const int64_t> lengths, int64_t width, int64_t heads,
                 int64_t head_dim, const float* table, int64_t pairs, bool interleaved,
                 float* rows) {
  float* row = rows;
  for (const int64_t length : lengths) {
    for (int64_t t = 0; t < length; ++t, row += width) {
      const float* cosine = table + t * 2 * pairs;
      const float* sine = cosine + pairs;
      for (int64_t h = 0; h < heads; ++h) {
        float* x = row + h * head_dim;
        if (interleaved) {
          for (int64_t c = 0; c < pairs; ++c) {
            const float a = x[2 * c];
            const float b = x[2 * c + 1];
            x[2 * c] = a * cosine[c] - b * sine[c];
            x[2 * c + 1] = b * cosine[c] + a * sine[c];
          }
        } else {
          float* y = x + pairs;
          for (int64_t c = 0; c < pairs; ++c) {
            const float a = x[c];
            const float b = y[c];
            x[c] = a * cosine[c] - b * sine[c];
            y[c] = b * cosine[c] + a * sine[c];
          }
        }
      }
    }
  }
}

}  // namespace

absl::StatusOr<dnnl::engine> CreateCpuEngine() {
  try {
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  } catch (const dnnl::error& e) {
    return FromDnnlError(e, "create the CPU engine");
  }
}

namespace {

std::string DescribePath(const ModelSpec& spec, bool native_bf16) {
  if (spec.precision == Precision::kInt8) {
    const Int8Levels levels = Int8LevelsForCpu();
    return absl::StrCat(
        "int8 projections (u8s8 with int32 sums, ", IsaName(),
        levels.weight == 127 ? ": VNNI, 8-bit weights" : ": no VNNI, 7-bit weights",
        "), attention in f32");
  }
  if (spec.precision != Precision::kBf16) return "fp32";
  if (native_bf16) return absl::StrCat("bf16 (native, ", IsaName(), ")");
  return absl::StrCat("bf16 weights, f32 compute (", IsaName(),
                      MultiHeadAttention::SupportsBf16() ? ", native bf16 turned off)"
                                                         : " has no native bf16)");
}

}  // namespace

std::string MultiHeadAttention::ComputePath() const {
  return DescribePath(spec_, compute_ == memory::data_type::bf16);
}

std::string MultiHeadAttention::DefaultComputePath(const ModelSpec& spec) {
  return DescribePath(spec, SupportsBf16());
}

bool MultiHeadAttention::SupportsBf16() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & bf16) == bf16;
}

absl::StatusOr<std::unique_ptr<MultiHeadAttention>> MultiHeadAttention::Create(
    const ModelSpec& spec, const AttentionWeights& weights, const dnnl::engine& engine) {
  return Create(spec, weights, engine, Options());
}

absl::StatusOr<std::unique_ptr<MultiHeadAttention>> MultiHeadAttention::Create(
    const ModelSpec& spec, const AttentionWeights& weights, const dnnl::engine& engine,
    const Options& options) {
  ATTN_RETURN_IF_ERROR(spec.Validate());
  ATTN_RETURN_IF_ERROR(weights.CheckShapes(spec));
  if (options.intra_op_threads < 0 || options.intra_op_threads > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat("intra_op_threads must be in [0, ",
                                                   kMaxThreads, "], got ",
                                                   options.intra_op_threads));
  }
  if (options.primitive_cache_capacity < 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "primitive_cache_capacity must be >= 4, got ", options.primitive_cache_capacity));
  }
  if (options.attention_block_bytes < 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention_block_bytes must be >= 1024, got ", options.attention_block_bytes));
  }
  bool native_bf16 = false;
  if (spec.precision == Precision::kBf16) {
    switch (options.bf16_compute) {
      case Options::Bf16Compute::kAuto:
        native_bf16 = SupportsBf16();
        break;
      case Options::Bf16Compute::kNative:
        if (!SupportsBf16()) {
          // On plain AVX-512 or AVX2 oneDNN emulates bf16 products, slower than fp32.
          return absl::FailedPreconditionError(absl::StrCat(
              "native bf16 needs a CPU with AVX512_BF16 or AMX; oneDNN's ISA here is ",
              IsaName(), ": use bf16_compute auto or float32"));
        }
        native_bf16 = true;
        break;
      case Options::Bf16Compute::kFloat32:
        native_bf16 = false;
        break;
    }
  }
  if (engine.get_kind() != dnnl::engine::kind::cpu) {
    return absl::UnimplementedError(
        "the attention core runs on CPU engines only for now (per-sequence views "
        "use host pointers)");
  }
  std::unique_ptr<MultiHeadAttention> attention;
  try {
    attention.reset(new MultiHeadAttention(spec, engine, options, native_bf16));
  } catch (const dnnl::error& e) {
    return FromDnnlError(e, "create a stream");
  }
  const int64_t d = spec.d_model;
  const int64_t head_dim = spec.head_dim();
  const int64_t kv = spec.kv_width();
  const int64_t w = spec.q_width();
  const auto rows = [&](int64_t first_row, int64_t count) {
    return std::vector<float>(weights.in_proj_weight.begin() + first_row * d,
                              weights.in_proj_weight.begin() + (first_row + count) * d);
  };
  const auto bias = [&](int64_t first, int64_t count) {
    return std::vector<float>(weights.in_proj_bias.begin() + first,
                              weights.in_proj_bias.begin() + first + count);
  };
  HeadSet all;
  all.heads.resize(spec.num_heads);
  for (int64_t h = 0; h < spec.num_heads; ++h) all.heads[h] = h;
  all.width = w;
  all.kv_heads.resize(spec.kv_heads());
  for (int64_t h = 0; h < spec.kv_heads(); ++h) all.kv_heads[h] = h;
  for (int64_t h = 0; h < spec.num_heads; ++h) all.kv_of.push_back(spec.KvHead(h));
  all.CountShare(head_dim);
  all.query_weight.plain = rows(0, w);
  all.key_weight.plain = rows(w, kv);
  all.value_weight.plain = rows(w + kv, kv);
  all.query_bias = bias(0, w);
  all.key_bias = bias(w, kv);
  all.value_bias = bias(w + kv, kv);
  all.out_weight.plain = weights.out_proj_weight;
  // softmax(Q K^T / sqrt(head_dim)): scaling the query projection (weights and bias)
  // once here costs nothing per call; with a query norm, its scale instead.
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (spec.qk_norm) {
    attention->query_norm_ = weights.query_norm_weight;
    for (float& w : attention->query_norm_) w *= scale;
    attention->key_norm_ = weights.key_norm_weight;
  } else {
    for (float& w : all.query_weight.plain) w *= scale;
    for (float& b : all.query_bias) b *= scale;
  }
  if (spec.precision == Precision::kBf16 && !native_bf16) {
    // The model is a bf16 model on every CPU: its weights take the values the native
    // path's reorder would give them (round to nearest even, after the scale), and
    // only the arithmetic is f32.
    for (Matrix* matrix :
         {&all.query_weight, &all.key_weight, &all.value_weight, &all.out_weight}) {
      for (float& w : matrix->plain) w = Bf16ToFloat(FloatToBf16(w));
    }
  }
  if (spec.pruned_heads.empty()) {
    attention->model_heads_ = std::move(all);
  } else {
    std::vector<int64_t> kept;
    for (int64_t h = 0; h < spec.num_heads; ++h) {
      if (!spec.IsPruned(h)) kept.push_back(h);
    }
    const std::vector<float> ones(kept.size(), 1.0f);
    attention->model_heads_ = SliceHeads(all, d, head_dim, kept, ones);
  }
  attention->out_bias_ = weights.out_proj_bias;
  using Kernel = Options::AttentionKernel;
  attention->attention_choice_.flash = options.attention_kernel != Kernel::kBlocks;
  attention->attention_choice_.tiles = options.flash_tiles;
  if (options.attention_kernel == Kernel::kAuto && !native_bf16) {
    ATTN_RETURN_IF_ERROR(attention->ChooseAttentionKernel());
  }
  return attention;
}

MultiHeadAttention::MultiHeadAttention(const ModelSpec& spec, const dnnl::engine& engine,
                                       const Options& options, bool native_bf16)
    : spec_(spec),
      compute_(native_bf16 ? memory::data_type::bf16 : memory::data_type::f32),
      compute_bytes_(native_bf16 ? 2 : 4),
      int8_(spec.precision == Precision::kInt8),
      int8_levels_(Int8LevelsForCpu()),
      engine_(engine),
      stream_(engine),
      options_(options),
      cache_(static_cast<size_t>(options.primitive_cache_capacity)) {}

void MultiHeadAttention::HeadSet::CountShare(int64_t head_dim) {
  kv_width = static_cast<int64_t>(kv_heads.size()) * head_dim;
  std::vector<int64_t> served(kv_heads.size(), 0);
  for (const int64_t position : kv_of) ++served[static_cast<size_t>(position)];
  share = served.empty() ? 1 : served[0];
  for (const int64_t count : served) {
    if (count != share) share = 0;
  }
}

MultiHeadAttention::HeadSet MultiHeadAttention::SliceHeads(
    const HeadSet& from, int64_t d_model, int64_t head_dim,
    absl::Span<const int64_t> positions, absl::Span<const float> factors) {
  HeadSet set;
  set.width = static_cast<int64_t>(positions.size()) * head_dim;
  const size_t slice = static_cast<size_t>(head_dim * d_model);
  // A head's rows of W_q, W_k, W_v are one contiguous [head_dim, d] block.
  const auto append_rows = [&](const Matrix& source, int64_t position, Matrix& target) {
    target.plain.insert(target.plain.end(), source.plain.begin() + position * slice,
                        source.plain.begin() + (position + 1) * slice);
  };
  const auto append_bias = [&](const std::vector<float>& source, int64_t position,
                               std::vector<float>& target) {
    target.insert(target.end(), source.begin() + position * head_dim,
                  source.begin() + (position + 1) * head_dim);
  };
  for (const int64_t position : positions) {
    set.heads.push_back(from.heads[position]);
    append_rows(from.query_weight, position, set.query_weight);
    append_bias(from.query_bias, position, set.query_bias);
    // The key/value heads the chosen heads read, each once (positions ascend, and so
    // do their key/value heads).
    const int64_t kv_position = from.kv_of[position];
    if (set.kv_heads.empty() || set.kv_heads.back() != from.kv_heads[kv_position]) {
      set.kv_heads.push_back(from.kv_heads[kv_position]);
      append_rows(from.key_weight, kv_position, set.key_weight);
      append_rows(from.value_weight, kv_position, set.value_weight);
      append_bias(from.key_bias, kv_position, set.key_bias);
      append_bias(from.value_bias, kv_position, set.value_bias);
    }
    set.kv_of.push_back(static_cast<int64_t>(set.kv_heads.size()) - 1);
  }
  set.CountShare(head_dim);
  // W_out is [d, from.width]: keep each row's columns of the chosen heads, scaled.
  set.out_weight.plain.resize(static_cast<size_t>(d_model * set.width));
  for (int64_t o = 0; o < d_model; ++o) {
    for (size_t p = 0; p < positions.size(); ++p) {
      const float* source =
          from.out_weight.plain.data() + o * from.width + positions[p] * head_dim;
      float* target = set.out_weight.plain.data() + o * set.width + p * head_dim;
      for (int64_t c = 0; c < head_dim; ++c) target[c] = factors[p] * source[c];
    }
  }
  return set;
}

MultiHeadAttention::HeadSet& MultiHeadAttention::SelectHeads(
    absl::Span<const float> head_mask) {
  if (head_mask.empty()) return model_heads_;
  std::vector<int64_t> positions;
  std::vector<float> factors;
  bool all_ones = true;
  for (size_t p = 0; p < model_heads_.heads.size(); ++p) {
    const float factor = head_mask[model_heads_.heads[p]];
    all_ones &= factor == 1.0f;
    if (factor > 0.0f) {
      positions.push_back(static_cast<int64_t>(p));
      factors.push_back(factor);
    }
  }
  if (all_ones) return model_heads_;
  std::vector<float> key(head_mask.begin(), head_mask.end());
  auto it = masked_heads_.find(key);
  if (it != masked_heads_.end()) return *it->second;
  if (masked_heads_.size() >= kMaskedHeadSets) masked_heads_.clear();
  auto set = std::make_unique<HeadSet>(
      SliceHeads(model_heads_, spec_.d_model, spec_.head_dim(), positions, factors));
  return *masked_heads_.emplace(std::move(key), std::move(set)).first->second;
}

const dnnl::memory& MultiHeadAttention::Packed(Matrix& matrix, int64_t in, int64_t out,
                                               const memory::desc& desc) {
  for (const auto& [layout, packed] : matrix.packed) {
    if (layout == desc) return packed;
  }
  // int8 primitives take the codes (quantized on first use); the others the weights.
  memory plain(ProjectionWeights(in, out), engine_, matrix.plain.data());
  if (desc.data_type() == memory::data_type::s8) {
    if (matrix.quantized.values.empty()) {
      matrix.quantized =
          QuantizeWeights(matrix.plain.data(), out, in, int8_levels_.weight);
    }
    plain = memory(memory::desc({in, out}, memory::data_type::s8, memory::format_tag::ba),
                   engine_, matrix.quantized.values.data());
  }
  memory packed(desc, engine_);
  dnnl::reorder(plain, packed).execute(stream_, plain, packed);
  stream_.wait();
  matrix.packed.emplace_back(desc, std::move(packed));
  return matrix.packed.back().second;
}

dnnl::memory::desc MultiHeadAttention::HeadRowsView(int64_t count, int64_t heads,
                                                    int64_t rows, int64_t width,
                                                    int64_t share) const {
  const int64_t head_dim = spec_.head_dim();
  if (share > 1) {
    if (count > 1) {
      return memory::desc({count, heads / share, share, rows, head_dim}, compute_,
                          {rows * width, share * head_dim, head_dim, width, 1});
    }
    return memory::desc({heads / share, share, rows, head_dim}, compute_,
                        {share * head_dim, head_dim, width, 1});
  }
  if (count > 1) {
    return memory::desc({count, heads, rows, head_dim}, compute_,
                        {rows * width, head_dim, width, 1});
  }
  return memory::desc({heads, rows, head_dim}, compute_, {head_dim, width, 1});
}

dnnl::memory::desc MultiHeadAttention::KvRowsView(int64_t count, int64_t heads,
                                                  int64_t rows, int64_t kv_width,
                                                  int64_t share) const {
  if (share <= 1) return HeadRowsView(count, heads, rows, kv_width);
  const int64_t head_dim = spec_.head_dim();
  if (count > 1) {
    return memory::desc({count, heads / share, 1, rows, head_dim}, compute_,
                        {rows * kv_width, head_dim, head_dim, kv_width, 1});
  }
  return memory::desc({heads / share, 1, rows, head_dim}, compute_,
                      {head_dim, head_dim, kv_width, 1});
}

dnnl::memory::desc MultiHeadAttention::KvColumnsView(int64_t count, int64_t heads,
                                                     int64_t length, int64_t kv_width,
                                                     int64_t share) const {
  const int64_t head_dim = spec_.head_dim();
  if (share > 1) {
    if (count > 1) {
      return memory::desc({count, heads / share, 1, head_dim, length}, compute_,
                          {length * kv_width, head_dim, head_dim, 1, kv_width});
    }
    return memory::desc({heads / share, 1, head_dim, length}, compute_,
                        {head_dim, head_dim, 1, kv_width});
  }
  if (count > 1) {
    return memory::desc({count, heads, head_dim, length}, compute_,
                        {length * kv_width, head_dim, 1, kv_width});
  }
  return memory::desc({heads, head_dim, length}, compute_, {head_dim, 1, kv_width});
}

absl::Status MultiHeadAttention::Forward(const AttentionBatch& batch,
                                         const AttentionOptions& options,
                                         absl::Span<float> output,
                                         absl::Span<float> attention_weights) {
  ATTN_RETURN_IF_ERROR(
      CheckForwardArguments(spec_, batch, options, output, attention_weights));
  if (options_.intra_op_threads > 0) {
    // Per-thread OpenMP setting: it governs the parallel regions oneDNN opens from
    // this thread only, so objects on other threads keep their own counts.
    omp_set_num_threads(options_.intra_op_threads);
  }
  try {
    return ForwardImpl(batch, options, output, attention_weights);
  } catch (const dnnl::error& e) {
    return FromDnnlError(e, "run attention");
  }
}

absl::Status MultiHeadAttention::HeadStatistics(const AttentionBatch& batch, bool causal,
                                                absl::Span<HeadStatistic> statistics) {
  const int64_t d = spec_.d_model;
  const int64_t head_dim = spec_.head_dim();
  ATTN_ASSIGN_OR_RETURN(const int64_t tokens,
                        RowStatisticsByForward(*this, batch, causal, statistics));
  // Output terms: Forward left the context of the model's heads in the scratch context,
  // [tokens, width] in the compute precision; head p's term is its slice times its W_out
  // columns.
  const HeadSet& set = model_heads_;
  const auto* context = static_cast<const uint8_t*>(scratch_->context.Reserve(0));
  std::vector<float> slice(static_cast<size_t>(head_dim));
  for (int64_t t = 0; t < tokens; ++t) {
    for (size_t p = 0; p < set.heads.size(); ++p) {
      const uint8_t* source =
          context + (t * set.width + static_cast<int64_t>(p) * head_dim) * compute_bytes_;
      for (int64_t c = 0; c < head_dim; ++c) {
        if (compute_bytes_ == 4) {
          std::memcpy(&slice[c], source + 4 * c, 4);
        } else {
          uint16_t bits;
          std::memcpy(&bits, source + 2 * c, 2);
          slice[c] = Bf16ToFloat(bits);
        }
      }
      double squares = 0.0;
      for (int64_t o = 0; o < d; ++o) {
        const float* column = set.out_weight.plain.data() + o * set.width + p * head_dim;
        float term = 0.0f;
        for (int64_t c = 0; c < head_dim; ++c) term += slice[c] * column[c];
        squares += static_cast<double>(term) * term;
      }
      statistics[set.heads[p]].mean_output_norm += std::sqrt(squares);
    }
  }
  for (const int64_t head : set.heads) {
    statistics[head].mean_output_norm /= static_cast<double>(tokens);
  }
  return absl::OkStatus();
}

absl::Status MultiHeadAttention::ForwardImpl(const AttentionBatch& batch,
                                             const AttentionOptions& options,
                                             absl::Span<float> output,
                                             absl::Span<float> attention_weights) {
  const int64_t d = spec_.d_model;
  const int64_t heads = spec_.num_heads;
  const bool cross = !batch.memory_lengths.empty();
  const absl::Span<const int64_t> key_lengths =
      cross ? batch.memory_lengths : batch.query_lengths;
  int64_t query_tokens = 0;
  for (int64_t length : batch.query_lengths) query_tokens += length;
  int64_t key_tokens = query_tokens;
  if (cross) {
    key_tokens = 0;
    for (int64_t length : batch.memory_lengths) key_tokens += length;
  }

  HeadSet& set = SelectHeads(options.head_mask);
  const int64_t width = set.width;
  const int64_t kv_width = set.kv_width;
  const int64_t head_dim = spec_.head_dim();
  computed_heads_ = static_cast<int64_t>(set.heads.size());
  if (!attention_weights.empty() && static_cast<int64_t>(set.heads.size()) < heads) {
    // Pruned heads' weights read as zeros; the computed ones overwrite theirs.
    std::fill(attention_weights.begin(), attention_weights.end(), 0.0f);
  }
  if (width == 0) {
    // Every head pruned: nothing reaches W_out, so each row is its bias.
    for (int64_t t = 0; t < query_tokens; ++t) {
      std::copy(out_bias_.begin(), out_bias_.end(), output.begin() + t * d);
    }
    return absl::OkStatus();
  }

  // The inputs in the compute precision (converted once, here, when they are not).
  ATTN_ASSIGN_OR_RETURN(
      const void* query,
      InComputePrecision(batch.query, batch.query_bf16, scratch_->query_input));
  const void* key_source = query;
  if (cross) {
    ATTN_ASSIGN_OR_RETURN(key_source, InComputePrecision(batch.memory, batch.memory_bf16,
                                                         scratch_->memory_input));
  }

  // Projections run once over all packed tokens: Q of the computed heads, K and V of
  // the key/value heads they read, land in three dense planes, [tokens, width] and
  // [tokens, kv_width] (strided views of one buffer would leave oneDNN's fast path).
  auto* q =
      static_cast<uint8_t*>(scratch_->q.Reserve(query_tokens * width * compute_bytes_));
  auto* k =
      static_cast<uint8_t*>(scratch_->k.Reserve(key_tokens * kv_width * compute_bytes_));
  auto* v =
      static_cast<uint8_t*>(scratch_->v.Reserve(key_tokens * kv_width * compute_bytes_));
  auto* context = static_cast<uint8_t*>(
      scratch_->context.Reserve(query_tokens * width * compute_bytes_));
  // The query and key norms, then rotary positions (self-attention only): Q and K
  // change in f32 after their bias.
  const AttentionOptions::Rotary& rotary = options.rotary;
  const int64_t rotary_pairs = static_cast<int64_t>(rotary.inv_freq.size());
  const float* rotary_table = nullptr;
  if (!rotary.empty()) {
    rotary_table = RotaryTable(
        rotary.inv_freq,
        *std::max_element(batch.query_lengths.begin(), batch.query_lengths.end()));
  }
  const bool turn = !rotary.empty() || spec_.qk_norm;
  // `plane` is Q (queries) or K: [tokens, plane_width] in f32.
  const auto norm_and_rotate = [&](bool queries, float* plane) {
    const int64_t plane_width = queries ? width : kv_width;
    const int64_t tokens = queries ? query_tokens : key_tokens;
    if (spec_.qk_norm) {
      RmsNormHeads(tokens, plane_width, plane_width / head_dim, head_dim,
                   queries ? query_norm_.data() : key_norm_.data(), spec_.qk_norm_eps,
                   plane);
    }
    if (!rotary.empty()) {
      RotateHeads(batch.query_lengths, plane_width, plane_width / head_dim, head_dim,
                  rotary_table, rotary_pairs, rotary.interleaved, plane);
    }
  };
  if (int8_) {
    // Each input quantized once for the projections that read it.
    const QuantizedRows query_codes =
        QuantizeInput(static_cast<const float*>(query), query_tokens, d,
                      scratch_->query_codes, scratch_->query_parameters);
    const QuantizedRows key_codes =
        cross ? QuantizeInput(static_cast<const float*>(key_source), key_tokens, d,
                              scratch_->memory_codes, scratch_->memory_parameters)
              : query_codes;
    ATTN_RETURN_IF_ERROR(ProjectInt8(query_codes, query_tokens, d, set.query_weight,
                                     set.query_bias.data(), width,
                                     reinterpret_cast<float*>(q)));
    ATTN_RETURN_IF_ERROR(ProjectInt8(key_codes, key_tokens, d, set.key_weight,
                                     set.key_bias.data(), kv_width,
                                     reinterpret_cast<float*>(k)));
    ATTN_RETURN_IF_ERROR(ProjectInt8(key_codes, key_tokens, d, set.value_weight,
                                     set.value_bias.data(), kv_width,
                                     reinterpret_cast<float*>(v)));
  } else if (turn && compute_ != memory::data_type::f32) {
    // Native bf16: Q and K come out of their products in f32 (the accumulators, not
    // bf16 outputs), change there, and are narrowed to bf16 once, so that they carry
    // one rounding as without a norm or rotary rather than two.
    auto* projected = static_cast<float*>(scratch_->rotary_projection.Reserve(
        std::max(query_tokens * width, key_tokens * kv_width) * sizeof(float)));
    for (const auto& [queries, weight, bias, plane] :
         {std::tuple(true, &set.query_weight, set.query_bias.data(), q),
          std::tuple(false, &set.key_weight, set.key_bias.data(), k)}) {
      const int64_t tokens = queries ? query_tokens : key_tokens;
      const int64_t plane_width = queries ? width : kv_width;
      ATTN_RETURN_IF_ERROR(Project(PrimitiveKind::kOutProjection,
                                   queries ? query : key_source, tokens, d, *weight, bias,
                                   plane_width, projected));
      norm_and_rotate(queries, projected);
      ATTN_RETURN_IF_ERROR(Convert(projected, false, tokens * plane_width, plane));
    }
    ATTN_RETURN_IF_ERROR(Project(PrimitiveKind::kProjection, key_source, key_tokens, d,
                                 set.value_weight, set.value_bias.data(), kv_width, v));
  } else {
    ATTN_RETURN_IF_ERROR(Project(PrimitiveKind::kProjection, query, query_tokens, d,
                                 set.query_weight, set.query_bias.data(), width, q));
    ATTN_RETURN_IF_ERROR(Project(PrimitiveKind::kProjection, key_source, key_tokens, d,
                                 set.key_weight, set.key_bias.data(), kv_width, k));
    ATTN_RETURN_IF_ERROR(Project(PrimitiveKind::kProjection, key_source, key_tokens, d,
                                 set.value_weight, set.value_bias.data(), kv_width, v));
  }
  if (turn && compute_ == memory::data_type::f32) {
    norm_and_rotate(true, reinterpret_cast<float*>(q));
    norm_and_rotate(false, reinterpret_cast<float*>(k));
  }

  int64_t query_offset = 0;
  int64_t key_offset = 0;
  int64_t weights_offset = 0;
  const int64_t row_bytes = width * compute_bytes_;
  const int64_t kv_row_bytes = kv_width * compute_bytes_;
  // Long sequences go to FlashAttention together, after the loop: its items of every
  // sequence share the threads.
  const bool flash_allowed =
      compute_ == memory::data_type::f32 && attention_weights.empty();
  std::vector<FlashSequence> flash;
  for (size_t i = 0; i < batch.query_lengths.size();) {
    const int64_t query_length = batch.query_lengths[i];
    const int64_t key_length = key_lengths[i];
    if (flash_allowed && UseFlash(set, query_length, key_length, options.causal)) {
      flash.push_back({reinterpret_cast<const float*>(q + query_offset * row_bytes),
                       reinterpret_cast<const float*>(k + key_offset * kv_row_bytes),
                       reinterpret_cast<const float*>(v + key_offset * kv_row_bytes),
                       reinterpret_cast<float*>(context + query_offset * row_bytes),
                       query_length, key_length});
      query_offset += query_length;
      key_offset += key_length;
      ++i;
      continue;
    }
    // Sequences of equal lengths run together: one call per primitive for the run.
    const int64_t count =
        RunLength(set, batch.query_lengths, key_lengths, i, options.causal);
    float* probabilities =
        attention_weights.empty() ? nullptr : attention_weights.data() + weights_offset;
    ATTN_RETURN_IF_ERROR(AttendSequences(
        set, count, q + query_offset * row_bytes, k + key_offset * kv_row_bytes,
        v + key_offset * kv_row_bytes, query_length, key_length, options, probabilities,
        context + query_offset * row_bytes));
    query_offset += count * query_length;
    key_offset += count * key_length;
    weights_offset += count * heads * query_length * key_length;
    i += static_cast<size_t>(count);
  }
  if (!flash.empty()) {
    ATTN_RETURN_IF_ERROR(FlashAttention(
        flash, static_cast<int64_t>(set.heads.size()), head_dim, width, options.causal,
        attention_choice_.tiles, kParallelBlocks ? omp_get_max_threads() : 1,
        scratch_->flash, options.relative_bias, set.heads, options.window,
        FlashKv{set.kv_of, kv_width}));
  }
  // The heads' factors are folded into the set's W_out columns.
  if (int8_) {
    const QuantizedRows context_codes =
        QuantizeInput(reinterpret_cast<const float*>(context), query_tokens, width,
                      scratch_->query_codes, scratch_->query_parameters);
    return ProjectInt8(context_codes, query_tokens, width, set.out_weight,
                       out_bias_.data(), d, output.data());
  }
  return Project(PrimitiveKind::kOutProjection, context, query_tokens, width,
                 set.out_weight, out_bias_.data(), d, output.data());
}

int64_t MultiHeadAttention::ScoresBytes(const HeadSet& set, int64_t query_length,
                                        int64_t key_length) {
  return static_cast<int64_t>(set.heads.size()) * query_length * key_length *
         static_cast<int64_t>(sizeof(float));
}

bool MultiHeadAttention::IsLong(const HeadSet& set, int64_t query_length,
                                int64_t key_length, bool causal) const {
  return ScoresBytes(set, query_length, key_length) > options_.attention_block_bytes ||
         (causal && query_length >= kCausalBlockedLength);
}

bool MultiHeadAttention::UseFlash(const HeadSet& set, int64_t query_length,
                                  int64_t key_length, bool causal) const {
  if (options_.attention_kernel == Options::AttentionKernel::kFlash) return true;
  return attention_choice_.flash && IsLong(set, query_length, key_length, causal);
}

int64_t MultiHeadAttention::RunLength(const HeadSet& set,
                                      absl::Span<const int64_t> query_lengths,
                                      absl::Span<const int64_t> key_lengths, size_t index,
                                      bool causal) const {
  const int64_t query_length = query_lengths[index];
  const int64_t key_length = key_lengths[index];
  // Only sequences whose heads all run in one block (AttendSequences' short path), and
  // as many as keep the run's scores within the block budget.
  if (IsLong(set, query_length, key_length, causal)) return 1;
  const int64_t most = std::max<int64_t>(
      1, options_.attention_block_bytes / ScoresBytes(set, query_length, key_length));
  int64_t count = 1;
  while (index + count < query_lengths.size() && count < most &&
         query_lengths[index + count] == query_length &&
         key_lengths[index + count] == key_length) {
    ++count;
  }
  return count;
}

absl::StatusOr<CachedPrimitive*> MultiHeadAttention::GetPrimitive(
    PrimitiveKind kind, const PrimitiveDims& dims) {
  const auto create = [&]() -> absl::StatusOr<CachedPrimitive> {
    try {
      const dnnl::primitive_attr attr = UserScratchpadAttr();
      CachedPrimitive created;
      const auto finish = [&](const auto& pd) {
        created.scratchpad_bytes = pd.scratchpad_desc().get_size();
      };
      switch (kind) {
        case PrimitiveKind::kProjection:
        case PrimitiveKind::kOutProjection: {
          const auto [rows, in, out, runtime_rows, unused_count, unused_kv,
                      unused_share] = dims;
          // [rows, in] x W^T, with W in whatever layout the implementation runs
          // fastest from (reordered once, see Packed); with runtime rows oneDNN needs
          // a fixed layout, and W is read as stored.
          const memory::desc weights =
              runtime_rows != 0
                  ? ProjectionWeights(in, out)
                  : memory::desc({in, out}, compute_, memory::format_tag::any);
          const memory::data_type out_type =
              kind == PrimitiveKind::kProjection ? compute_ : memory::data_type::f32;
          const dnnl::matmul::desc desc(Plain2d(rows, in, compute_), weights,
                                        Plain2d(1, out), Plain2d(rows, out, out_type));
          const dnnl::matmul::primitive_desc pd(desc, attr, engine_);
          created.primitive = dnnl::matmul(pd);
          created.weights_desc = pd.weights_desc();
          finish(pd);
          break;
        }
        case PrimitiveKind::kScores: {
          const auto [heads, rows, keys, width, count, kv_width, share] = dims;
          const dnnl::matmul::desc desc(
              HeadRowsView(count, heads, rows, width, share),
              KvColumnsView(count, heads, keys, kv_width, share),
              GroupedScoresDesc(count, heads, rows, keys, share));
          const dnnl::matmul::primitive_desc pd(desc, attr, engine_);
          created.primitive = dnnl::matmul(pd);
          finish(pd);
          break;
        }
        case PrimitiveKind::kSoftmax: {
          const auto [heads, rows, keys, to_compute, count, unused_kv, unused_share] =
              dims;
          const memory::desc source = ScoresDesc(count, heads, rows, keys);
          const memory::desc target =
              to_compute != 0 ? ScoresDesc(count, heads, rows, keys, compute_) : source;
          const dnnl::softmax_v2_forward::desc desc(dnnl::prop_kind::forward_inference,
                                                    dnnl::algorithm::softmax_accurate,
                                                    source, target, count > 1 ? 3 : 2);
          const dnnl::softmax_v2_forward::primitive_desc pd(desc, attr, engine_);
          created.primitive = dnnl::softmax_v2_forward(pd);
          finish(pd);
          break;
        }
        case PrimitiveKind::kContext: {
          const auto [heads, rows, keys, width, count, kv_width, share] = dims;
          const dnnl::matmul::desc desc(
              GroupedScoresDesc(count, heads, rows, keys, share, compute_),
              KvRowsView(count, heads, keys, kv_width, share),
              HeadRowsView(count, heads, rows, width, share));
          const dnnl::matmul::primitive_desc pd(desc, attr, engine_);
          created.primitive = dnnl::matmul(pd);
          finish(pd);
          break;
        }
        case PrimitiveKind::kInt8Projection: {
          const auto [rows, in, out, unused, unused_count, unused_kv, unused_share] =
              dims;
          const memory::desc weights({in, out}, memory::data_type::s8,
                                     memory::format_tag::any);
          const dnnl::matmul::desc desc(Plain2d(rows, in, memory::data_type::u8), weights,
                                        Plain2d(rows, out, memory::data_type::s32));
          const dnnl::matmul::primitive_desc pd(desc, attr, engine_);
          created.primitive = dnnl::matmul(pd);
          created.weights_desc = pd.weights_desc();
          finish(pd);
          break;
        }
        case PrimitiveKind::kLinear:
        case PrimitiveKind::kLayerNorm:
        case PrimitiveKind::kAdd:
        case PrimitiveKind::kActivation:
        case PrimitiveKind::kGateProduct:
          return absl::InternalError("the encoder's primitive kinds are not attention's");
        case PrimitiveKind::kConvert: {
          const memory::desc source(
              {dims[0]}, dims[1] != 0 ? memory::data_type::bf16 : memory::data_type::f32,
              memory::format_tag::a);
          const memory::desc target({dims[0]}, compute_, memory::format_tag::a);
          const dnnl::reorder::primitive_desc pd(engine_, source, engine_, target, attr);
          created.primitive = dnnl::reorder(pd);
          finish(pd);
          break;
        }
      }
      return created;
    } catch (const dnnl::error& e) {
      return FromDnnlError(
          e, absl::StrCat("create a primitive for shape (", dims[0], ", ", dims[1], ", ",
                          dims[2], ", ", dims[3], ")"));
    }
  };
  return cache_.GetOrCreate(PrimitiveKey{kind, dims}, create);
}

absl::Status MultiHeadAttention::Execute(CachedPrimitive& primitive,
                                         std::initializer_list<ExecArg> args) {
  void* scratchpad = scratch_->scratchpad.Reserve(primitive.scratchpad_bytes);
  // The same id always has the same layout for one primitive (its key fixes the
  // shapes), so a memory object made once is only re-pointed afterwards.
  const auto bind = [&](int id, const memory::desc& desc, void* data) {
    auto it = primitive.args.find(id);
    if (it == primitive.args.end()) {
      primitive.args.emplace(id, memory(desc, engine_, data));
    } else if (it->second.get_desc() == desc) {
      it->second.set_data_handle(data);
    } else {
      it->second = memory(desc, engine_, data);  // a runtime dimension changed
    }
  };
  for (const ExecArg& arg : args) bind(arg.id, arg.desc, const_cast<void*>(arg.data));
  if (primitive.scratchpad_bytes > 0) {
    bind(DNNL_ARG_SCRATCHPAD,
         memory::desc({static_cast<int64_t>(primitive.scratchpad_bytes)},
                      memory::data_type::u8, memory::format_tag::a),
         scratchpad);
  }
  primitive.primitive.execute(stream_, primitive.args);
  stream_.wait();
  return absl::OkStatus();
}

absl::Status MultiHeadAttention::Project(PrimitiveKind kind, const void* in, int64_t rows,
                                         int64_t in_width, Matrix& weight,
                                         const float* bias, int64_t out_width,
                                         void* out) {
  // In fp32 both kinds are the same primitive.
  if (compute_ == memory::data_type::f32) kind = PrimitiveKind::kProjection;
  const memory::data_type out_type =
      kind == PrimitiveKind::kProjection ? compute_ : memory::data_type::f32;
  const int64_t out_bytes = out_type == memory::data_type::f32 ? 4 : 2;
  // In chunks of a few row counts (row_chunks.h), not one primitive per token count.
  return ForEachRowChunk(rows, [&](int64_t first, int64_t chunk) -> absl::Status {
    const void* chunk_in =
        static_cast<const uint8_t*>(in) + first * in_width * compute_bytes_;
    void* chunk_out = static_cast<uint8_t*>(out) + first * out_width * out_bytes;
    ATTN_ASSIGN_OR_RETURN(const bool runtime_rows,
                          UseRuntimeRows(kind, in_width, weight, bias, out_width));
    return ProjectChunk(kind, runtime_rows, chunk_in, chunk, in_width, weight, bias,
                        out_width, chunk_out);
  });
}

absl::Status MultiHeadAttention::ProjectChunk(PrimitiveKind kind, bool runtime_rows,
                                              const void* in, int64_t rows,
                                              int64_t in_width, Matrix& weight,
                                              const float* bias, int64_t out_width,
                                              void* out) {
  const memory::data_type out_type =
      kind == PrimitiveKind::kProjection ? compute_ : memory::data_type::f32;
  if (runtime_rows) {
    ATTN_ASSIGN_OR_RETURN(
        CachedPrimitive * primitive,
        GetPrimitive(kind, {DNNL_RUNTIME_DIM_VAL, in_width, out_width, 1, 0}));
    return Execute(*primitive, {{DNNL_ARG_SRC, Plain2d(rows, in_width, compute_), in},
                                {DNNL_ARG_WEIGHTS, ProjectionWeights(in_width, out_width),
                                 weight.plain.data()},
                                {DNNL_ARG_BIAS, Plain2d(1, out_width), bias},
                                {DNNL_ARG_DST, Plain2d(rows, out_width, out_type), out}});
  }
  ATTN_ASSIGN_OR_RETURN(CachedPrimitive * primitive,
                        GetPrimitive(kind, {rows, in_width, out_width, 0, 0}));
  const memory& packed = Packed(weight, in_width, out_width, primitive->weights_desc);
  return Execute(*primitive,
                 {{DNNL_ARG_SRC, Plain2d(rows, in_width, compute_), in},
                  {DNNL_ARG_WEIGHTS, primitive->weights_desc, packed.get_data_handle()},
                  {DNNL_ARG_BIAS, Plain2d(1, out_width), bias},
                  {DNNL_ARG_DST, Plain2d(rows, out_width, out_type), out}});
}

absl::StatusOr<bool> MultiHeadAttention::UseRuntimeRows(PrimitiveKind kind,
                                                        int64_t in_width, Matrix& weight,
                                                        const float* bias,
                                                        int64_t out_width) {
  using Mode = Options::ProjectionPrimitives;
  if (compute_ != memory::data_type::f32 ||
      options_.projection_primitives == Mode::kPerShape) {
    return false;
  }
  if (options_.projection_primitives == Mode::kRuntimeRows) return true;
  const std::array<int64_t, 3> key = {in_width, out_width, options_.intra_op_threads};
  if (auto it = projection_choices_.find(key); it != projection_choices_.end()) {
    return it->second.runtime_rows;
  }
  // Decided once per process, under its lock (objects meeting a new matrix together
  // wait for one timing; timing alone also keeps the figures clean).
  SharedProjectionChoices& shared = SharedProjectionChoices::Get();
  absl::MutexLock lock(&shared.mu);
  auto found = shared.choices.find(key);
  if (found == shared.choices.end()) {
    // Timed on inputs of its own, at one row count whatever the call's: the choice
    // holds for every row count, so that a request's rows take the same primitive
    // alone or batched with others and get the same bits either way.
    ProjectionChoice choice;
    choice.rows = std::clamp<int64_t>(kLargestTimedProjection / (in_width * out_width), 1,
                                      kTimedProjectionRows);
    const std::vector<float> in(choice.rows * in_width, 0.5f);
    std::vector<float> out(choice.rows * out_width);
    // Each variant once untimed (primitive creation, packing), then three alternating
    // timed runs each.
    std::array<std::vector<double>, 2> times;
    for (int round = 0; round < 4; ++round) {
      for (const bool runtime_rows : {false, true}) {
        const absl::Time start = absl::Now();
        ATTN_RETURN_IF_ERROR(ProjectChunk(kind, runtime_rows, in.data(), choice.rows,
                                          in_width, weight, bias, out_width, out.data()));
        if (round > 0) {
          times[runtime_rows].push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
        }
      }
    }
    for (auto& series : times) std::sort(series.begin(), series.end());
    choice.per_shape_ms = times[0][1];
    choice.runtime_rows_ms = times[1][1];
    choice.runtime_rows = choice.runtime_rows_ms < choice.per_shape_ms;
    found = shared.choices.emplace(key, choice).first;
  }
  projection_choices_.emplace(key, found->second);
  return found->second.runtime_rows;
}

namespace {

// The tiles kAuto times: 64x256 keeps a thread's scores (64 KB) in a small L2 and its
// query rows in L1; 256x1024 (1 MB of scores) re-reads K and V a quarter as often and
// measured fastest on a 2 MB L2 (Sapphire Rapids).
constexpr std::array<FlashTiles, 3> kTimedTiles = {
    FlashTiles{64, 256}, FlashTiles{128, 512}, FlashTiles{256, 1024}};
// The timed sequence: long enough for every tile to run whole blocks, and at most
// about 2^29 multiply-adds of attention (a few ms on one core).
constexpr int64_t kTimedAttentionLength = 2048;
constexpr int64_t kTimedAttentionWidth = 64;

}  // namespace

absl::Status MultiHeadAttention::ChooseAttentionKernel() {
  const int64_t head_dim = spec_.head_dim();
  const std::array<int64_t, 3> key = {head_dim, options_.intra_op_threads,
                                      options_.attention_block_bytes};
  SharedAttentionChoices& shared = SharedAttentionChoices::Get();
  absl::MutexLock lock(&shared.mu);
  auto found = shared.choices.find(key);
  if (found == shared.choices.end()) {
    // Timed in an object of its own (default cache, own scratch), so that this one's
    // primitive cache and buffers hold only what its calls need.
    Options timer_options = options_;
    timer_options.primitive_cache_capacity = Options().primitive_cache_capacity;
    absl::StatusOr<AttentionChoice> choice;
    try {
      MultiHeadAttention timer(spec_, engine_, timer_options, false);
      choice = timer.TimeAttentionKernels();
    } catch (const dnnl::error& e) {
      return FromDnnlError(e, "time the attention kernels");
    }
    ATTN_RETURN_IF_ERROR(choice.status());
    found = shared.choices.emplace(key, *choice).first;
  }
  attention_choice_ = found->second;
  return absl::OkStatus();
}

absl::StatusOr<MultiHeadAttention::AttentionChoice>
MultiHeadAttention::TimeAttentionKernels() {
  const int64_t head_dim = spec_.head_dim();
  // Forward sets the thread count on its own thread; here it is set for the timing
  // and given back, since Create's caller may run other work on this thread.
  const int caller_threads = omp_get_max_threads();
  if (options_.intra_op_threads > 0) omp_set_num_threads(options_.intra_op_threads);
  AttentionChoice choice;
  choice.timed_length = kTimedAttentionLength;
  choice.timed_heads = std::max<int64_t>(1, kTimedAttentionWidth / head_dim);
  HeadSet set;
  for (int64_t h = 0; h < choice.timed_heads; ++h) {
    set.heads.push_back(h);
    set.kv_heads.push_back(h);
    set.kv_of.push_back(h);
  }
  set.width = choice.timed_heads * head_dim;
  set.CountShare(head_dim);
  const int64_t values = choice.timed_length * set.width;
  // Inputs of scores about 1 (the exponentials' cost does not depend on them).
  std::vector<float> q(values), k(values), v(values), context(values);
  for (int64_t i = 0; i < values; ++i) {
    q[i] = static_cast<float>((i * 7919) % 17) / 17.0f - 0.5f;
    k[i] = static_cast<float>((i * 104729) % 13) / 13.0f - 0.5f;
    v[i] = static_cast<float>(i % 11) / 11.0f;
  }
  const auto* q_bytes = reinterpret_cast<const uint8_t*>(q.data());
  const auto* k_bytes = reinterpret_cast<const uint8_t*>(k.data());
  const auto* v_bytes = reinterpret_cast<const uint8_t*>(v.data());
  const FlashSequence sequence{
      q.data(),           k.data(), v.data(), context.data(), choice.timed_length,
      choice.timed_length};
  const int threads = kParallelBlocks ? omp_get_max_threads() : 1;
  // Candidate 0 is kBlocks, 1.. the tiles.
  std::array<std::vector<double>, kTimedTiles.size() + 1> times;
  absl::Status status;
  for (int round = 0; round < 4 && status.ok(); ++round) {
    for (size_t candidate = 0; candidate < times.size() && status.ok(); ++candidate) {
      const absl::Time start = absl::Now();
      status =
          candidate == 0
              ? AttendSequences(set, 1, q_bytes, k_bytes, v_bytes, choice.timed_length,
                                choice.timed_length, AttentionOptions{}, nullptr,
                                reinterpret_cast<uint8_t*>(context.data()))
              : FlashAttention({&sequence, 1}, choice.timed_heads, head_dim, set.width,
                               false, kTimedTiles[candidate - 1], threads,
                               scratch_->flash);
      if (round > 0) {
        times[candidate].push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
      }
    }
  }
  omp_set_num_threads(caller_threads);
  ATTN_RETURN_IF_ERROR(status);
  for (auto& series : times) std::sort(series.begin(), series.end());
  choice.blocks_ms = times[0][1];
  // Larger query tiles read K and V fewer times (L / rows passes), which the timed
  // length understates for longer sequences: a larger tile within 3% of the fastest
  // is taken (256x1024 measured 7% faster than 128x512 at L=4096 on Sapphire Rapids,
  // the two within 1% at the timed length).
  double fastest = times[1][1];
  for (size_t candidate = 2; candidate < times.size(); ++candidate) {
    fastest = std::min(fastest, times[candidate][1]);
  }
  size_t best = 1;
  for (size_t candidate = 1; candidate < times.size(); ++candidate) {
    if (times[candidate][1] <= 1.03 * fastest) best = candidate;
  }
  choice.tiles = kTimedTiles[best - 1];
  choice.flash_ms = times[best][1];
  choice.flash = choice.flash_ms < choice.blocks_ms;
  return choice;
}

namespace {

// "flash RxK (F vs blocks B ms, H heads x L tokens)" or "blocks (B vs flash RxK F ms,
// ...)".
std::string DescribeAttentionChoice(const MultiHeadAttention::AttentionChoice& choice) {
  const std::string tiles = absl::StrCat(choice.tiles.query_rows, "x", choice.tiles.keys);
  const std::string shape =
      absl::StrFormat(", %d heads x %d tokens)", choice.timed_heads, choice.timed_length);
  if (choice.flash) {
    return absl::StrCat(
        "flash ", tiles,
        absl::StrFormat(" (%.3f vs blocks %.3f ms", choice.flash_ms, choice.blocks_ms),
        shape);
  }
  return absl::StrCat("blocks",
                      absl::StrFormat(" (%.3f vs flash %s %.3f ms", choice.blocks_ms,
                                      tiles, choice.flash_ms),
                      shape);
}

}  // namespace

std::string MultiHeadAttention::AttentionKernelChoice() const {
  if (compute_ != memory::data_type::f32) return "none";
  using Kernel = Options::AttentionKernel;
  switch (options_.attention_kernel) {
    case Kernel::kBlocks:
      return "blocks (fixed)";
    case Kernel::kFlash:
      return absl::StrCat("flash ", options_.flash_tiles.query_rows, "x",
                          options_.flash_tiles.keys, " (fixed)");
    case Kernel::kAuto:
      break;
  }
  return DescribeAttentionChoice(attention_choice_);
}

std::vector<std::pair<std::array<int64_t, 3>, MultiHeadAttention::AttentionChoice>>
MultiHeadAttention::ProcessAttentionChoiceList() {
  SharedAttentionChoices& shared = SharedAttentionChoices::Get();
  absl::MutexLock lock(&shared.mu);
  return {shared.choices.begin(), shared.choices.end()};
}

std::string MultiHeadAttention::ProcessAttentionChoices() {
  std::string text;
  for (const auto& [key, choice] : ProcessAttentionChoiceList()) {
    absl::StrAppend(&text, text.empty() ? "" : "; ", "hd", key[0], "@", key[1], ": ",
                    DescribeAttentionChoice(choice));
  }
  return text;
}

namespace {

// "IxO[@threads]: <choice> (<runtime rows> vs <per shape> ms at R rows); ..."
std::string DescribeChoices(
    const std::map<std::array<int64_t, 3>, MultiHeadAttention::ProjectionChoice>& choices,
    bool with_threads) {
  std::string text;
  for (const auto& [key, choice] : choices) {
    absl::StrAppend(&text, text.empty() ? "" : "; ", key[0], "x", key[1]);
    if (with_threads) absl::StrAppend(&text, "@", key[2]);
    absl::StrAppend(
        &text, ": ", choice.runtime_rows ? "runtime rows" : "per shape",
        absl::StrFormat(" (%.3f vs %.3f ms at %d rows)", choice.runtime_rows_ms,
                        choice.per_shape_ms, choice.rows));
  }
  return text;
}

}  // namespace

std::string MultiHeadAttention::ProjectionChoices() const {
  return DescribeChoices(projection_choices_, false);
}

std::string MultiHeadAttention::ProcessProjectionChoices() {
  SharedProjectionChoices& shared = SharedProjectionChoices::Get();
  absl::MutexLock lock(&shared.mu);
  return DescribeChoices(shared.choices, true);
}

std::vector<std::pair<std::array<int64_t, 3>, MultiHeadAttention::ProjectionChoice>>
MultiHeadAttention::ProcessProjectionChoiceList() {
  SharedProjectionChoices& shared = SharedProjectionChoices::Get();
  absl::MutexLock lock(&shared.mu);
  return {shared.choices.begin(), shared.choices.end()};
}

MultiHeadAttention::QuantizedRows MultiHeadAttention::QuantizeInput(
    const float* in, int64_t rows, int64_t width, ScratchBuffer& codes,
    ScratchBuffer& parameters) {
  QuantizedRows quantized;
  auto* code_data = static_cast<uint8_t*>(codes.Reserve(rows * width));
  auto* scales = static_cast<float*>(parameters.Reserve(rows * 2 * sizeof(float)));
  auto* zero_points = reinterpret_cast<int32_t*>(scales + rows);
  QuantizeRows(in, rows, width, int8_levels_.activation, code_data, scales, zero_points);
  quantized.codes = code_data;
  quantized.scales = scales;
  quantized.zero_points = zero_points;
  return quantized;
}

absl::Status MultiHeadAttention::ProjectInt8(const QuantizedRows& in, int64_t rows,
                                             int64_t in_width, Matrix& weight,
                                             const float* bias, int64_t out_width,
                                             float* out) {
  return ForEachRowChunk(rows, [&](int64_t first, int64_t chunk) -> absl::Status {
    ATTN_ASSIGN_OR_RETURN(
        CachedPrimitive * primitive,
        GetPrimitive(PrimitiveKind::kInt8Projection, {chunk, in_width, out_width, 0}));
    const memory& packed = Packed(weight, in_width, out_width, primitive->weights_desc);
    auto* sums = static_cast<int32_t*>(
        scratch_->accumulators.Reserve(chunk * out_width * sizeof(int32_t)));
    ATTN_RETURN_IF_ERROR(Execute(
        *primitive,
        {{DNNL_ARG_SRC, Plain2d(chunk, in_width, memory::data_type::u8),
          in.codes + first * in_width},
         {DNNL_ARG_WEIGHTS, primitive->weights_desc, packed.get_data_handle()},
         {DNNL_ARG_DST, Plain2d(chunk, out_width, memory::data_type::s32), sums}}));
    // y = s_x s_w (acc - z_x sum_k Wq) + b: quantization.h.
    Dequantize(sums, chunk, weight.quantized, in.scales + first, in.zero_points + first,
               bias, out + first * out_width);
    return absl::OkStatus();
  });
}

absl::Status MultiHeadAttention::Convert(const void* in, bool from_bf16, int64_t count,
                                         void* out) {
  const memory::data_type from =
      from_bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const int64_t in_bytes = from_bf16 ? 2 : 4;
  // Elementwise: chunked as rows are, so that the conversions' shapes stay few.
  return ForEachRowChunk(count, [&](int64_t first, int64_t chunk) -> absl::Status {
    ATTN_ASSIGN_OR_RETURN(
        CachedPrimitive * primitive,
        GetPrimitive(PrimitiveKind::kConvert, {chunk, from_bf16 ? 1 : 0, 0, 0}));
    return Execute(*primitive,
                   {{DNNL_ARG_FROM, memory::desc({chunk}, from, memory::format_tag::a),
                     static_cast<const uint8_t*>(in) + first * in_bytes},
                    {DNNL_ARG_TO, memory::desc({chunk}, compute_, memory::format_tag::a),
                     static_cast<uint8_t*>(out) + first * compute_bytes_}});
  });
}

absl::StatusOr<const void*> MultiHeadAttention::InComputePrecision(
    absl::Span<const float> f32, absl::Span<const uint16_t> bf16, ScratchBuffer& buffer) {
  const bool from_bf16 = f32.empty();
  if ((compute_ == memory::data_type::bf16) == from_bf16) {
    return from_bf16 ? static_cast<const void*>(bf16.data()) : f32.data();
  }
  const int64_t count = static_cast<int64_t>(from_bf16 ? bf16.size() : f32.size());
  void* converted = buffer.Reserve(count * compute_bytes_);
  ATTN_RETURN_IF_ERROR(Convert(from_bf16 ? static_cast<const void*>(bf16.data())
                                         : static_cast<const void*>(f32.data()),
                               from_bf16, count, converted));
  return static_cast<const void*>(converted);
}

absl::Status MultiHeadAttention::AttendSequences(
    const HeadSet& set, int64_t count, const uint8_t* q, const uint8_t* k,
    const uint8_t* v, int64_t query_length, int64_t key_length,
    const AttentionOptions& options, float* attention_weights, uint8_t* context) {
  const bool causal = options.causal;
  const RelativeBias& bias = options.relative_bias;
  const int64_t window = options.window;
  const int64_t heads = static_cast<int64_t>(set.heads.size());
  const int64_t head_dim = spec_.head_dim();
  const int64_t width = set.width;
  const int64_t budget = options_.attention_block_bytes;
  const int64_t row_bytes = key_length * static_cast<int64_t>(sizeof(float));
  const bool f32 = compute_ == memory::data_type::f32;
  // Short sequences: all heads in one batched matmul each (fewest primitive calls),
  // and a run of equal sequences in one call. Long ones: one head at a time, query
  // rows in blocks whose scores fit the budget, so that QK^T, softmax and PV work in
  // cache instead of streaming h L_q L_k floats (256 MB at L=2048, h=16) through
  // memory.
  // Grouped-query sets whose key/value heads serve unequal numbers of query heads (a
  // head mask's or pruning's slice) run one head at a time.
  const bool all_heads = heads * query_length * row_bytes <= budget;
  const int64_t group = all_heads && set.share != 0 ? heads : 1;
  const int64_t share = group > 1 ? set.share : 1;
  const int64_t kv_width = set.kv_width;
  int64_t block_rows =
      all_heads
          ? query_length
          : std::min(query_length, std::max<int64_t>(kMinBlockRows, budget / row_bytes));
  // Causal: a block of rows needs only the keys up to its last row, so smaller blocks
  // skip more of the masked upper triangle: with n blocks the work is (n+1)/2n of the
  // full square.
  const bool skip_masked = causal && query_length >= kCausalBlockedLength;
  if (skip_masked) {
    block_rows = std::min(
        block_rows,
        std::max(kMinBlockRows, (query_length + kCausalBlocks - 1) / kCausalBlocks));
  }
  // One head at a time with more than one thread: the (head, row block) items run side
  // by side, each on one thread, instead of one after another with each small product
  // split across the threads (0.65 of peak at L=2048 on 2 threads that way).
  const int64_t blocks = (query_length + block_rows - 1) / block_rows;
  if (kParallelBlocks && !all_heads && count == 1 && attention_weights == nullptr &&
      omp_get_max_threads() > 1 && 3 * blocks <= options_.primitive_cache_capacity) {
    return AttendBlocksInParallel(set, q, k, v, query_length, key_length, block_rows,
                                  skip_masked, options, context);
  }
  // Scores go straight into the caller's [count, num_heads, L_q, L_k] weights when they
  // have the same layout there: all heads present, full key rows (a window narrows the
  // rows of a block of some query rows only).
  const bool in_place = attention_weights != nullptr && heads == spec_.num_heads &&
                        !skip_masked && !(window > 0 && block_rows < query_length);
  const int64_t scores_count = count * group * block_rows * key_length;
  float* scratch = in_place ? nullptr
                            : static_cast<float*>(scratch_->probabilities.Reserve(
                                  scores_count * static_cast<int64_t>(sizeof(float))));
  // bf16: the softmax writes P in bf16 for the P V product (straight from the f32
  // scores, or converted from the f32 weights the caller asked for).
  void* compute_probabilities =
      f32 ? nullptr
          : scratch_->compute_probabilities.Reserve(scores_count * compute_bytes_);
  const auto at = [&](const uint8_t* plane, int64_t row, int64_t column) {
    return plane + (row * width + column) * compute_bytes_;
  };
  const auto kv_at = [&](const uint8_t* plane, int64_t row, int64_t column) {
    return plane + (row * kv_width + column) * compute_bytes_;
  };

  for (int64_t first_head = 0; first_head < heads; first_head += group) {
    // Head p's vectors are columns [p*head_dim, (p+1)*head_dim) of the [L, width] planes,
    // its key/value head's columns [kv_of[p] head_dim, ...) of the [L, kv_width] ones.
    const int64_t column = first_head * head_dim;
    const int64_t kv_column = set.kv_of[static_cast<size_t>(first_head)] * head_dim;
    for (int64_t first_row = 0; first_row < query_length; first_row += block_rows) {
      const int64_t rows = std::min(block_rows, query_length - first_row);
      // count > 1 only for sequences in one block (RunLength), whose keys are all seen.
      const KeyRange range = BlockKeys(first_row, rows, key_length, skip_masked, window);
      const int64_t first_key = range.begin;
      const int64_t keys = range.end - range.begin;
      float* scores_data =
          in_place
              ? attention_weights + (first_head * query_length + first_row) * key_length
              : scratch;
      const memory::desc scores = ScoresDesc(count, group, rows, keys);

      // scores = Q K^T per head (the 1/sqrt(head_dim) is already folded into Q).
      ATTN_ASSIGN_OR_RETURN(
          CachedPrimitive * scores_primitive,
          GetPrimitive(PrimitiveKind::kScores,
                       {group, rows, keys, width, count, kv_width, share}));
      ATTN_RETURN_IF_ERROR(
          Execute(*scores_primitive,
                  {{DNNL_ARG_SRC, HeadRowsView(count, group, rows, width, share),
                    at(q, first_row, column)},
                   {DNNL_ARG_WEIGHTS, KvColumnsView(count, group, keys, kv_width, share),
                    kv_at(k, first_key, kv_column)},
                   {DNNL_ARG_DST, GroupedScoresDesc(count, group, rows, keys, share),
                    scores_data}}));
      if (!bias.empty()) {
        AddBiasToScores(bias,
                        absl::MakeConstSpan(set.heads).subspan(
                            static_cast<size_t>(first_head), static_cast<size_t>(group)),
                        count * group, first_row, rows, first_key, keys, scores_data);
      }
      if (causal || window > 0) {
        MaskScores(count * group, first_row, rows, first_key, keys, causal, window,
                   scores_data);
      }

      // probabilities = softmax(scores) over keys: in place in f32 (fp32 models, or
      // when the caller wants the weights), else straight into bf16.
      const bool softmax_to_compute = !f32 && attention_weights == nullptr;
      const void* probabilities =
          softmax_to_compute ? compute_probabilities : scores_data;
      ATTN_ASSIGN_OR_RETURN(
          CachedPrimitive * softmax_primitive,
          GetPrimitive(PrimitiveKind::kSoftmax,
                       {group, rows, keys, softmax_to_compute ? 1 : 0, count}));
      const memory::desc compute_scores = ScoresDesc(count, group, rows, keys, compute_);
      ATTN_RETURN_IF_ERROR(Execute(
          *softmax_primitive,
          {{DNNL_ARG_SRC, scores, scores_data},
           {DNNL_ARG_DST, softmax_to_compute ? compute_scores : scores, probabilities}}));
      if (!f32 && !softmax_to_compute) {
        ATTN_RETURN_IF_ERROR(Convert(scores_data, false, count * group * rows * keys,
                                     compute_probabilities));
        probabilities = compute_probabilities;
      }

      // context = probabilities V per head, into the heads' columns of the context.
      ATTN_ASSIGN_OR_RETURN(
          CachedPrimitive * context_primitive,
          GetPrimitive(PrimitiveKind::kContext,
                       {group, rows, keys, width, count, kv_width, share}));
      ATTN_RETURN_IF_ERROR(Execute(
          *context_primitive,
          {{DNNL_ARG_SRC, GroupedScoresDesc(count, group, rows, keys, share, compute_),
            probabilities},
           {DNNL_ARG_WEIGHTS, KvRowsView(count, group, keys, kv_width, share),
            kv_at(v, first_key, kv_column)},
           {DNNL_ARG_DST, HeadRowsView(count, group, rows, width, share),
            at(context, first_row, column)}}));

      if (attention_weights != nullptr && !in_place) {
        // Copy each head's rows to its model index; keys outside the block's range are
        // causal-masked or outside the window, and read as zero.
        for (int64_t sequence = 0; sequence < count; ++sequence) {
          float* weights =
              attention_weights + sequence * spec_.num_heads * query_length * key_length;
          for (int64_t g = 0; g < group; ++g) {
            const int64_t head = set.heads[first_head + g];
            for (int64_t r = 0; r < rows; ++r) {
              const float* source =
                  scores_data + ((sequence * group + g) * rows + r) * keys;
              float* target =
                  weights + (head * query_length + first_row + r) * key_length;
              std::fill(target, target + first_key, 0.0f);
              std::copy(source, source + keys, target + first_key);
              std::fill(target + first_key + keys, target + key_length, 0.0f);
            }
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status MultiHeadAttention::AttendBlocksInParallel(
    const HeadSet& set, const uint8_t* q, const uint8_t* k, const uint8_t* v,
    int64_t query_length, int64_t key_length, int64_t block_rows, bool skip_masked,
    const AttentionOptions& options, uint8_t* context) {
  const bool causal = options.causal;
  const RelativeBias& bias = options.relative_bias;
  const int64_t window = options.window;
  const int64_t heads = static_cast<int64_t>(set.heads.size());
  const int64_t head_dim = spec_.head_dim();
  const int64_t width = set.width;
  const int64_t kv_width = set.kv_width;
  const bool f32 = compute_ == memory::data_type::f32;
  const int64_t blocks = (query_length + block_rows - 1) / block_rows;
  // The primitives of every block, made here, on this thread (the cache is not
  // thread-safe); the items below only run them. Blocks differ in rows (the last one)
  // and, when the masked triangle is skipped or a window narrows them, in keys.
  struct BlockPrimitives {
    int64_t first_row, rows, first_key, keys;
    const CachedPrimitive *scores, *softmax, *context;
  };
  std::vector<BlockPrimitives> plan;
  plan.reserve(static_cast<size_t>(blocks));
  size_t scratchpad_bytes = 0;
  for (int64_t first_row = 0; first_row < query_length; first_row += block_rows) {
    BlockPrimitives block;
    block.first_row = first_row;
    block.rows = std::min(block_rows, query_length - first_row);
    const KeyRange range =
        BlockKeys(first_row, block.rows, key_length, skip_masked, window);
    block.first_key = range.begin;
    block.keys = range.end - range.begin;
    ATTN_ASSIGN_OR_RETURN(CachedPrimitive * scores,
                          GetPrimitive(PrimitiveKind::kScores, {1, block.rows, block.keys,
                                                                width, 1, kv_width, 1}));
    ATTN_ASSIGN_OR_RETURN(CachedPrimitive * softmax,
                          GetPrimitive(PrimitiveKind::kSoftmax,
                                       {1, block.rows, block.keys, f32 ? 0 : 1, 1}));
    ATTN_ASSIGN_OR_RETURN(
        CachedPrimitive * product,
        GetPrimitive(PrimitiveKind::kContext,
                     {1, block.rows, block.keys, width, 1, kv_width, 1}));
    block.scores = scores;
    block.softmax = softmax;
    block.context = product;
    for (const CachedPrimitive* primitive : {scores, softmax, product}) {
      scratchpad_bytes = std::max(scratchpad_bytes, primitive->scratchpad_bytes);
    }
    plan.push_back(block);
  }
  // The cache evicts the least recently used entry, and the plan holds at most a third
  // of its capacity (the caller checks), so none of the plan's entries was evicted while
  // it was made.
  const int threads = omp_get_max_threads();
  scratch_->per_thread.resize(static_cast<size_t>(threads));
  for (auto& buffers : scratch_->per_thread) {
    if (buffers == nullptr) buffers = std::make_unique<ThreadScratch>();
  }
  const auto at = [&](const uint8_t* plane, int64_t row, int64_t column,
                      int64_t plane_width) {
    return const_cast<uint8_t*>(plane + (row * plane_width + column) * compute_bytes_);
  };
  const int64_t items = heads * blocks;
  std::vector<absl::Status> failures(static_cast<size_t>(threads));
#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (int64_t item = 0; item < items; ++item) {
    const int thread = omp_get_thread_num();
    if (!failures[thread].ok()) continue;
    const BlockPrimitives& block = plan[static_cast<size_t>(item % blocks)];
    const int64_t column = (item / blocks) * head_dim;
    const int64_t kv_column = set.kv_of[static_cast<size_t>(item / blocks)] * head_dim;
    ThreadScratch& mine = *scratch_->per_thread[static_cast<size_t>(thread)];
    try {
      // Each thread its own stream, buffers, scratchpad and argument memories: only
      // the primitives (read-only once made) are shared.
      if (mine.stream == nullptr) mine.stream = std::make_unique<dnnl::stream>(engine_);
      const int64_t values = block.rows * block.keys;
      auto* scores = static_cast<float*>(mine.scores.Reserve(values * sizeof(float)));
      void* probabilities =
          f32 ? static_cast<void*>(scores) : mine.probabilities.Reserve(values * 2);
      void* pad = mine.scratchpad.Reserve(scratchpad_bytes);
      const memory::desc scores_desc = ScoresDesc(1, 1, block.rows, block.keys);
      const memory::desc compute_scores =
          ScoresDesc(1, 1, block.rows, block.keys, compute_);
      const auto run = [&](const CachedPrimitive& primitive,
                           std::initializer_list<ExecArg> args) {
        std::unordered_map<int, memory> bound;
        for (const ExecArg& arg : args) {
          bound.emplace(arg.id, memory(arg.desc, engine_, const_cast<void*>(arg.data)));
        }
        if (primitive.scratchpad_bytes > 0) {
          bound.emplace(
              DNNL_ARG_SCRATCHPAD,
              memory(memory::desc({static_cast<int64_t>(primitive.scratchpad_bytes)},
                                  memory::data_type::u8, memory::format_tag::a),
                     engine_, pad));
        }
        primitive.primitive.execute(*mine.stream, bound);
      };
      run(*block.scores, {{DNNL_ARG_SRC, HeadRowsView(1, 1, block.rows, width),
                           at(q, block.first_row, column, width)},
                          {DNNL_ARG_WEIGHTS, KvColumnsView(1, 1, block.keys, kv_width, 1),
                           at(k, block.first_key, kv_column, kv_width)},
                          {DNNL_ARG_DST, scores_desc, scores}});
      mine.stream->wait();
      if (!bias.empty()) {
        const int64_t head = set.heads[static_cast<size_t>(item / blocks)];
        AddBiasToScores(bias, absl::MakeConstSpan(&head, 1), 1, block.first_row,
                        block.rows, block.first_key, block.keys, scores);
      }
      if (causal || window > 0) {
        MaskScores(1, block.first_row, block.rows, block.first_key, block.keys, causal,
                   window, scores);
      }
      run(*block.softmax,
          {{DNNL_ARG_SRC, scores_desc, scores},
           {DNNL_ARG_DST, f32 ? scores_desc : compute_scores, probabilities}});
      run(*block.context, {{DNNL_ARG_SRC, compute_scores, probabilities},
                           {DNNL_ARG_WEIGHTS, KvRowsView(1, 1, block.keys, kv_width, 1),
                            at(v, block.first_key, kv_column, kv_width)},
                           {DNNL_ARG_DST, HeadRowsView(1, 1, block.rows, width),
                            at(context, block.first_row, column, width)}});
      mine.stream->wait();
    } catch (const dnnl::error& e) {
      failures[thread] = FromDnnlError(e, "run attention on a worker thread");
    }
  }
  for (absl::Status& failure : failures) ATTN_RETURN_IF_ERROR(failure);
  return absl::OkStatus();
}

const float* MultiHeadAttention::RotaryTable(absl::Span<const float> inv_freq,
                                             int64_t positions) {
  Scratch& scratch = *scratch_;
  const auto pairs = static_cast<int64_t>(inv_freq.size());
  // Kept from earlier calls for the same frequencies (an encoder's layers share them
  // and their scratch): a row does not depend on how many there are.
  const bool same =
      std::equal(inv_freq.begin(), inv_freq.end(), scratch.rotary_inv_freq.begin(),
                 scratch.rotary_inv_freq.end());
  int64_t first = same ? scratch.rotary_positions : 0;
  if (first < positions) {
    if (!same) {
      scratch.rotary_inv_freq.assign(inv_freq.begin(), inv_freq.end());
    }
    scratch.rotary_table.resize(static_cast<size_t>(positions * 2 * pairs));
    for (int64_t t = first; t < positions; ++t) {
      float* cosine = scratch.rotary_table.data() + t * 2 * pairs;
      for (int64_t c = 0; c < pairs; ++c) {
        // As transformers computes them: the f32 product of the f32 position and the
        // frequency, then cos and sin in f32.
        const float angle = static_cast<float>(t) * inv_freq[c];
        cosine[c] = std::cos(angle);
        cosine[pairs + c] = std::sin(angle);
      }
    }
    scratch.rotary_positions = positions;
  }
  return scratch.rotary_table.data();
}

}  // namespace attnserve::core
