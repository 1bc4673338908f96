// The tiny BERT golden make_encoder_golden.py writes (encoder_tiny.*.safetensors): its
// spec, weights and one packed batch with PyTorch's answers, for the encoder tests of
// every device.
#ifndef ATTNSERVE_TESTS_CORE_ENCODER_GOLDEN_H_
#define ATTNSERVE_TESTS_CORE_ENCODER_GOLDEN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/encoder/encoder_backend.h"
#include "core/encoder/encoder_spec.h"
#include "core/io/safetensors.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace attnserve::core::testing {

// The golden's encoder: BERT (GELU, eps 1e-12, two token types), 2 layers of d 64 in 4
// heads, feed-forward 128, 100 ids, 64 positions, mean pooling, L2-normalized.
inline EncoderSpec TinyEncoderSpec() {
  EncoderSpec spec;
  spec.num_layers = 2;
  spec.d_model = 64;
  spec.num_heads = 4;
  spec.ffn_dim = 128;
  spec.vocab_size = 100;
  spec.max_positions = 64;
  spec.pooling = EncoderSpec::Pooling::kMean;
  spec.normalize = true;
  return spec;
}

struct EncoderGolden {
  std::vector<int64_t> token_ids, token_types, lengths;
  std::vector<float> hidden, pooled;
};

// The tensors of `path` (an *.io.safetensors golden); a test failure when unreadable.
inline EncoderGolden ReadEncoderGolden(const std::string& path) {
  EncoderGolden golden;
  auto io = SafetensorsFile::Read(path);
  EXPECT_TRUE(io.ok()) << io.status();
  if (!io.ok()) return golden;
  const auto floats = [&](const char* name) {
    absl::StatusOr<std::vector<float>> values = io->ReadFloat32(name);
    EXPECT_TRUE(values.ok()) << values.status();
    return values.ok() ? *std::move(values) : std::vector<float>();
  };
  const auto integers = [&](const char* name) {
    std::vector<int64_t> values;
    for (const float value : floats(name)) values.push_back(static_cast<int64_t>(value));
    return values;
  };
  golden.token_ids = integers("token_ids");
  golden.token_types = integers("token_types");
  golden.lengths = integers("lengths");
  golden.hidden = floats("hidden");
  golden.pooled = floats("pooled");
  return golden;
}

// The whole packed batch of `golden` through `encoder`: the last hidden state within
// `hidden_tolerance` and the pooled rows within `pooled_tolerance` of golden's (the
// hidden state not asked for when hidden_tolerance < 0).
inline void ExpectBatchMatches(EncoderBackend& encoder, const EncoderGolden& golden,
                               double hidden_tolerance, double pooled_tolerance) {
  std::vector<float> hidden(hidden_tolerance < 0 ? 0 : golden.hidden.size());
  std::vector<float> pooled(golden.pooled.size());
  ASSERT_TRUE(encoder
                  .Forward({golden.token_ids, golden.token_types, golden.lengths},
                           absl::MakeSpan(pooled), absl::MakeSpan(hidden))
                  .ok());
  if (hidden_tolerance >= 0) {
    EXPECT_LE(MaxAbsDiff(absl::MakeConstSpan(hidden), absl::MakeConstSpan(golden.hidden)),
              hidden_tolerance);
  }
  EXPECT_LE(MaxAbsDiff(absl::MakeConstSpan(pooled), absl::MakeConstSpan(golden.pooled)),
            pooled_tolerance);
}

// Packing must not leak between sequences (no padding, no cross-sequence attention):
// each sequence of `golden` alone through `encoder` pools to golden's row, within
// `tolerance`.
inline void ExpectEachSequenceAloneMatches(EncoderBackend& encoder,
                                           const EncoderGolden& golden, int64_t d,
                                           double tolerance) {
  int64_t first = 0;
  for (size_t i = 0; i < golden.lengths.size(); ++i) {
    const int64_t length = golden.lengths[i];
    const std::vector<int64_t> ids(golden.token_ids.begin() + first,
                                   golden.token_ids.begin() + first + length);
    const std::vector<int64_t> types(golden.token_types.begin() + first,
                                     golden.token_types.begin() + first + length);
    const std::vector<int64_t> lengths = {length};
    std::vector<float> pooled(d);
    ASSERT_TRUE(encoder.Forward({ids, types, lengths}, absl::MakeSpan(pooled), {}).ok());
    EXPECT_LE(MaxAbsDiff(absl::MakeConstSpan(pooled),
                         absl::MakeConstSpan(golden.pooled).subspan(i * d, d)),
              tolerance)
        << "sequence " << i;
    first += length;
  }
}

// Each row of `pooled` ([sequences, d]) is its sequence's first token in golden's
// hidden state, within `tolerance`: CLS pooling.
inline void ExpectRowsAreFirstTokens(absl::Span<const float> pooled,
                                     const EncoderGolden& golden, int64_t d,
                                     double tolerance) {
  int64_t first = 0;
  for (size_t i = 0; i < golden.lengths.size(); ++i) {
    EXPECT_LE(MaxAbsDiff(pooled.subspan(i * d, d),
                         absl::MakeConstSpan(golden.hidden).subspan(first * d, d)),
              tolerance)
        << "sequence " << i;
    first += golden.lengths[i];
  }
}

}  // namespace attnserve::core::testing

#endif  // ATTNSERVE_TESTS_CORE_ENCODER_GOLDEN_H_
