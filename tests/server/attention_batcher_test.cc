#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "core/attention/attention_weights.h"
#include "core/attention/multi_head_attention.h"
#include "core/base/bfloat16.h"
#include "core/base/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/batching/attention_executor.h"
#include "tests/server/fake_clock.h"

namespace attnserve::server {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kDModel = 16;

std::function<absl::StatusOr<std::unique_ptr<core::AttentionBackend>>()> Factory(
    core::Precision precision = core::Precision::kFp32) {
  return [precision] {
    core::ModelSpec spec;
    spec.d_model = kDModel;
    spec.num_heads = 2;
    spec.precision = precision;
    return core::CreateBackend(spec, core::GenerateAttentionWeights(spec, 1),
                               core::Device{}, {});
  };
}

std::unique_ptr<AttentionWork> Work(int64_t length, float fill = 0.5f) {
  auto work = std::make_unique<AttentionWork>();
  work->query = InputTensor::FromFloats(std::vector<float>(length * kDModel, fill));
  work->query_lengths = {length};
  return work;
}

// Collects callbacks; Wait() blocks until `expected` arrived.
class Results {
 public:
  explicit Results(int expected) : expected_(expected) {}
  WorkCallback Callback() {
    return [this](absl::Status status, std::unique_ptr<AttentionWork> work) {
      bool all_arrived;
      {
        absl::MutexLock lock(&mu_);
        statuses_.push_back(status);
        works_.push_back(std::move(work));
        all_arrived = static_cast<int>(statuses_.size()) == expected_;
      }
      // Last touch of *this: once notified, the test may destroy it (notifying under
      // mu_ let the test destroy mu_ while this thread still held it; TSan found it).
      if (all_arrived) done_.Notify();
    };
  }
  void Wait() { done_.WaitForNotification(); }
  std::vector<absl::Status> statuses() {
    absl::MutexLock lock(&mu_);
    return statuses_;
  }
  std::vector<std::unique_ptr<AttentionWork>>& works() { return works_; }

 private:
  const int expected_;
  absl::Mutex mu_;
  std::vector<absl::Status> statuses_;
  std::vector<std::unique_ptr<AttentionWork>> works_;
  absl::Notification done_;
};

BatchingOptions FakeTimeOptions(FakeClock& clock) {
  BatchingOptions options;
  options.clock = &clock;
  options.max_queue_delay = absl::Milliseconds(10);
  options.max_batch_size = 4;
  return options;
}

// The batching policy itself is tested without a core in batch_scheduler_test.cc; these
// tests cover what the attention batcher adds: the attention executor and AttentionWork's
// rule for sharing a batch.
TEST(AttentionBatcherTest, FlushesPartialBatchAfterDelay) {
  FakeClock clock;
  auto batcher = MakeAttentionBatcher(FakeTimeOptions(clock), Factory());
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  Results results(3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*batcher)->Enqueue(Work(2 + i), results.Callback()).ok());
  }
  // Time has not moved: the three wait for company (fewer than max_batch_size=4).
  EXPECT_EQ((*batcher)->stats().batches, 0);
  clock.Advance(absl::Milliseconds(10));
  results.Wait();
  const BatcherStats stats = (*batcher)->stats();
  EXPECT_EQ(stats.batches, 1);
  EXPECT_EQ(stats.computed_requests, 3);
  for (const auto& work : results.works()) {
    EXPECT_EQ(work->batch_size, 3);
    EXPECT_EQ(work->queue_time, absl::Milliseconds(10));
  }
}

TEST(AttentionBatcherTest, DifferentSettingsDoNotShareABatch) {
  FakeClock clock;
  auto batcher = MakeAttentionBatcher(FakeTimeOptions(clock), Factory());
  ASSERT_TRUE(batcher.ok());
  Results results(3);
  auto causal = Work(3);
  causal->causal = true;
  ASSERT_TRUE((*batcher)->Enqueue(Work(3), results.Callback()).ok());
  ASSERT_TRUE((*batcher)->Enqueue(std::move(causal), results.Callback()).ok());
  ASSERT_TRUE((*batcher)->Enqueue(Work(5), results.Callback()).ok());
  clock.Advance(absl::Milliseconds(10));
  results.Wait();
  EXPECT_EQ((*batcher)->stats().batches, 2);
  EXPECT_EQ((*batcher)->stats().max_batch_size_seen, 2);
}

