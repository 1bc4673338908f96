// FlashAttention against a naive fp64 softmax(Q K^T) V, on every tiling edge: tiles of
// one row and one key, tiles that do not divide the lengths, tiles longer than the
// sequence, causal masks that cut a key block, sliding windows whose edges fall inside
// key blocks, several sequences of different lengths in one call, one and two threads.
// The vector unit is the host's, or the one ONEDNN_MAX_CPU_ISA caps it to
// (tests/core/CMakeLists.txt runs this file again at AVX2 and at SSE4.1).
#include "core/attention/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace attnserve::core {
namespace {

using ::testing::HasSubstr;
using testing::MaxAbsDiff;
using testing::RandomTokens;

struct Planes {
  int64_t query_length, key_length;
  std::vector<float> q, k, v, context;
};

Planes MakePlanes(int64_t query_length, int64_t key_length, int64_t width, uint32_t seed,
                  float query_scale) {
  Planes planes{query_length,
                key_length,
                RandomTokens(query_length * width, seed, query_scale),
                RandomTokens(key_length * width, seed + 1),
                RandomTokens(key_length * width, seed + 2),
                std::vector<float>(static_cast<size_t>(query_length * width), NAN)};
  return planes;
}

// softmax(q_p k_p^T + bias) v_p per head in fp64, keys after the query left out when
// causal, and keys more than `window` (> 0) from it; head p's bias the table of model
// head bias_heads[p] at clamp(j - i).
std::vector<double> Naive(const Planes& planes, int64_t heads, int64_t head_dim,
                          int64_t width, bool causal, const RelativeBias& bias = {},
                          const std::vector<int64_t>& bias_heads = {},
                          int64_t window = 0) {
  std::vector<double> context(planes.context.size(), 0.0);
  std::vector<double> weights(static_cast<size_t>(planes.key_length));
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t column = h * head_dim;
    for (int64_t i = 0; i < planes.query_length; ++i) {
      const int64_t first = window > 0 ? std::max<int64_t>(0, i - window) : 0;
      int64_t keys = causal ? i + 1 : planes.key_length;
      if (window > 0) {
        keys = std::min(keys, i + window + 1);
      }
      double most = -INFINITY;
      for (int64_t j = first; j < keys; ++j) {
        double dot = 0.0;
        for (int64_t c = 0; c < head_dim; ++c) {
          dot += static_cast<double>(planes.q[i * width + column + c]) *
                 planes.k[j * width + column + c];
        }
        if (!bias.empty()) {
          dot += bias.Head(
              bias_heads[h])[std::clamp(j - i, -bias.radius, bias.radius) + bias.radius];
        }
        weights[j] = dot;
        most = std::max(most, dot);
      }
      double sum = 0.0;
      for (int64_t j = first; j < keys; ++j) {
        sum += weights[j] = std::exp(weights[j] - most);
      }
      for (int64_t j = first; j < keys; ++j) {
        for (int64_t c = 0; c < head_dim; ++c) {
          context[i * width + column + c] +=
              weights[j] / sum * planes.v[j * width + column + c];
        }
      }
    }
  }
  return context;
}

// (query rows, keys) tiles, threads, causal, head_dim.
class FlashAttentionTest
    : public ::testing::TestWithParam<
          std::tuple<std::pair<int64_t, int64_t>, int, bool, int64_t>> {};

