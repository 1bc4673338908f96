// EncoderBatcher: requests of different lengths batched by tokens into one packed call
// give what the golden model (tests/data/encoder_tiny.*, PyTorch) gives each sequence;
// ids and hidden states do not share a batch; max_batch_tokens splits batches; the work
// serves the embedding shortened and normalized as asked.
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "core/encoder/transformer_encoder.h"
#include "core/io/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/batching/encoder_executor.h"
#include "tests/server/fake_clock.h"

namespace attnserve::server {
namespace {

const std::string kData = ATTNSERVE_TEST_DATA_DIR;
constexpr int64_t kD = 64;
constexpr double kTolerance = 1e-6;  // pooled, fp32, as the core's own golden test

core::EncoderSpec TinySpec() {
  core::EncoderSpec spec;
  spec.num_layers = 2;
  spec.d_model = kD;
  spec.num_heads = 4;
  spec.ffn_dim = 128;
  spec.vocab_size = 100;
  spec.max_positions = 64;
  spec.normalize = true;
  return spec;
}

std::vector<float> Floats(const core::SafetensorsFile& file, const char* name) {
  auto values = file.ReadFloat32(name);
  EXPECT_TRUE(values.ok()) << values.status();
  return values.ok() ? *std::move(values) : std::vector<float>();
}

struct Golden {
  std::vector<std::vector<int64_t>> ids, types;
  std::vector<float> pooled;
};

Golden ReadGolden() {
  auto io = core::SafetensorsFile::Read(kData + "/encoder_tiny.io.safetensors");
  EXPECT_TRUE(io.ok()) << io.status();
  const std::vector<float> ids = Floats(*io, "token_ids"),
                           types = Floats(*io, "token_types"),
                           lengths = Floats(*io, "lengths");
  Golden golden;
  golden.pooled = Floats(*io, "pooled");
  size_t first = 0;
  for (const float length : lengths) {
    const auto n = static_cast<size_t>(length);
    golden.ids.emplace_back(ids.begin() + first, ids.begin() + first + n);
    golden.types.emplace_back(types.begin() + first, types.begin() + first + n);
    first += n;
  }
  return golden;
}

std::function<absl::StatusOr<std::unique_ptr<core::EncoderBackend>>()> Factory() {
  return []() -> absl::StatusOr<std::unique_ptr<core::EncoderBackend>> {
    auto file = core::SafetensorsFile::Read(kData + "/encoder_tiny.weights.safetensors");
    if (!file.ok()) return file.status();
    auto weights = core::LoadBertWeights(*file, TinySpec());
    if (!weights.ok()) return weights.status();
    core::TransformerEncoder::Options options;
    options.intra_op_threads = 1;
    return core::TransformerEncoder::Create(TinySpec(), *weights, options);
  };
}

class Results {
 public:
  explicit Results(int expected) : expected_(expected) {}
  EncoderBatcher::Callback Callback(int index) {
    return [this, index](absl::Status status, std::unique_ptr<EncoderWork> work) {
      bool all;
      {
        absl::MutexLock lock(&mu_);
        EXPECT_TRUE(status.ok()) << status;
        works_[index] = std::move(work);
        all = static_cast<int>(works_.size()) == expected_;
      }
      if (all) done_.Notify();
    };
  }
  void Wait() { done_.WaitForNotification(); }
  std::map<int, std::unique_ptr<EncoderWork>>& works() { return works_; }