TEST(AttentionBatcherTest, PackedResultsMatchEachRequestAlone) {
  FakeClock clock;
  auto batcher = MakeAttentionBatcher(FakeTimeOptions(clock), Factory());
  ASSERT_TRUE(batcher.ok());
  auto alone = Factory()();
  ASSERT_TRUE(alone.ok());
  Results results(3);
  const std::vector<int64_t> lengths = {1, 7, 4};
  std::map<int64_t, std::vector<float>> inputs;  // by length (each length once)
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<float>& values = inputs[lengths[i]];
    values.resize(lengths[i] * kDModel);
    for (size_t j = 0; j < values.size(); ++j) values[j] = 0.01f * (i + 1) * (j % 13);
    auto work = Work(lengths[i]);
    work->query = InputTensor::FromFloats(values);
    ASSERT_TRUE((*batcher)->Enqueue(std::move(work), results.Callback()).ok());
  }
  clock.Advance(absl::Milliseconds(10));
  results.Wait();
  for (const auto& work : results.works()) {
    const std::vector<float>& query = inputs.at(work->query_lengths.front());
    std::vector<float> expected(query.size());
    ASSERT_TRUE((*alone)
                    ->Forward({query, work->query_lengths}, {}, absl::MakeSpan(expected))
                    .ok());
    const absl::Span<const float> output = work->output_values();
    ASSERT_EQ(output.size(), expected.size());
    for (size_t j = 0; j < expected.size(); ++j) {
      EXPECT_NEAR(output[j], expected[j], 1e-6);
    }
  }
}

// Cross-attention with weights, inputs in float32 and bf16 in one batch: each input is
// packed once from its own bytes (bf16 widened), and every result lands in its request.
TEST(AttentionBatcherTest, MixedDtypeCrossAttentionBatchMatchesEachRequestAlone) {
  FakeClock clock;
  auto batcher = MakeAttentionBatcher(FakeTimeOptions(clock), Factory());
  ASSERT_TRUE(batcher.ok());
  auto alone = Factory()();
  ASSERT_TRUE(alone.ok());
  const std::vector<int64_t> lengths = {3, 6, 2}, memory_lengths = {5, 1, 4};
  std::map<int64_t, std::vector<float>> queries, memories;  // float32 values, by length
  std::vector<std::string> bf16_bytes(lengths.size());      // outlive the batch
  Results results(3);
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<float>& query = queries[lengths[i]];
    std::vector<float>& memory = memories[lengths[i]];
    query.resize(lengths[i] * kDModel);
    memory.resize(memory_lengths[i] * kDModel);
    for (size_t j = 0; j < query.size(); ++j)
      query[j] = 0.02f * ((j * (i + 3)) % 17) - 0.1f;
    for (size_t j = 0; j < memory.size(); ++j) memory[j] = 0.03f * ((j * (i + 5)) % 11);
    auto work = std::make_unique<AttentionWork>();
    if (i == 1) {  // bf16 on the wire: the reference gets the widened values
      for (float& value : query) {
        const uint16_t bits = core::FloatToBf16(value);
        value = core::Bf16ToFloat(bits);
        bf16_bytes[i].append(reinterpret_cast<const char*>(&bits), 2);
      }
      work->query = InputTensor(bf16_bytes[i], /*bf16=*/true);
    } else {
      work->query = InputTensor::FromFloats(query);
    }
    work->query_lengths = {lengths[i]};
    work->memory = InputTensor::FromFloats(memory);
    work->memory_lengths = {memory_lengths[i]};
    work->return_attention = true;
    ASSERT_TRUE((*batcher)->Enqueue(std::move(work), results.Callback()).ok());
  }
  clock.Advance(absl::Milliseconds(10));
  results.Wait();
  EXPECT_EQ((*batcher)->stats().batches, 1);
  for (const auto& work : results.works()) {
    const std::vector<float>& query = queries.at(work->query_lengths.front());
    const std::vector<float>& memory = memories.at(work->query_lengths.front());
    std::vector<float> output(query.size());
    std::vector<float> weights(core::AttentionWeightsSize(
        (*alone)->spec().num_heads, work->query_lengths, work->memory_lengths));
    ASSERT_TRUE((*alone)
                    ->Forward({query, work->query_lengths, memory, work->memory_lengths},
                              {}, absl::MakeSpan(output), absl::MakeSpan(weights))
                    .ok());
    ASSERT_EQ(work->output_values().size(), output.size());
    ASSERT_EQ(work->attention_values().size(), weights.size());
    for (size_t j = 0; j < output.size(); ++j) {
      EXPECT_NEAR(work->output_values()[j], output[j], 1e-6);
    }
    for (size_t j = 0; j < weights.size(); ++j) {
      EXPECT_NEAR(work->attention_values()[j], weights[j], 1e-6);
    }
  }
}

