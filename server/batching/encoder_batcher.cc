#include "server/batching/encoder_batcher.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
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
    if (work->normalize) {
      double norm = 0.0;
      for (const float value : row) norm += static_cast<double>(value) * value;
      const double scale = 1.0 / std::max(std::sqrt(norm), 1e-12);
      for (float& value : row) value = static_cast<float>(value * scale);
    }
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

int64_t EncoderWork::tokens() const {
  return std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
}

bool EncoderWork::SharesBatchWith(const EncoderWork& other) const {
  return token_ids.empty() == other.token_ids.empty();
}

absl::StatusOr<std::unique_ptr<EncoderBatcher>> EncoderBatcher::Create(
    const BatchingOptions& options,
    const std::function<absl::StatusOr<std::unique_ptr<core::TransformerEncoder>>()>&
        make_encoder) {
  if (absl::Status status = CheckBatchingOptions(options); !status.ok()) return status;
  std::unique_ptr<EncoderBatcher> batcher(new EncoderBatcher(options));
  for (int i = 0; i < options.instances; ++i) {
    absl::StatusOr<std::unique_ptr<core::TransformerEncoder>> encoder = make_encoder();
    if (!encoder.ok()) return encoder.status();
    batcher->encoders_.push_back(std::move(encoder).value());
    if (options.observer.on_device_memory) options.observer.on_device_memory(i, 0);
  }
  EncoderBatcher* self = batcher.get();
  absl::StatusOr<std::unique_ptr<BatchScheduler<EncoderWork>>> scheduler =
      BatchScheduler<EncoderWork>::Create(
          options, [self](int instance, absl::Span<EncoderWork* const> batch) {
            return self->RunBatch(self->encoders_[instance].get(), batch);
          });
  if (!scheduler.ok()) return scheduler.status();
  batcher->scheduler_ = std::move(scheduler).value();
  return batcher;
}

EncoderBatcher::~EncoderBatcher() { Shutdown(); }

absl::Status EncoderBatcher::RunBatch(core::TransformerEncoder* encoder,
                                      absl::Span<EncoderWork* const> batch) {
  const int batch_size = static_cast<int>(batch.size());
  const int64_t d = encoder->spec().d_model;
  const bool pools = encoder->spec().pools();
  const int64_t labels = encoder->spec().num_labels;
  const int64_t width = encoder->spec().pooled_width();
  // A lone request is computed from its own vectors; a batch packs them once.
  core::EncoderBatch packed;
  std::vector<int64_t> ids, types, lengths;
  std::vector<float> hidden_in;
  int64_t tokens = 0;
  bool any_types = false, any_hidden = false;
  for (EncoderWork* work : batch) {
    work->batch_size = batch_size;
    tokens += work->tokens();
    any_types |= !work->token_types.empty();
    any_hidden |= work->return_hidden;
  }
  if (batch_size == 1) {
    const EncoderWork& work = *batch.front();
    packed.token_ids = work.token_ids;
    packed.token_types = work.token_types;
    packed.hidden_states = work.hidden_states;
    packed.lengths = work.lengths;
  } else {
    for (const EncoderWork* work : batch) {
      lengths.insert(lengths.end(), work->lengths.begin(), work->lengths.end());
      ids.insert(ids.end(), work->token_ids.begin(), work->token_ids.end());
      hidden_in.insert(hidden_in.end(), work->hidden_states.begin(),
                       work->hidden_states.end());
      if (any_types) {
        if (work->token_types.empty() && !work->token_ids.empty()) {
          types.insert(types.end(), work->token_ids.size(), 0);
        } else {
          types.insert(types.end(), work->token_types.begin(), work->token_types.end());
        }
      }
    }
    packed.token_ids = ids;
    packed.token_types = types;
    packed.hidden_states = hidden_in;
    packed.lengths = lengths;
  }
  const auto sequences = static_cast<int64_t>(packed.lengths.size());
  std::vector<float> pooled(pools ? static_cast<size_t>(sequences * width) : 0);
  std::vector<float> hidden(any_hidden ? static_cast<size_t>(tokens * d) : 0);
  const absl::Time compute_start = absl::Now();
  const absl::Status status =
      encoder->Forward(packed, absl::MakeSpan(pooled), absl::MakeSpan(hidden));
  const absl::Duration compute_time = absl::Now() - compute_start;
  if (status.ok() && options_.observer.on_batch) {
    options_.observer.on_batch(batch_size, tokens, compute_time);
  }
  int64_t sequence = 0, token = 0;
  for (EncoderWork* work : batch) {
    work->compute_time = compute_time;
    const auto n = static_cast<int64_t>(work->lengths.size());
    const int64_t count = work->tokens();
    if (status.ok()) {
      if (pools && work->pooled) {
        if (labels > 0) {
          ServeScores(&pooled[sequence * width], n, labels, work);
        } else {
          ServeEmbedding(&pooled[sequence * d], n, d, work);
        }
      }
      if (work->return_hidden) {
        work->hidden.assign(reinterpret_cast<const char*>(&hidden[token * d]),
                            static_cast<size_t>(count * d) * sizeof(float));
      }
    }
    sequence += n;
    token += count;
  }
  return status;
}

}  // namespace attnserve::server