 private:
  const int expected_;
  absl::Mutex mu_;
  std::map<int, std::unique_ptr<EncoderWork>> works_;
  absl::Notification done_;
};

std::unique_ptr<EncoderWork> IdsWork(const Golden& golden, size_t i) {
  auto work = std::make_unique<EncoderWork>();
  work->token_ids = golden.ids[i];
  work->token_types = golden.types[i];
  work->lengths = {static_cast<int64_t>(golden.ids[i].size())};
  return work;
}

BatchingOptions FakeTime(FakeClock& clock) {
  BatchingOptions options;
  options.clock = &clock;
  options.max_queue_delay = absl::Milliseconds(10);
  options.max_batch_size = 8;
  return options;
}

TEST(EncoderBatcherTest, PacksMixedLengthsIntoOneCallAndMatchesTheGolden) {
  const Golden golden = ReadGolden();
  ASSERT_GE(golden.ids.size(), 3u);
  FakeClock clock;
  auto batcher = MakeEncoderBatcher(FakeTime(clock), Factory());
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  const int n = static_cast<int>(golden.ids.size());
  Results results(n);
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE((*batcher)->Enqueue(IdsWork(golden, i), results.Callback(i)).ok());
  }
  clock.Advance(absl::Milliseconds(10));
  results.Wait();
  EXPECT_EQ((*batcher)->stats().batches, 1);
  for (int i = 0; i < n; ++i) {
    const EncoderWork& work = *results.works()[i];
    EXPECT_EQ(work.batch_size, n);
    ASSERT_EQ(work.embedding.size(), kD * sizeof(float));
    const auto* pooled = reinterpret_cast<const float*>(work.embedding.data());
    for (int64_t c = 0; c < kD; ++c) {
      EXPECT_NEAR(pooled[c], golden.pooled[i * kD + c], kTolerance) << i << "," << c;
    }
    EXPECT_TRUE(work.hidden.empty());  // not asked
  }
}

TEST(EncoderBatcherTest, TokenBudgetSplitsBatchesAndKindsDoNotMix) {
  const Golden golden = ReadGolden();
  FakeClock clock;
  BatchingOptions options = FakeTime(clock);
  // The first two sequences fit; the third does not.
  options.max_batch_tokens =
      static_cast<int64_t>(golden.ids[0].size() + golden.ids[1].size());
  auto batcher = MakeEncoderBatcher(options, Factory());
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  Results results(4);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*batcher)->Enqueue(IdsWork(golden, i), results.Callback(i)).ok());
  }
  auto hidden = std::make_unique<EncoderWork>();
  hidden->hidden_states.assign(3 * kD, 0.25f);
  hidden->lengths = {3};
  hidden->return_hidden = true;
  ASSERT_TRUE((*batcher)->Enqueue(std::move(hidden), results.Callback(3)).ok());
  for (int round = 0; round < 3; ++round) clock.Advance(absl::Milliseconds(10));
  results.Wait();
  EXPECT_EQ(results.works()[0]->batch_size, 2);
  EXPECT_EQ(results.works()[1]->batch_size, 2);
  EXPECT_EQ(results.works()[2]->batch_size, 1);
  EXPECT_EQ(results.works()[3]->batch_size, 1);
  EXPECT_EQ(results.works()[3]->hidden.size(), 3 * kD * sizeof(float));
  EXPECT_EQ((*batcher)->stats().batches, 3);
}

TEST(EncoderBatcherTest, WorkShortensAndNormalizesTheEmbeddingItServes) {
  const Golden golden = ReadGolden();
  FakeClock clock;
  auto batcher = MakeEncoderBatcher(FakeTime(clock), Factory());
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  constexpr int64_t kKept = 16;
  // (dimensions, normalize): all as made; shortened and normalized; shortened as made.
  const std::vector<std::pair<int64_t, bool>> asked = {
      {0, false}, {kKept, true}, {kKept, false}};
  Results results(static_cast<int>(asked.size()));
  for (size_t i = 0; i < asked.size(); ++i) {
    std::unique_ptr<EncoderWork> work = IdsWork(golden, 0);
    work->dimensions = asked[i].first;
    work->normalize = asked[i].second;
    ASSERT_TRUE((*batcher)->Enqueue(std::move(work), results.Callback(i)).ok());
  }
  clock.Advance(absl::Milliseconds(10));
  results.Wait();
  // The reference in float64 from the golden's full vector.
  double norm = 0;
  for (int64_t c = 0; c < kKept; ++c) norm += golden.pooled[c] * golden.pooled[c];
  norm = std::sqrt(norm);
  for (size_t i = 0; i < asked.size(); ++i) {
    const EncoderWork& work = *results.works()[static_cast<int>(i)];
    const int64_t kept = asked[i].first > 0 ? asked[i].first : kD;
    ASSERT_EQ(work.embedding.size(), kept * sizeof(float)) << i;
    std::vector<float> served(static_cast<size_t>(kept));
    std::memcpy(served.data(), work.embedding.data(), work.embedding.size());
    for (int64_t c = 0; c < kept; ++c) {
      const double want = asked[i].second ? golden.pooled[c] / norm : golden.pooled[c];
      EXPECT_NEAR(served[c], want, kTolerance) << i << "," << c;
    }
  }
}

}  // namespace
}  // namespace attnserve::server
