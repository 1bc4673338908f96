// AttentionService over a real gRPC server on loopback, called with the client library.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "core/attention/attention_weights.h"
#include "core/attention/multi_head_attention.h"
#include "core/base/bfloat16.h"
#include "core/base/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/pipeline/proto_convert.h"
#include "tests/server/test_server.h"

namespace attnserve::server {
namespace {

using ::attnserve::client::Float32Tensor;
using ::attnserve::client::Float32Values;
using ::attnserve::server::testing::RandomValues;
using ::attnserve::server::testing::StartServer;
using ::attnserve::server::testing::TestServer;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kD = 512;
constexpr int64_t kHeads = 8;

// The default model computed directly by the core, as the reference for the wire.
class DirectModel {
 public:
  DirectModel() {
    attention_ = std::move(core::MultiHeadAttention::Create(
                               spec_, core::GenerateAttentionWeights(spec_, 0),
                               *core::CreateCpuEngine()))
                     .value();
  }
  std::vector<core::HeadStatistic> Statistics(const std::vector<float>& query,
                                              const std::vector<int64_t>& lengths,
                                              bool causal) {
    std::vector<core::HeadStatistic> statistics(kHeads);
    EXPECT_TRUE(
        attention_->HeadStatistics({query, lengths}, causal, absl::MakeSpan(statistics))
            .ok());
    return statistics;
  }
  std::vector<float> Run(const std::vector<float>& query,
                         const std::vector<int64_t>& lengths,
                         const std::vector<float>& memory = {},
                         const std::vector<int64_t>& memory_lengths = {},
                         bool causal = false, const std::vector<float>& mask = {},
                         std::vector<float>* weights = nullptr) {
    std::vector<float> output(query.size());
    if (weights != nullptr) {
      weights->resize(core::AttentionWeightsSize(kHeads, lengths, memory_lengths));
    }
    EXPECT_TRUE(attention_
                    ->Forward({query, lengths, memory, memory_lengths}, {causal, mask},
                              absl::MakeSpan(output),
                              weights ? absl::MakeSpan(*weights) : absl::Span<float>())
                    .ok());
    return output;
  }

 private:
  core::ModelSpec spec_;
  std::unique_ptr<core::MultiHeadAttention> attention_;
};

void ExpectClose(const std::vector<float>& actual, const std::vector<float>& expected,
                 double tolerance = 1e-6) {
  ASSERT_EQ(actual.size(), expected.size());
  double worst = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(actual[i]) - expected[i]));
  }
  EXPECT_LE(worst, tolerance);
}

v1::AttendRequest Request(int64_t length, uint32_t seed) {
  v1::AttendRequest request;
  request.set_model("mha-base");
  *request.mutable_query() = Float32Tensor(RandomValues(length * kD, seed), {length, kD});
  return request;
}

class AttentionServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new TestServer(StartServer()); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static TestServer* server_;
  DirectModel direct_;
};
TestServer* AttentionServiceTest::server_ = nullptr;

TEST_F(AttentionServiceTest, SelfAttentionMatchesCore) {
  const v1::AttendRequest request = Request(37, 1);
  auto response = server_->client->Attend(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->model(), "mha-base");
  EXPECT_THAT(response->output().shape(), ::testing::ElementsAre(37, kD));
  ExpectClose(*Float32Values(response->output()),
              direct_.Run(*Float32Values(request.query()), {37}));
}