// A batch whose inputs are all bf16 is packed as bf16 bits (no widening in the
// server): each result equals the model run alone on the same bits, for an fp32 model
// (which widens inside the core) and for a bf16 model (which computes on them).
void ExpectAllBf16BatchMatchesEachRequestAlone(core::Precision precision) {
  FakeClock clock;
  auto batcher = MakeAttentionBatcher(FakeTimeOptions(clock), Factory(precision));
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  auto alone = Factory(precision)();
  ASSERT_TRUE(alone.ok());
  const std::vector<int64_t> lengths = {3, 6, 2}, memory_lengths = {5, 1, 4};
  std::map<int64_t, std::vector<uint16_t>> queries, memories;  // bits, by length
  std::vector<std::string> query_bytes(lengths.size()), memory_bytes(lengths.size());
  Results results(3);
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<uint16_t>& query = queries[lengths[i]];
    std::vector<uint16_t>& memory = memories[lengths[i]];
    for (int64_t j = 0; j < lengths[i] * kDModel; ++j) {
      query.push_back(core::FloatToBf16(0.02f * ((j * (i + 3)) % 17) - 0.1f));
    }
    for (int64_t j = 0; j < memory_lengths[i] * kDModel; ++j) {
      memory.push_back(core::FloatToBf16(0.03f * ((j * (i + 5)) % 11)));
    }
    query_bytes[i].assign(reinterpret_cast<const char*>(query.data()), query.size() * 2);
    memory_bytes[i].assign(reinterpret_cast<const char*>(memory.data()),
                           memory.size() * 2);
    auto work = std::make_unique<AttentionWork>();
    work->query = InputTensor(query_bytes[i], /*bf16=*/true);
    work->query_lengths = {lengths[i]};
    work->memory = InputTensor(memory_bytes[i], /*bf16=*/true);
    work->memory_lengths = {memory_lengths[i]};
    ASSERT_TRUE((*batcher)->Enqueue(std::move(work), results.Callback()).ok());
  }
  clock.Advance(absl::Milliseconds(10));
  results.Wait();
  EXPECT_EQ((*batcher)->stats().batches, 1);
  for (const auto& work : results.works()) {
    core::AttentionBatch batch;
    batch.query_bf16 = queries.at(work->query_lengths.front());
    batch.query_lengths = work->query_lengths;
    batch.memory_bf16 = memories.at(work->query_lengths.front());
    batch.memory_lengths = work->memory_lengths;
    std::vector<float> output(batch.query_bf16.size());
    ASSERT_TRUE((*alone)->Forward(batch, {}, absl::MakeSpan(output)).ok());
    ASSERT_EQ(work->output_values().size(), output.size());
    for (size_t j = 0; j < output.size(); ++j) {
      EXPECT_NEAR(work->output_values()[j], output[j], 1e-6);
    }
  }
}

TEST(AttentionBatcherTest, AllBf16BatchStaysBf16ForAnFp32Model) {
  ExpectAllBf16BatchMatchesEachRequestAlone(core::Precision::kFp32);
}

TEST(AttentionBatcherTest, AllBf16BatchStaysBf16ForABf16Model) {
  if (!core::MultiHeadAttention::SupportsBf16()) {
    GTEST_SKIP() << "no AVX512_BF16 or AMX on this host: bf16 models are refused here";
  }
  ExpectAllBf16BatchMatchesEachRequestAlone(core::Precision::kBf16);
}

TEST(AttentionBatcherTest, RejectsBadOptionsByName) {
  BatchingOptions options;
  options.max_batch_size = 0;
  auto batcher = MakeAttentionBatcher(options, Factory());
  EXPECT_EQ(batcher.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(batcher.status().message(), HasSubstr("max_batch_size"));
  options = BatchingOptions();
  options.max_queue_delay = absl::Milliseconds(-1);
  batcher = MakeAttentionBatcher(options, Factory());
  EXPECT_THAT(batcher.status().message(), HasSubstr("max_queue_delay"));
}

}  // namespace
}  // namespace attnserve::server
