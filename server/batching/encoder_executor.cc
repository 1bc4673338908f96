#include "server/batching/encoder_executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

namespace attnserve::server {
namespace {

// `n` pooled rows of `d` floats into `work->embedding` as the request asked for them:
// the first `dimensions` of each row, L2-normalized when `normalize`.
void ServeEmbedding(const float* pooled, int64_t n, int64_t d, EncoderWork* work) {
  const int64_t kept = work->dimensions > 0 ? std::min(work->dimensions, d) : d;
  const auto row_bytes = static_cast<size_t>(kept) * sizeof(float);
  if (kept == d && !work->normalize) {
    work->embedding.assign(reinterpret_cast<const char*>(pooled), n * row_bytes);
    return;
  }
  work->embedding.clear();
  work->embedding.reserve(n * row_bytes);
  std::vector<float> row(static_cast<size_t>(kept));
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(row.data(), pooled + i * d, row_bytes);
    if (work->normalize) core::NormalizeL2(absl::MakeSpan(row));
    work->embedding.append(reinterpret_cast<const char*>(row.data()), row_bytes);
  }
}

// `n` rows of `labels` logits into `work->scores`, through the work's activation.
void ServeScores(const float* logits, int64_t n, int64_t labels, EncoderWork* work) {
  using Activation = EncoderWork::ScoreActivation;
  std::vector<float> scores(logits, logits + n * labels);
  for (int64_t i = 0; i < n; ++i) {
    float* row = &scores[i * labels];
    if (work->score_activation == Activation::kSigmoid) {
      for (int64_t j = 0; j < labels; ++j) {
        row[j] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(row[j]))));
      }
    } else if (work->score_activation == Activation::kSoftmax) {
      const float largest = *std::max_element(row, row + labels);
      double sum = 0.0;
      for (int64_t j = 0; j < labels; ++j) sum += std::exp(double{row[j]} - largest);
      for (int64_t j = 0; j < labels; ++j) {
        row[j] = static_cast<float>(std::exp(double{row[j]} - largest) / sum);
      }
    }
  }
  work->scores.assign(reinterpret_cast<const char*>(scores.data()),
                      scores.size() * sizeof(float));
}

}  // namespace

absl::Status EncoderExecutor::Pack(absl::Span<EncoderWork* const> batch) {
  packed_ = Packed();
  Packed& packed = packed_;
  int64_t tokens = 0;
  bool any_types = false, any_hidden = false;
  for (const EncoderWork* work : batch) {
    tokens += work->tokens();
    any_types |= !work->token_types.empty();
    any_hidden |= work->return_hidden;
  }
  if (batch.size() == 1) {
    const EncoderWork& work = *batch.front();
    packed.batch.token_ids = work.token_ids;
    packed.batch.token_types = work.token_types;
    packed.batch.hidden_states = work.hidden_states;
    packed.batch.lengths = work.lengths;
  } else {
    for (const EncoderWork* work : batch) {
      packed.lengths.insert(packed.lengths.end(), work->lengths.begin(),
                            work->lengths.end());
      packed.ids.insert(packed.ids.end(), work->token_ids.begin(), work->token_ids.end());
      packed.hidden_in.insert(packed.hidden_in.end(), work->hidden_states.begin(),
                              work->hidden_states.end());
      if (any_types) {
        if (work->token_types.empty() && !work->token_ids.empty()) {
          packed.types.insert(packed.types.end(), work->token_ids.size(), 0);
        } else {
          packed.types.insert(packed.types.end(), work->token_types.begin(),
                              work->token_types.end());
        }
      }
    }
    packed.batch.token_ids = packed.ids;
    packed.batch.token_types = packed.types;
    packed.batch.hidden_states = packed.hidden_in;
    packed.batch.lengths = packed.lengths;
  }
  if (EncoderWork* work = batch.front(); work->head_statistics) {
    packed.statistics_work = work;
    const int64_t heads = encoder_->spec().num_layers * encoder_->spec().num_heads;
    work->statistics.assign(static_cast<size_t>(heads), {});
    if (work->return_attention) {
      const int64_t length = work->lengths.front();
      work->attention.assign(static_cast<size_t>(heads * length * length) * sizeof(float),
                             '\0');
    }
  }
  packed.batch.head_mask = batch.front()->head_mask;  // the same in all (SharesBatchWith)
  const core::EncoderSpec& spec = encoder_->spec();
  const auto sequences = static_cast<int64_t>(packed.batch.lengths.size());
  packed.pooled.resize(spec.pools() ? static_cast<size_t>(sequences * spec.pooled_width())
                                    : 0);
  packed.hidden.resize(any_hidden ? static_cast<size_t>(tokens * spec.d_model) : 0);
  return absl::OkStatus();
}

absl::Status EncoderExecutor::Run() {
  absl::Span<core::EncoderHeadStatistic> statistics;
  absl::Span<float> attention;
  if (packed_.statistics_work != nullptr) {
    statistics = absl::MakeSpan(packed_.statistics_work->statistics);
    std::string& bytes = packed_.statistics_work->attention;
    attention = absl::MakeSpan(reinterpret_cast<float*>(bytes.data()),
                               bytes.size() / sizeof(float));
  }
  return encoder_->Forward(packed_.batch, absl::MakeSpan(packed_.pooled),
                           absl::MakeSpan(packed_.hidden), statistics, attention);
}

void EncoderExecutor::Scatter(absl::Span<EncoderWork* const> batch, bool computed) {
  const core::EncoderSpec& spec = encoder_->spec();
  const int64_t d = spec.d_model;
  const int64_t labels = spec.num_labels;
  const int64_t width = spec.pooled_width();
  if (computed) {
    int64_t sequence = 0, token = 0;
    for (EncoderWork* work : batch) {
      const auto n = static_cast<int64_t>(work->lengths.size());
      const int64_t count = work->tokens();
      if (spec.pools() && work->pooled) {
        if (labels > 0) {
          ServeScores(&packed_.pooled[sequence * width], n, labels, work);
        } else {
          ServeEmbedding(&packed_.pooled[sequence * width], n, width, work);
        }
      }
      if (work->return_hidden) {
        work->hidden.assign(reinterpret_cast<const char*>(&packed_.hidden[token * d]),
                            static_cast<size_t>(count * d) * sizeof(float));
      }
      sequence += n;
      token += count;
    }
  }
  packed_ = Packed();
}

absl::StatusOr<std::unique_ptr<EncoderBatcher>> MakeEncoderBatcher(
    const BatchingOptions& options,
    const std::function<absl::StatusOr<std::unique_ptr<core::EncoderBackend>>()>&
        make_encoder) {
  return EncoderBatcher::Create(
      options, [&]() -> absl::StatusOr<std::unique_ptr<BatchExecutor<EncoderWork>>> {
        absl::StatusOr<std::unique_ptr<core::EncoderBackend>> encoder = make_encoder();
        if (!encoder.ok()) return encoder.status();
        return std::make_unique<EncoderExecutor>(std::move(encoder).value());
      });
}

}  // namespace attnserve::server