TEST_F(AttentionServiceTest, RankThreeQueryIsNSequences) {
  v1::AttendRequest request;
  const std::vector<float> query = RandomValues(3 * 5 * kD, 2);
  *request.mutable_query() = Float32Tensor(query, {3, 5, kD});
  auto response = server_->client->Attend(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_THAT(response->output().shape(), ::testing::ElementsAre(3, 5, kD));
  ExpectClose(*Float32Values(response->output()), direct_.Run(query, {5, 5, 5}));
}

TEST_F(AttentionServiceTest, CrossAttentionMatchesCore) {
  v1::AttendRequest request = Request(6, 3);
  const std::vector<float> memory = RandomValues(11 * kD, 4);
  *request.mutable_memory() = Float32Tensor(memory, {11, kD});
  request.set_return_attention(true);
  auto response = server_->client->Attend(request);
  ASSERT_TRUE(response.ok()) << response.status();
  std::vector<float> weights;
  ExpectClose(*Float32Values(response->output()),
              direct_.Run(*Float32Values(request.query()), {6}, memory, {11}, false, {},
                          &weights));
  EXPECT_THAT(response->attention().shape(), ::testing::ElementsAre(kHeads, 6, 11));
  ExpectClose(*Float32Values(response->attention()), weights);
}

TEST_F(AttentionServiceTest, CausalWithHeadMaskAndWeightsMatchesCore) {
  v1::AttendRequest request = Request(9, 5);
  request.set_causal(true);
  const std::vector<float> mask = {1, 0, 1, 0.5f, 1, 1, 0.25f, 1};
  request.mutable_head_mask()->Add(mask.begin(), mask.end());
  request.set_return_attention(true);
  request.set_request_id("req-42");
  auto response = server_->client->Attend(request);
  ASSERT_TRUE(response.ok()) << response.status();
  std::vector<float> weights;
  ExpectClose(
      *Float32Values(response->output()),
      direct_.Run(*Float32Values(request.query()), {9}, {}, {}, true, mask, &weights));
  ExpectClose(*Float32Values(response->attention()), weights);
  EXPECT_EQ(response->request_id(), "req-42");
  EXPECT_GE(response->batch_size(), 1);
}

TEST_F(AttentionServiceTest, Bf16QueryGetsBf16OutputCloseToFp32) {
  const v1::AttendRequest fp32 = Request(8, 6);
  const std::vector<float> values = *Float32Values(fp32.query());
  v1::AttendRequest bf16 = fp32;
  std::string raw(values.size() * 2, '\0');
  std::vector<float> rounded(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits = core::FloatToBf16(values[i]);
    std::memcpy(raw.data() + 2 * i, &bits, 2);
    rounded[i] = core::Bf16ToFloat(bits);
  }
  bf16.mutable_query()->set_dtype(v1::DATA_TYPE_BF16);
  bf16.mutable_query()->set_raw(raw);
  auto response = server_->client->Attend(bf16);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->output().dtype(), v1::DATA_TYPE_BF16);
  const std::vector<float> expected = direct_.Run(rounded, {8});
  ASSERT_EQ(response->output().raw().size(), expected.size() * 2);
  for (size_t i = 0; i < expected.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, response->output().raw().data() + 2 * i, 2);
    // One bf16 rounding of the output: relative error <= 2^-8.
    EXPECT_NEAR(core::Bf16ToFloat(bits), expected[i], std::abs(expected[i]) / 256 + 1e-6);
  }
}

TEST_F(AttentionServiceTest, HeadStatisticsMatchTheCore) {
  const v1::AttendRequest attend = Request(24, 31);
  v1::HeadStatisticsRequest request;
  *request.mutable_query() = attend.query();  // no model: the default one
  request.set_causal(true);
  auto response = server_->client->HeadStatistics(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->model(), "mha-base");
  EXPECT_EQ(response->tokens(), 24);
  const std::vector<core::HeadStatistic> expected =
      direct_.Statistics(*Float32Values(attend.query()), {24}, true);
  ASSERT_EQ(response->heads_size(), kHeads);
  for (int64_t head = 0; head < kHeads; ++head) {
    const v1::HeadStatistic& got = response->heads(static_cast<int>(head));
    EXPECT_EQ(got.head(), head);
    EXPECT_FALSE(got.pruned());
    EXPECT_NEAR(got.mean_entropy(), expected[head].mean_entropy, 1e-6);
    EXPECT_NEAR(got.mean_max_weight(), expected[head].mean_max_weight, 1e-6);
    EXPECT_NEAR(got.mean_output_norm(), expected[head].mean_output_norm, 1e-6);
    // Causal rows of a 24-token sequence: between one key and uniform over 24.
    EXPECT_GT(got.mean_entropy(), 0.0);
    EXPECT_LT(got.mean_entropy(), std::log(24.0));
  }
}

TEST_F(AttentionServiceTest, HeadStatisticsValidateLikeAttend) {
  v1::HeadStatisticsRequest request;
  *request.mutable_query() = Float32Tensor(RandomValues(4 * 100, 32), {4, 100});
  auto response = server_->client->HeadStatistics(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(), HasSubstr("query.shape"));
  EXPECT_THAT(response.status().message(), HasSubstr("512"));
  // The server keeps serving.
  EXPECT_TRUE(server_->client->Attend(Request(3, 33)).ok());
}