TEST_P(FlashAttentionTest, MatchesNaiveFp64) {
  const auto [tile, threads, causal, head_dim] = GetParam();
  const FlashTiles tiles{tile.first, tile.second};
  const int64_t heads = 3, width = heads * head_dim + 4;  // 4 unused columns
  // Lengths around the tiles' edges; cross-attention lengths differ unless causal.
  const std::vector<std::pair<int64_t, int64_t>> lengths = {
      {1, 1}, {5, causal ? 5 : 9}, {64, 64}, {65, causal ? 65 : 31}, {300, 300}};
  std::vector<Planes> planes;
  std::vector<FlashSequence> sequences;
  uint32_t seed = 7;
  for (const auto& [query_length, key_length] : lengths) {
    // Scores of order 10 so that the row maximum moves between key blocks and the
    // rescaling is exercised.
    planes.push_back(MakePlanes(query_length, key_length, width, seed += 3, 3.0f));
  }
  for (Planes& p : planes) {
    sequences.push_back({p.q.data(), p.k.data(), p.v.data(), p.context.data(),
                         p.query_length, p.key_length});
  }
  // Without a bias, and with one of 4 model heads read in another order (radius 20:
  // the 300-token sequence's offsets pass it on both sides); without a window and with
  // windows of 1, 5 and 64 keys each side, whose edges fall inside the key blocks (and
  // leave whole blocks out, and rows of a query block with no key in its first blocks).
  const std::vector<float> table = RandomTokens(4 * 41, 77, 2.0f);
  const std::vector<int64_t> bias_heads = {3, 0, 2};
  for (const auto& [with_bias, window] : std::vector<std::pair<bool, int64_t>>{
           {false, 0}, {true, 0}, {false, 1}, {true, 5}, {false, 64}}) {
    const RelativeBias bias = with_bias ? RelativeBias{table, 20} : RelativeBias{};
    // A window is defined for self-attention: its sequences are those of equal lengths.
    std::vector<FlashSequence> run;
    std::vector<size_t> run_planes;
    for (size_t s = 0; s < planes.size(); ++s) {
      if (window == 0 || planes[s].query_length == planes[s].key_length) {
        run.push_back(sequences[s]);
        run_planes.push_back(s);
      }
    }
    FlashScratch scratch;
    ASSERT_TRUE(FlashAttention(run, heads, head_dim, width, causal, tiles, threads,
                               scratch, bias, bias_heads, window)
                    .ok());
    for (const size_t s : run_planes) {
      const std::vector<double> expected =
          Naive(planes[s], heads, head_dim, width, causal, bias, bias_heads, window);
      // Only the heads' columns are written; the last 4 of each row keep their NaN.
      std::vector<float> got;
      std::vector<double> want;
      for (int64_t i = 0; i < planes[s].query_length; ++i) {
        for (int64_t c = 0; c < width; ++c) {
          const float value = planes[s].context[i * width + c];
          if (c >= heads * head_dim) {
            EXPECT_TRUE(std::isnan(value)) << "column " << c << " was written";
            continue;
          }
          got.push_back(value);
          want.push_back(expected[i * width + c]);
        }
      }
      // fp32 products of up to 64 terms of order 10, exponentials within 2e-7
      // relative.
      EXPECT_LE((MaxAbsDiff<float, double>(got, want)), 2e-5)
          << "sequence " << s << " (" << planes[s].query_length << " x "
          << planes[s].key_length << "), tiles " << tiles.query_rows << " x "
          << tiles.keys << ", " << threads << " threads, unit " << FlashVectorUnit()
          << (with_bias ? ", with a relative bias" : "") << ", window " << window;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tilings, FlashAttentionTest,
    ::testing::Combine(::testing::Values(std::pair<int64_t, int64_t>{1, 1},
                                         std::pair<int64_t, int64_t>{16, 7},
                                         std::pair<int64_t, int64_t>{64, 256},
                                         std::pair<int64_t, int64_t>{3, 500}),
                       ::testing::Values(1, 2), ::testing::Bool(),
                       // 64 and 16: whole AVX-512 and AVX2 vectors (the register
                       // kernels); 24: whole AVX2 vectors only; 20: neither (sgemm).
                       ::testing::Values(int64_t{64}, int64_t{16}, int64_t{24},
                                         int64_t{20})));

// Each key block's row maximum is taken inside the scores kernel, over the row's valid
// keys only. Scores near -128 would all flush to 0 (and the rows to NaN) if a zero
// padding key or a masked later key entered that maximum; so would causal rows whose
// later, masked keys score far above the visible ones.
TEST(FlashAttentionShiftTest, RowMaximumCoversOnlyVisibleKeys) {
  const int64_t heads = 2, head_dim = 64, width = heads * head_dim;
  for (const bool causal : {false, true}) {
    // 45 keys: one whole 32-key panel (AVX-512) or two 16-key ones (AVX2), then a
    // partial panel.
    Planes planes = MakePlanes(45, 45, width, 11, 0.1f);
    for (int64_t j = 0; j < planes.key_length; ++j) {
      for (int64_t c = 0; c < width; ++c) {
        float& key = planes.k[j * width + c];
        // Non-causal: q.k near -128 for every key. Causal: q.k grows by ~6.4 a key, so
        // every row's masked keys outscore its visible ones by hundreds.
        key = causal ? 0.1f * static_cast<float>(j) + 0.01f * key : 1.0f + 0.1f * key;
      }
    }
    for (float& query : planes.q) query = causal ? 1.0f + query : -2.0f + query;
    for (const FlashTiles tiles : {FlashTiles{64, 256}, FlashTiles{16, 7}}) {
      std::fill(planes.context.begin(), planes.context.end(), NAN);
      const FlashSequence sequence{planes.q.data(),     planes.k.data(),
                                   planes.v.data(),     planes.context.data(),
                                   planes.query_length, planes.key_length};
      FlashScratch scratch;
      ASSERT_TRUE(FlashAttention({&sequence, 1}, heads, head_dim, width, causal, tiles, 1,
                                 scratch)
                      .ok());
      // Scores of order 100 in fp32 carry errors of order 1e-5 into the weights.
      EXPECT_LE((MaxAbsDiff<float, double>(
                    planes.context, Naive(planes, heads, head_dim, width, causal))),
                2e-4)
          << (causal ? "causal" : "full") << ", tiles " << tiles.query_rows << " x "
          << tiles.keys << ", unit " << FlashVectorUnit();
    }
  }
}

TEST(FlashAttentionErrorsTest, RefusesBadTilesAndShapes) {
  Planes planes = MakePlanes(4, 6, 8, 1, 1.0f);
  const FlashSequence sequence{
      planes.q.data(), planes.k.data(), planes.v.data(), planes.context.data(), 4, 6};
  FlashScratch scratch;
  const absl::Status tiles =
      FlashAttention({&sequence, 1}, 2, 4, 8, false, FlashTiles{0, 16}, 1, scratch);
  EXPECT_EQ(tiles.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tiles.message(), HasSubstr("0 query rows"));
  const absl::Status causal =
      FlashAttention({&sequence, 1}, 2, 4, 8, true, FlashTiles{}, 1, scratch);
  EXPECT_EQ(causal.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(causal.message(), HasSubstr("query_length 4 != key_length 6"));
  const absl::Status wide =
      FlashAttention({&sequence, 1}, 3, 4, 8, false, FlashTiles{}, 1, scratch);
  EXPECT_EQ(wide.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wide.message(), HasSubstr("heads 3, head_dim 4, width 8"));
  const std::vector<float> table(2 * 3, 0.0f);
  const std::vector<int64_t> one_head = {0};
  const absl::Status bias_heads = FlashAttention(
      {&sequence, 1}, 2, 4, 8, false, FlashTiles{}, 1, scratch, {table, 1}, one_head);
  EXPECT_EQ(bias_heads.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bias_heads.message(), HasSubstr("one model head per head (2), got 1"));
  const absl::Status window = FlashAttention({&sequence, 1}, 2, 4, 8, false, FlashTiles{},
                                             1, scratch, {}, {}, -1);
  EXPECT_EQ(window.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(window.message(), HasSubstr("window must be >= 0 (0: every key), got -1"));
  const absl::Status cross_window =
      FlashAttention({&sequence, 1}, 2, 4, 8, false, FlashTiles{}, 1, scratch, {}, {}, 2);
  EXPECT_EQ(cross_window.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cross_window.message(),
              HasSubstr("windowed sequence 0 has query_length 4 != key_length 6"));
  // Grouped-query: one key/value head per head, each within kv_width.
  const std::vector<int64_t> past_kv = {0, 2};
  const absl::Status kv = FlashAttention({&sequence, 1}, 2, 4, 8, false, FlashTiles{}, 1,
                                         scratch, {}, {}, 0, FlashKv{past_kv, 8});
  EXPECT_EQ(kv.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(kv.message(), HasSubstr("kv_of needs one key/value head"));
  const std::vector<int64_t> shared = {0, 0};
  EXPECT_TRUE(FlashAttention({&sequence, 1}, 2, 4, 8, false, FlashTiles{}, 1, scratch, {},
                             {}, 0, FlashKv{shared, 4})
                  .ok());
}

// A key block that no row of a query block sees is never read: NaN values of keys
// 300..309 reach only the query blocks whose window meets a key block holding them
// (with a product over masked keys instead, 0 * NaN would reach every row).
TEST(FlashAttentionWindowTest, SkipsKeyBlocksOutsideEveryWindow) {
  const int64_t heads = 2, width = heads * 16;
  // head_dim 16: the register kernels; 10: oneDNN's sgemm.
  for (const int64_t head_dim : {int64_t{16}, int64_t{10}}) {
    const int64_t used = heads * head_dim;
    Planes planes = MakePlanes(600, 600, width, 31, 1.0f);
    for (int64_t j = 300; j < 310; ++j) {
      for (int64_t c = 0; c < width; ++c) {
        planes.v[j * width + c] = NAN;
      }
    }
    for (const bool causal : {false, true}) {
      std::fill(planes.context.begin(), planes.context.end(), NAN);
      const FlashSequence sequence{planes.q.data(),     planes.k.data(),
                                   planes.v.data(),     planes.context.data(),
                                   planes.query_length, planes.key_length};
      FlashScratch scratch;
      ASSERT_TRUE(FlashAttention({&sequence, 1}, heads, head_dim, width, causal,
                                 FlashTiles{16, 32}, 1, scratch, {}, {}, /*window=*/3)
                      .ok());
      const std::vector<double> expected =
          Naive(planes, heads, head_dim, width, causal, {}, {}, 3);
      // Key blocks are at most 64 keys (32 rounded up to a panel): rows more than
      // 64 + 16 + 3 from the poisoned keys read none of their blocks, whatever the
      // unit.
      for (int64_t i = 0; i < planes.query_length; ++i) {
        if (i > 300 - 90 && i < 310 + 90) {
          continue;
        }
        for (int64_t c = 0; c < used; ++c) {
          ASSERT_NEAR(planes.context[i * width + c], expected[i * width + c], 1e-5)
              << "row " << i << ", column " << c << (causal ? ", causal" : "")
              << ", head_dim " << head_dim << ", unit " << FlashVectorUnit();
        }
      }
    }
  }
}

// Runs where CMake caps oneDNN's ISA: the exponentials follow the cap.
TEST(FlashAttentionUnitTest, FollowsOneDnnIsaCap) {
  const char* expected = std::getenv("ATTNSERVE_EXPECT_FLASH_UNIT");
  if (expected == nullptr) GTEST_SKIP() << "runs with ONEDNN_MAX_CPU_ISA set";
  EXPECT_EQ(FlashVectorUnit(), std::string(expected));
}

}  // namespace
}  // namespace attnserve::core
