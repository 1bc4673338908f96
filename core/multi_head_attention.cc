#include "core/multi_head_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace attnserve::core {

namespace {

using dnnl::memory;
using Dims = memory::dims;

constexpr int kMaxThreads = 1024;
// Fewer query rows per block would starve the matmuls; a longer block may exceed the
// byte budget for very long keys.
constexpr int64_t kMinBlockRows = 16;

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
memory::desc Plain2d(int64_t rows, int64_t cols) {
  return memory::desc({rows, cols}, memory::data_type::f32, memory::format_tag::ab);
}

// Scores of `heads` heads [heads, rows, L_k], dense.
memory::desc ScoresDesc(int64_t heads, int64_t rows, int64_t key_length) {
  return memory::desc({heads, rows, key_length}, memory::data_type::f32,
                      memory::format_tag::abc);
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

}  // namespace

float* MultiHeadAttention::Buffer::Reserve(size_t count) {
  if (count > capacity_) {
    data_ = std::make_unique<float[]>(count);
    capacity_ = count;
  }
  return data_.get();
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
  if (spec.precision != Precision::kFp32) {
    return absl::UnimplementedError(
        absl::StrCat("precision ", PrecisionName(spec.precision),
                     " is not implemented by the attention core yet; use fp32"));
  }
  if (engine.get_kind() != dnnl::engine::kind::cpu) {
    return absl::UnimplementedError(
        "the attention core runs on CPU engines only for now (per-sequence views "
        "use host pointers)");
  }
  std::unique_ptr<MultiHeadAttention> attention;
  try {
    attention.reset(new MultiHeadAttention(spec, engine, options));
  } catch (const dnnl::error& e) {
    return FromDnnlError(e, "create a stream");
  }
  const size_t d = static_cast<size_t>(spec.d_model);
  const auto rows = [&](size_t first_row) {
    return std::vector<float>(weights.in_proj_weight.begin() + first_row * d,
                              weights.in_proj_weight.begin() + (first_row + d) * d);
  };
  attention->query_weight_ = rows(0);
  attention->key_weight_ = rows(d);
  attention->value_weight_ = rows(2 * d);
  attention->query_bias_.assign(weights.in_proj_bias.begin(),
                                weights.in_proj_bias.begin() + d);
  attention->key_bias_.assign(weights.in_proj_bias.begin() + d,
                              weights.in_proj_bias.begin() + 2 * d);
  attention->value_bias_.assign(weights.in_proj_bias.begin() + 2 * d,
                                weights.in_proj_bias.end());
  attention->out_weight_ = weights.out_proj_weight;
  attention->out_bias_ = weights.out_proj_bias;
  // softmax(Q K^T / sqrt(head_dim)): scaling the query projection (weights and bias)
  // once here costs nothing per call.
  const float scale = 1.0f / std::sqrt(static_cast<float>(spec.head_dim()));
  for (float& w : attention->query_weight_) w *= scale;
  for (float& b : attention->query_bias_) b *= scale;
  return attention;
}

MultiHeadAttention::MultiHeadAttention(const ModelSpec& spec, const dnnl::engine& engine,
                                       const Options& options)
    : spec_(spec),
      engine_(engine),
      stream_(engine),
      options_(options),
      cache_(static_cast<size_t>(options.primitive_cache_capacity)) {}

dnnl::memory::desc MultiHeadAttention::HeadRowsView(int64_t heads, int64_t rows) const {
  return memory::desc({heads, rows, spec_.head_dim()}, memory::data_type::f32,
                      {spec_.head_dim(), spec_.d_model, 1});
}

dnnl::memory::desc MultiHeadAttention::HeadColumnsView(int64_t heads,
                                                       int64_t length) const {
  return memory::desc({heads, spec_.head_dim(), length}, memory::data_type::f32,
                      {spec_.head_dim(), 1, spec_.d_model});
}

int64_t MultiHeadAttention::AttentionWeightsSize(
    int64_t num_heads, absl::Span<const int64_t> query_lengths,
    absl::Span<const int64_t> memory_lengths) {
  int64_t total = 0;
  for (size_t i = 0; i < query_lengths.size(); ++i) {
    const int64_t key_length =
        memory_lengths.empty() ? query_lengths[i] : memory_lengths[i];
    total += num_heads * query_lengths[i] * key_length;
  }
  return total;
}

absl::Status MultiHeadAttention::Forward(const AttentionBatch& batch,
                                         const AttentionOptions& options,
                                         absl::Span<float> output,
                                         absl::Span<float> attention_weights) {
  const int64_t d = spec_.d_model;
  if (batch.query_lengths.empty()) {
    return absl::InvalidArgumentError("query_lengths must hold at least one sequence");
  }
  int64_t query_tokens = 0;
  ATTN_RETURN_IF_ERROR(CheckLengths(batch.query_lengths, "query_lengths", query_tokens));
  if (static_cast<int64_t>(batch.query.size()) != query_tokens * d) {
    return absl::InvalidArgumentError(
        absl::StrCat("query must hold sum(query_lengths) * d_model = ", query_tokens,
                     " * ", d, " floats, got ", batch.query.size()));
  }
  const bool cross = !batch.memory_lengths.empty() || !batch.memory.empty();
  if (cross) {
    if (batch.memory_lengths.size() != batch.query_lengths.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "memory_lengths must have one entry per query sequence (",
          batch.query_lengths.size(), "), got ", batch.memory_lengths.size()));
    }
    int64_t memory_tokens = 0;
    ATTN_RETURN_IF_ERROR(
        CheckLengths(batch.memory_lengths, "memory_lengths", memory_tokens));
    if (static_cast<int64_t>(batch.memory.size()) != memory_tokens * d) {
      return absl::InvalidArgumentError(
          absl::StrCat("memory must hold sum(memory_lengths) * d_model = ", memory_tokens,
                       " * ", d, " floats, got ", batch.memory.size()));
    }
    if (options.causal) {
      return absl::InvalidArgumentError(
          "causal must be false for cross-attention (memory given): a causal mask is "
          "defined for self-attention only");
    }
  }
  if (!options.head_mask.empty()) {
    if (static_cast<int64_t>(options.head_mask.size()) != spec_.num_heads) {
      return absl::InvalidArgumentError(
          absl::StrCat("head_mask must have num_heads = ", spec_.num_heads,
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
        AttentionWeightsSize(spec_.num_heads, batch.query_lengths, batch.memory_lengths);
    if (static_cast<int64_t>(attention_weights.size()) != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("attention_weights must be empty or hold ", expected,
                       " floats, got ", attention_weights.size()));
    }
  }
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

absl::Status MultiHeadAttention::ForwardImpl(const AttentionBatch& batch,
                                             const AttentionOptions& options,
                                             absl::Span<float> output,
                                             absl::Span<float> attention_weights) {
  const int64_t d = spec_.d_model;
  const int64_t heads = spec_.num_heads;
  const int64_t head_dim = spec_.head_dim();
  const bool cross = !batch.memory_lengths.empty();
  const absl::Span<const int64_t> key_lengths =
      cross ? batch.memory_lengths : batch.query_lengths;
  const int64_t query_tokens = static_cast<int64_t>(batch.query.size()) / d;
  const int64_t key_tokens =
      cross ? static_cast<int64_t>(batch.memory.size()) / d : query_tokens;
  const float* key_source = cross ? batch.memory.data() : batch.query.data();

  // Projections run once over all packed tokens: Q, K and V land in three dense
  // planes (strided views of one [T, 3d] buffer would leave oneDNN's fast path).
  float* q = q_.Reserve(query_tokens * d);
  float* k = k_.Reserve(key_tokens * d);
  float* v = v_.Reserve(key_tokens * d);
  float* context = context_.Reserve(query_tokens * d);
  ATTN_RETURN_IF_ERROR(Project(batch.query.data(), query_tokens, query_weight_.data(),
                               query_bias_.data(), q));
  ATTN_RETURN_IF_ERROR(
      Project(key_source, key_tokens, key_weight_.data(), key_bias_.data(), k));
  ATTN_RETURN_IF_ERROR(
      Project(key_source, key_tokens, value_weight_.data(), value_bias_.data(), v));

  // Attention per sequence, all heads in one batched matmul each.
  int64_t query_offset = 0;
  int64_t key_offset = 0;
  int64_t weights_offset = 0;
  for (size_t i = 0; i < batch.query_lengths.size(); ++i) {
    const int64_t query_length = batch.query_lengths[i];
    const int64_t key_length = key_lengths[i];
    const int64_t weights_size = heads * query_length * key_length;
    float* probabilities =
        attention_weights.empty() ? nullptr : attention_weights.data() + weights_offset;
    ATTN_RETURN_IF_ERROR(AttendSequence(
        q + query_offset * d, k + key_offset * d, v + key_offset * d, query_length,
        key_length, options.causal, probabilities, context + query_offset * d));
    query_offset += query_length;
    key_offset += key_length;
    weights_offset += weights_size;
  }

  bool scaled_heads = false;
  for (float factor : options.head_mask) scaled_heads |= factor != 1.0f;
  if (scaled_heads) {
    // Row t of the context plane is [head_0 | head_1 | ...]; scale each head's slice.
    for (int64_t t = 0; t < query_tokens; ++t) {
      float* row = context + t * d;
      for (int64_t h = 0; h < heads; ++h) {
        const float factor = options.head_mask[h];
        for (int64_t j = 0; j < head_dim; ++j) row[h * head_dim + j] *= factor;
      }
    }
  }
  return Project(context, query_tokens, out_weight_.data(), out_bias_.data(),
                 output.data());
}

absl::StatusOr<CachedPrimitive*> MultiHeadAttention::GetPrimitive(PrimitiveKind kind,
                                                                  int64_t heads,
                                                                  int64_t a, int64_t b) {
  const int64_t d = spec_.d_model;
  const auto create = [&]() -> absl::StatusOr<CachedPrimitive> {
    try {
      const dnnl::primitive_attr attr = UserScratchpadAttr();
      CachedPrimitive created;
      switch (kind) {
        case PrimitiveKind::kProjection: {
          // [rows, d] x W^T: W is [d_out, d_in] row-major, i.e. [d_in, d_out] tag ba.
          const memory::desc weights({d, d}, memory::data_type::f32,
                                     memory::format_tag::ba);
          const dnnl::matmul::desc desc(Plain2d(a, d), weights, Plain2d(1, d),
                                        Plain2d(a, d));
          const dnnl::matmul::primitive_desc pd(desc, attr, engine_);
          created.primitive = dnnl::matmul(pd);
          created.scratchpad_bytes = pd.scratchpad_desc().get_size();
          break;
        }
        case PrimitiveKind::kScores: {
          const dnnl::matmul::desc desc(HeadRowsView(heads, a), HeadColumnsView(heads, b),
                                        ScoresDesc(heads, a, b));
          const dnnl::matmul::primitive_desc pd(desc, attr, engine_);
          created.primitive = dnnl::matmul(pd);
          created.scratchpad_bytes = pd.scratchpad_desc().get_size();
          break;
        }
        case PrimitiveKind::kSoftmax: {
          const dnnl::softmax_forward::desc desc(dnnl::prop_kind::forward_inference,
                                                 ScoresDesc(heads, a, b), 2);
          const dnnl::softmax_forward::primitive_desc pd(desc, attr, engine_);
          created.primitive = dnnl::softmax_forward(pd);
          created.scratchpad_bytes = pd.scratchpad_desc().get_size();
          break;
        }
        case PrimitiveKind::kContext: {
          const dnnl::matmul::desc desc(ScoresDesc(heads, a, b), HeadRowsView(heads, b),
                                        HeadRowsView(heads, a));
          const dnnl::matmul::primitive_desc pd(desc, attr, engine_);
          created.primitive = dnnl::matmul(pd);
          created.scratchpad_bytes = pd.scratchpad_desc().get_size();
          break;
        }
      }
      return created;
    } catch (const dnnl::error& e) {
      return FromDnnlError(
          e, absl::StrCat("create a primitive for shape (", a, ", ", b, ")"));
    }
  };
  return cache_.GetOrCreate(PrimitiveKey{kind, {heads, a, b}}, create);
}

absl::Status MultiHeadAttention::Execute(CachedPrimitive& primitive,
                                         std::initializer_list<ExecArg> args) {
  if (primitive.scratchpad_bytes > scratchpad_bytes_) {
    scratchpad_ = std::make_unique<uint8_t[]>(primitive.scratchpad_bytes);
    scratchpad_bytes_ = primitive.scratchpad_bytes;
  }
  // The same id always has the same layout for one primitive (its key fixes the
  // shapes), so a memory object made once is only re-pointed afterwards.
  const auto bind = [&](int id, const memory::desc& desc, void* data) {
    auto it = primitive.args.find(id);
    if (it == primitive.args.end()) {
      primitive.args.emplace(id, memory(desc, engine_, data));
    } else {
      it->second.set_data_handle(data);
    }
  };
  for (const ExecArg& arg : args) bind(arg.id, arg.desc, const_cast<float*>(arg.data));
  if (primitive.scratchpad_bytes > 0) {
    bind(DNNL_ARG_SCRATCHPAD,
         memory::desc({static_cast<int64_t>(primitive.scratchpad_bytes)},
                      memory::data_type::u8, memory::format_tag::a),
         scratchpad_.get());
  }
  primitive.primitive.execute(stream_, primitive.args);
  stream_.wait();
  return absl::OkStatus();
}

absl::Status MultiHeadAttention::Project(const float* in, int64_t rows,
                                         const float* weight, const float* bias,
                                         float* out) {
  const int64_t d = spec_.d_model;
  ATTN_ASSIGN_OR_RETURN(CachedPrimitive * primitive,
                        GetPrimitive(PrimitiveKind::kProjection, 0, rows, 0));
  const memory::desc weights_desc({d, d}, memory::data_type::f32, memory::format_tag::ba);
  return Execute(*primitive, {{DNNL_ARG_SRC, Plain2d(rows, d), in},
                              {DNNL_ARG_WEIGHTS, weights_desc, weight},
                              {DNNL_ARG_BIAS, Plain2d(1, d), bias},
                              {DNNL_ARG_DST, Plain2d(rows, d), out}});
}

absl::Status MultiHeadAttention::AttendSequence(const float* q, const float* k,
                                                const float* v, int64_t query_length,
                                                int64_t key_length, bool causal,
                                                float* attention_weights,
                                                float* context) {
  const int64_t heads = spec_.num_heads;
  const int64_t head_dim = spec_.head_dim();
  const int64_t d = spec_.d_model;
  const int64_t budget = options_.attention_block_bytes;
  const int64_t row_bytes = key_length * static_cast<int64_t>(sizeof(float));
  // Short sequences: all heads in one batched matmul each (fewest primitive calls).
  // Long ones: one head at a time, query rows in blocks whose scores fit the budget,
  // so that QK^T, softmax and PV work in cache instead of streaming h L_q L_k floats
  // (256 MB at L=2048, h=16) through memory.
  const bool all_heads = heads * query_length * row_bytes <= budget;
  const int64_t group = all_heads ? heads : 1;
  const int64_t block_rows =
      all_heads
          ? query_length
          : std::min(query_length, std::max<int64_t>(kMinBlockRows, budget / row_bytes));
  float* scratch = attention_weights != nullptr
                       ? nullptr
                       : probabilities_.Reserve(group * block_rows * key_length);

  for (int64_t first_head = 0; first_head < heads; first_head += group) {
    // Head h's vectors are columns [h*head_dim, (h+1)*head_dim) of the [L, d] planes.
    const int64_t column = first_head * head_dim;
    for (int64_t first_row = 0; first_row < query_length; first_row += block_rows) {
      const int64_t rows = std::min(block_rows, query_length - first_row);
      // These heads' weights for these rows are contiguous in the caller's
      // [h, L_q, L_k] output, so they are computed in place there.
      float* scores_data =
          scratch != nullptr
              ? scratch
              : attention_weights + (first_head * query_length + first_row) * key_length;
      const memory::desc scores = ScoresDesc(group, rows, key_length);

      // scores = Q K^T per head (the 1/sqrt(head_dim) is already folded into Q).
      ATTN_ASSIGN_OR_RETURN(
          CachedPrimitive * scores_primitive,
          GetPrimitive(PrimitiveKind::kScores, group, rows, key_length));
      ATTN_RETURN_IF_ERROR(
          Execute(*scores_primitive,
                  {{DNNL_ARG_SRC, HeadRowsView(group, rows), q + first_row * d + column},
                   {DNNL_ARG_WEIGHTS, HeadColumnsView(group, key_length), k + column},
                   {DNNL_ARG_DST, scores, scores_data}}));

      if (causal) {
        // Key j > query i is masked out. Writing -inf in place is cheaper than a mask
        // post-op on oneDNN 2.6, and the diagonal keeps every row non-empty.
        const float masked = -std::numeric_limits<float>::infinity();
        for (int64_t g = 0; g < group; ++g) {
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = first_row + r;
            float* row = scores_data + (g * rows + r) * key_length;
            if (i + 1 < key_length) std::fill(row + i + 1, row + key_length, masked);
          }
        }
      }

      // probabilities = softmax(scores) over keys, in place.
      ATTN_ASSIGN_OR_RETURN(
          CachedPrimitive * softmax_primitive,
          GetPrimitive(PrimitiveKind::kSoftmax, group, rows, key_length));
      ATTN_RETURN_IF_ERROR(Execute(
          *softmax_primitive,
          {{DNNL_ARG_SRC, scores, scores_data}, {DNNL_ARG_DST, scores, scores_data}}));

      // context = probabilities V per head, into the heads' columns of the context.
      ATTN_ASSIGN_OR_RETURN(
          CachedPrimitive * context_primitive,
          GetPrimitive(PrimitiveKind::kContext, group, rows, key_length));
      ATTN_RETURN_IF_ERROR(Execute(
          *context_primitive,
          {{DNNL_ARG_SRC, scores, scores_data},
           {DNNL_ARG_WEIGHTS, HeadRowsView(group, key_length), v + column},
           {DNNL_ARG_DST, HeadRowsView(group, rows), context + first_row * d + column}}));
    }
  }
  return absl::OkStatus();
}

}  // namespace attnserve::core