TEST_F(AttentionServiceTest, ConcurrentClientsEachGetTheirOwnAnswer) {
  constexpr int kClients = 64;
  std::vector<v1::AttendRequest> requests;
  for (int i = 0; i < kClients; ++i)
    requests.push_back(Request(1 + (i * 7) % 40, 100 + i));
  std::vector<absl::StatusOr<v1::AttendResponse>> responses(kClients,
                                                            absl::UnknownError("unset"));
  absl::BlockingCounter pending(kClients);
  for (int i = 0; i < kClients; ++i) {
    server_->client->AttendAsync(requests[i], absl::Seconds(60),
                                 [&responses, &pending, i](auto response) {
                                   responses[i] = std::move(response);
                                   pending.DecrementCount();
                                 });
  }
  pending.Wait();
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(responses[i].ok()) << i << ": " << responses[i].status();
    const int64_t length = requests[i].query().shape(0);
    ExpectClose(*Float32Values(responses[i]->output()),
                direct_.Run(*Float32Values(requests[i].query()), {length}));
  }
}

TEST_F(AttentionServiceTest, ListsAndDescribesModels) {
  auto models = server_->client->ListModels();
  ASSERT_TRUE(models.ok());
  ASSERT_EQ(models->size(), 1u);
  EXPECT_EQ((*models)[0].name(), "mha-base");
  EXPECT_EQ((*models)[0].d_model(), kD);
  EXPECT_EQ((*models)[0].num_heads(), kHeads);
  EXPECT_EQ((*models)[0].precision(), v1::PRECISION_FP32);
  auto model = server_->client->GetModel("mha-base");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->max_sequence_length(), 8192);
  EXPECT_EQ(model->batching().max_batch_size(), 32);
  auto missing = server_->client->GetModel("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(AttentionServiceTest, HealthIsServingOverallPerModelAndPerService) {
  EXPECT_TRUE(*server_->client->IsServing(""));
  EXPECT_TRUE(*server_->client->IsServing("mha-base"));
  EXPECT_TRUE(*server_->client->IsServing("attnserve.v1.AttentionService"));
  EXPECT_EQ(server_->client->IsServing("unknown-model").status().code(),
            absl::StatusCode::kNotFound);
}

// --- Bad input: one case each, the code, the field and the expected value. ---

class BadInputTest : public AttentionServiceTest {
 protected:
  void ExpectRejected(const v1::AttendRequest& request, absl::StatusCode code,
                      const std::vector<std::string>& words) {
    auto response = server_->client->Attend(request);
    ASSERT_FALSE(response.ok());
    EXPECT_EQ(response.status().code(), code) << response.status();
    for (const std::string& word : words) {
      EXPECT_THAT(response.status().message(), HasSubstr(word));
    }
    // The server keeps serving after every rejection.
    EXPECT_TRUE(server_->client->Attend(Request(2, 9)).ok());
  }
};

TEST_F(BadInputTest, UnknownModelIsNotFound) {
  v1::AttendRequest request = Request(2, 1);
  request.set_model("gpt-17");
  ExpectRejected(request, absl::StatusCode::kNotFound, {"gpt-17", "mha-base"});
}

TEST_F(BadInputTest, MissingQuery) {
  v1::AttendRequest request;
  ExpectRejected(request, absl::StatusCode::kInvalidArgument, {"query is required"});
}

TEST_F(BadInputTest, UnspecifiedDtype) {
  v1::AttendRequest request = Request(2, 1);
  request.mutable_query()->set_dtype(v1::DATA_TYPE_UNSPECIFIED);
  ExpectRejected(
      request, absl::StatusCode::kInvalidArgument,
      {"query.dtype", "DATA_TYPE_FP32 or DATA_TYPE_BF16", "DATA_TYPE_UNSPECIFIED"});
}

TEST_F(BadInputTest, RankOne) {
  v1::AttendRequest request;
  *request.mutable_query() = Float32Tensor(RandomValues(kD, 1), {kD});
  ExpectRejected(request, absl::StatusCode::kInvalidArgument,
                 {"query.shape", "rank 2", "got rank 1"});
}

TEST_F(BadInputTest, RankFour) {
  v1::AttendRequest request;
  *request.mutable_query() = Float32Tensor(RandomValues(kD, 1), {1, 1, 1, kD});
  ExpectRejected(request, absl::StatusCode::kInvalidArgument, {"got rank 4"});
}

TEST_F(BadInputTest, LastDimensionIsNotDModel) {
  v1::AttendRequest request;
  *request.mutable_query() = Float32Tensor(RandomValues(4 * 256, 1), {4, 256});
  ExpectRejected(request, absl::StatusCode::kInvalidArgument,
                 {"query.shape[1] must equal d_model=512, got 256"});
}

TEST_F(BadInputTest, ZeroLength) {
  v1::AttendRequest request;
  *request.mutable_query() = Float32Tensor({}, {0, kD});
  ExpectRejected(request, absl::StatusCode::kInvalidArgument,
                 {"query.shape[0] must be >= 1, got 0"});
}

TEST_F(BadInputTest, LongerThanMaxSequenceLength) {
  v1::AttendRequest request;
  *request.mutable_query() = Float32Tensor(std::vector<float>(8193 * kD), {8193, kD});
  ExpectRejected(request, absl::StatusCode::kInvalidArgument,
                 {"sequence length 8193 exceeds max_sequence_length=8192"});
}

TEST_F(BadInputTest, RawByteCountDoesNotMatchShape) {
  v1::AttendRequest request = Request(3, 1);
  request.mutable_query()->mutable_raw()->resize(3 * kD * 4 - 2);
  ExpectRejected(request, absl::StatusCode::kInvalidArgument,
                 {"query.raw must hold product(shape) * 4 = 6144 bytes", "got 6142"});
}

TEST_F(BadInputTest, HeadMaskOfWrongLength) {
  v1::AttendRequest request = Request(3, 1);
  request.add_head_mask(1);
  request.add_head_mask(1);
  ExpectRejected(request, absl::StatusCode::kInvalidArgument,
                 {"head_mask must have num_heads=8 values or none, got 2"});
}

TEST_F(BadInputTest, HeadMaskValueOutOfRange) {
  v1::AttendRequest request = Request(3, 1);
  for (int i = 0; i < kHeads; ++i) request.add_head_mask(i == 3 ? 1.5f : 1.0f);
  ExpectRejected(request, absl::StatusCode::kInvalidArgument,
                 {"head_mask[3] must be in [0, 1], got 1.5"});
}

TEST_F(BadInputTest, CausalWithCrossAttention) {
  v1::AttendRequest request = Request(3, 1);
  *request.mutable_memory() = Float32Tensor(RandomValues(4 * kD, 2), {4, kD});
  request.set_causal(true);
  ExpectRejected(request, absl::StatusCode::kInvalidArgument,
                 {"causal must be false when memory is set"});
}

TEST_F(BadInputTest, MemoryRankDiffersFromQuery) {
  v1::AttendRequest request = Request(3, 1);
  *request.mutable_memory() = Float32Tensor(RandomValues(2 * kD, 2), {1, 2, kD});
  ExpectRejected(request, absl::StatusCode::kInvalidArgument,
                 {"memory.shape must have the query's rank 2, got rank 3"});
}

TEST_F(BadInputTest, MemoryCountDiffersFromQuery) {
  v1::AttendRequest request;
  *request.mutable_query() = Float32Tensor(RandomValues(2 * 3 * kD, 1), {2, 3, kD});
  *request.mutable_memory() = Float32Tensor(RandomValues(3 * 4 * kD, 2), {3, 4, kD});
  ExpectRejected(request, absl::StatusCode::kInvalidArgument,
                 {"memory.shape[0] must equal query.shape[0]=2", "got 3"});
}

TEST_F(BadInputTest, OverlongRequestId) {
  v1::AttendRequest request = Request(2, 1);
  request.set_request_id(std::string(300, 'x'));
  ExpectRejected(request, absl::StatusCode::kInvalidArgument,
                 {"request_id must be at most 256 bytes, got 300"});
}

TEST_F(BadInputTest, AttentionWeightsOverTheLargestMessageAreRefusedBeforeQueueing) {
  // 16 MiB in, but [8, 8192, 8192] float32 weights would be 2 GiB out: wave 1 computed
  // them and then died in protobuf serialization.
  v1::AttendRequest request;
  *request.mutable_query() = Float32Tensor(std::vector<float>(8192 * kD), {8192, kD});
  request.set_return_attention(true);
  const int64_t enqueued = server_->batcher().stats().enqueued;
  ExpectRejected(request, absl::StatusCode::kInvalidArgument,
                 {"the response would be", "attention weights 2147483648",
                  "max_message_bytes=67108864", "without return_attention"});
  EXPECT_EQ(server_->batcher().stats().enqueued, enqueued + 1);  // only the probe
}

TEST_F(BadInputTest, HeadStatisticsOverTheWeightsLimitSayWhatTheyNeed) {
  // Statistics reduce the weights in the server; the refusal must not advise dropping
  // return_attention, which HeadStatistics does not have.
  v1::HeadStatisticsRequest request;
  *request.mutable_query() = Float32Tensor(std::vector<float>(8192 * kD), {8192, kD});
  auto response = server_->client->HeadStatistics(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(),
              HasSubstr("head statistics need the attention weights, 2147483648 bytes"));
  EXPECT_THAT(response.status().message(), HasSubstr("max_message_bytes=67108864"));
  EXPECT_THAT(response.status().message(), Not(HasSubstr("return_attention")));
  EXPECT_TRUE(server_->client->Attend(Request(2, 9)).ok());
}

TEST_F(BadInputTest, ShapeWhoseByteCountOverflowsInt64) {
  v1::AttendRequest request = Request(2, 1);
  request.mutable_query()->clear_shape();
  for (int64_t dimension : {int64_t{1} << 52, int64_t{2}, kD}) {
    request.mutable_query()->add_shape(dimension);
  }
  ExpectRejected(request, absl::StatusCode::kInvalidArgument,
                 {"query.raw must hold product(shape) * 4 = (over 2^63) bytes"});
}

TEST_F(BadInputTest, MessageLargerThanLimitIsResourceExhausted) {
  v1::AttendRequest request;
  // 8192 x 512 float32 = 16 MiB; the test server keeps the 64 MiB default, so send
  // more than that in raw bytes with a shape that would never be reached.
  request.mutable_query()->set_dtype(v1::DATA_TYPE_FP32);
  request.mutable_query()->set_raw(std::string((64 << 20) + 16, '\0'));
  client::AttentionClient::Options options;
  options.target = absl::StrCat("127.0.0.1:", server_->server->port());
  options.max_message_bytes = 128 << 20;  // so that the server, not the client, refuses
  auto big_client = client::AttentionClient::Create(options);
  ASSERT_TRUE(big_client.ok());
  auto response = (*big_client)->Attend(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(server_->client->Attend(Request(2, 9)).ok());
}

TEST(AdmissionTest, RequestNeedingMoreThanTheQueueBudgetAloneIsInvalid) {
  TestServer server = StartServer([](AttentionServer::Options& options) {
    options.models.batching.max_queue_bytes = 1 << 20;
  });
  v1::AttendRequest request;
  // [257, 512] float32: 514 KiB in, 514 KiB out: over 1 MiB together.
  *request.mutable_query() = Float32Tensor(RandomValues(257 * kD, 3), {257, kD});
  auto response = server.client->Attend(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(),
              HasSubstr("needs 1052672 bytes of working memory, over max_queue_bytes="
                        "1048576"));
  EXPECT_EQ(server.batcher().stats().enqueued, 0);
  EXPECT_TRUE(server.client->Attend(Request(16, 1)).ok());
}

TEST(AdmissionTest, MaxSequenceLengthAboveTheCeilingIsRefusedAtStartUp) {
  AttentionServer::Options options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.models.max_sequence_length = kMaxSequenceLengthCeiling + 1;
  auto server = AttentionServer::Create(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("max_sequence_length must be in [1, "
                                                   "1048576], got 1048577"));
}

// NaN and infinities: computed through by default (NaN in, NaN out, as PyTorch, ONNX
// Runtime and Triton do, so that load tools sending random bytes work), refused by name
// with reject_non_finite.
TEST(NonFiniteTest, ComputedThroughByDefaultAndRefusedWhenAsked) {
  std::vector<float> values = RandomValues(3 * kD, 1);
  values[700] = std::nanf("");
  v1::AttendRequest with_nan;
  *with_nan.mutable_query() = Float32Tensor(values, {3, kD});
  v1::AttendRequest with_infinity = Request(3, 1);
  std::vector<float> memory = RandomValues(2 * kD, 2);
  memory[5] = INFINITY;
  *with_infinity.mutable_memory() = Float32Tensor(memory, {2, kD});

  TestServer passing = StartServer();
  auto answered = passing.client->Attend(with_nan);
  ASSERT_TRUE(answered.ok()) << answered.status();
  const std::vector<float> output = *Float32Values(answered->output());
  EXPECT_TRUE(std::any_of(output.begin(), output.end(),
                          [](float value) { return std::isnan(value); }));
  EXPECT_TRUE(passing.client->Attend(with_infinity).ok());

  TestServer refusing = StartServer(
      [](AttentionServer::Options& options) { options.reject_non_finite = true; });
  auto refused = refusing.client->Attend(with_nan);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("query must hold finite values; element 700 is nan"));
  refused = refusing.client->Attend(with_infinity);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("memory must hold finite values; element 5 is inf"));
  // Both keep serving.
  EXPECT_TRUE(refusing.client->Attend(Request(2, 9)).ok());
  EXPECT_TRUE(passing.client->Attend(Request(2, 9)).ok());
}

}  // namespace
}  // namespace attnserve::server
