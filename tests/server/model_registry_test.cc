// Model repositories: a PyTorch-trained module served over the wire, and every way a
// model folder can be wrong.
#include "server/models/model_registry.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/attention/multi_head_attention.h"
#include "core/io/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/test_server.h"

namespace attnserve::server {
namespace {

using ::attnserve::client::Float32Tensor;
using ::attnserve::client::Float32Values;
using ::attnserve::server::testing::StartServer;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

std::string NewRepository(const std::string& name) {
  const std::string path = ::testing::TempDir() + "/repository_" + name;
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

void WriteFile(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

absl::Status LoadStatus(const std::string& repository) {
  ModelRegistry::Options options;
  options.model_repository = repository;
  return ModelRegistry::Create(options).status();
}

TEST(ModelRegistryTest, ServesATorchModuleAndMatchesTorchOverTheWire) {
  const std::string repository = NewRepository("torch");
  const std::string data = ATTNSERVE_TEST_DATA_DIR;
  fs::create_directories(repository + "/golden");
  fs::copy_file(data + "/self_d64_h4.weights.safetensors",
                repository + "/golden/weights.safetensors");
  WriteFile(repository + "/golden/config.pbtxt",
            "name: \"golden\"\nd_model: 64\nnum_heads: 4\nmax_sequence_length: 128\n"
            "batching { max_batch_size: 4 max_queue_delay_us: 500 }\n");
  auto server = StartServer([&](AttentionServer::Options& options) {
    options.models.model_repository = repository;
  });
  ASSERT_NE(server.server, nullptr);

  auto io = core::SafetensorsFile::Read(data + "/self_d64_h4.io.safetensors");
  ASSERT_TRUE(io.ok());
  const std::vector<float> query = *io->ReadFloat32("query");
  const std::vector<float> expected = *io->ReadFloat32("output");
  const std::vector<int64_t> shape = io->Find("query")->shape;  // [B, L, 64]
  v1::AttendRequest request;
  request.set_model("golden");
  *request.mutable_query() = Float32Tensor(query, shape);
  auto response = server.client->Attend(request);
  ASSERT_TRUE(response.ok()) << response.status();
  const std::vector<float> output = *Float32Values(response->output());
  ASSERT_EQ(output.size(), expected.size());
  for (size_t i = 0; i < output.size(); ++i) EXPECT_NEAR(output[i], expected[i], 1e-5);

  auto model = server.client->GetModel("golden");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->max_sequence_length(), 128);
  EXPECT_EQ(model->batching().max_batch_size(), 4);
  EXPECT_EQ(model->batching().max_queue_delay_us(), 500);
  // The built-in model is served beside the repository's.
  EXPECT_EQ(server.client->ListModels()->size(), 2u);
}

TEST(ModelRegistryTest, GeneratesWeightsFromASeedWhenAsked) {
  const std::string repository = NewRepository("generated");
  WriteFile(repository + "/big/config.pbtxt",
            "d_model: 96\nnum_heads: 6\ngenerated_weights: true\nseed: 3\n");
  ModelRegistry::Options options;
  options.model_repository = repository;
  auto registry = ModelRegistry::Create(options);
  ASSERT_TRUE(registry.ok()) << registry.status();
  const std::shared_ptr<ServedModel> model = (*registry)->Find("big");
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->spec.d_model, 96);
  EXPECT_EQ(model->spec.num_heads, 6);
  (*registry)->Shutdown();
}

TEST(ModelRegistryTest, PrunedHeadsAnswerLikeAMaskAndCostNoCompute) {
  // Two models with the same seeded weights: "full" serves all 6 heads, "pruned" drops
  // heads 1 and 4 at load. A request masking those heads on "full" must get what
  // "pruned" answers unmasked, and "pruned"'s attention weights for them are zeros.
  const std::string repository = NewRepository("pruned");
  WriteFile(repository + "/full/config.pbtxt",
            "d_model: 96\nnum_heads: 6\ngenerated_weights: true\nseed: 5\n");
  WriteFile(repository + "/pruned/config.pbtxt",
            "d_model: 96\nnum_heads: 6\npruned_heads: [1, 4]\n"
            "generated_weights: true\nseed: 5\n");
  auto server = StartServer([&](AttentionServer::Options& options) {
    options.models.model_repository = repository;
  });
  ASSERT_NE(server.server, nullptr);
  auto info = server.client->GetModel("pruned");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_THAT(info->pruned_heads(), ::testing::ElementsAre(1, 4));

  std::vector<float> query(7 * 96);
  for (size_t i = 0; i < query.size(); ++i) query[i] = 0.01f * static_cast<float>(i % 53);
  v1::AttendRequest masked;
  masked.set_model("full");
  *masked.mutable_query() = Float32Tensor(query, {7, 96});
  for (float factor : {1, 0, 1, 1, 0, 1}) masked.add_head_mask(factor);
  v1::AttendRequest plain;
  plain.set_model("pruned");
  *plain.mutable_query() = Float32Tensor(query, {7, 96});
  plain.set_return_attention(true);
  auto from_mask = server.client->Attend(masked);
  auto from_pruning = server.client->Attend(plain);
  ASSERT_TRUE(from_mask.ok()) << from_mask.status();
  ASSERT_TRUE(from_pruning.ok()) << from_pruning.status();
  const std::vector<float> a = *Float32Values(from_mask->output());
  const std::vector<float> b = *Float32Values(from_pruning->output());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << i;
  const std::vector<float> weights = *Float32Values(from_pruning->attention());
  ASSERT_EQ(weights.size(), 6u * 7 * 7);
  for (int64_t head = 0; head < 6; ++head) {
    float sum = 0;
    for (int64_t j = 0; j < 7 * 7; ++j) sum += weights[head * 49 + j];
    EXPECT_NEAR(sum, (head == 1 || head == 4) ? 0.0f : 7.0f, 1e-4) << "head " << head;
  }
}

// Serves a model of `precision` beside its fp32 twin (the same generated weights) from a
// real server, checks GetModel reports the precision, and returns the largest difference
// between their answers to the same query, each difference checked against `tolerance`.
double TwinDifference(const std::string& name, v1::Precision precision,
                      double tolerance) {
  const std::string repository = NewRepository(name);
  WriteFile(repository + "/fp32/config.pbtxt",
            "d_model: 128\nnum_heads: 4\ngenerated_weights: true\nseed: 9\n");
  WriteFile(repository + "/" + name + "/config.pbtxt",
            absl::StrCat(
                "d_model: 128\nnum_heads: 4\nprecision: ", v1::Precision_Name(precision),
                "\ngenerated_weights: true\nseed: 9\n"));
  auto server = StartServer([&](AttentionServer::Options& options) {
    options.models.model_repository = repository;
  });
  EXPECT_NE(server.server, nullptr);
  if (server.server == nullptr) return -1.0;
  auto info = server.client->GetModel(name);
  EXPECT_TRUE(info.ok()) << info.status();
  if (info.ok()) {
    EXPECT_EQ(info->precision(), precision);
    // Only f32 projections have a timed choice: int8 runs its own primitive.
    if (precision == v1::PRECISION_INT8) {
      EXPECT_EQ(info->projection_choices_size(), 0);
    }
  }
  // The fp32 twin reports what the warm-up timed for its 128 x 128 matrices.
  auto twin = server.client->GetModel("fp32");
  EXPECT_TRUE(twin.ok()) << twin.status();
  if (twin.ok()) {
    EXPECT_EQ(twin->projection_choices_size(), 1);
    for (const v1::ProjectionChoice& choice : twin->projection_choices()) {
      EXPECT_EQ(choice.in_features(), 128);
      EXPECT_EQ(choice.out_features(), 128);
      EXPECT_THAT(choice.primitive(), ::testing::AnyOf("per_shape", "runtime_rows"));
      EXPECT_EQ(choice.timed_rows(), 128);
      EXPECT_GT(choice.per_shape_ms(), 0);
      EXPECT_GT(choice.runtime_rows_ms(), 0);
    }
    // And the attention kernel timed at load for its head size (128 / 4 = 32).
    EXPECT_THAT(twin->attention_kernel().kernel(), ::testing::AnyOf("flash", "blocks"));
    EXPECT_THAT(twin->attention_kernel().flash_tiles(),
                ::testing::AnyOf("64x256", "128x512", "256x1024"));
    EXPECT_EQ(twin->attention_kernel().timed_length(), 2048);
    EXPECT_GT(twin->attention_kernel().blocks_ms(), 0);
    EXPECT_GT(twin->attention_kernel().flash_ms(), 0);
  }

  std::vector<float> query(20 * 128);
  for (size_t i = 0; i < query.size(); ++i) {
    query[i] = 0.05f * static_cast<float>(static_cast<int>(i % 41) - 20);
  }
  v1::AttendRequest request;
  *request.mutable_query() = Float32Tensor(query, {20, 128});
  request.set_model("fp32");
  auto expected = server.client->Attend(request);
  request.set_model(name);
  auto got = server.client->Attend(request);
  EXPECT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(got.ok()) << got.status();
  if (!expected.ok() || !got.ok()) return -1.0;
  const std::vector<float> a = *Float32Values(expected->output());
  const std::vector<float> b = *Float32Values(got->output());
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_NEAR(a[i], b[i], tolerance) << i;
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return worst;
}

TEST(ModelRegistryTest, Bf16ModelAnswersWithinBf16ToleranceOfItsFp32Twin) {
  // The core's bf16 bound against fp64 (5e-3) covers the fp32 twin's 1e-5 too.
  TwinDifference("bf16", v1::PRECISION_BF16, 5e-3);
}

TEST(ModelRegistryTest, Int8ModelAnswersWithinQuantizationErrorOfItsFp32Twin) {
  // The core's int8 bound against fp64 (2e-2, multi_head_attention_test), and not the
  // fp32 answer itself.
  EXPECT_GT(TwinDifference("int8", v1::PRECISION_INT8, 2e-2), 0.0);
}

TEST(ModelRegistryTest, UnknownPrecisionStopsStartUpNamingTheField) {
  const std::string repository = NewRepository("bad_precision");
  WriteFile(repository + "/m/config.pbtxt",
            "d_model: 64\nnum_heads: 4\nprecision: 7\ngenerated_weights: true\n");
  const absl::Status status = LoadStatus(repository);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(repository + "/m/config.pbtxt"));
  EXPECT_THAT(status.message(), HasSubstr("precision must be PRECISION_FP32, "
                                          "PRECISION_BF16 or PRECISION_INT8, got 7"));
}

TEST(ModelRegistryTest, BadPrunedHeadsStopStartUpNamingTheField) {
  const std::string repository = NewRepository("bad_pruned");
  WriteFile(repository + "/m/config.pbtxt",
            "d_model: 64\nnum_heads: 4\npruned_heads: [2, 4]\ngenerated_weights: true\n");
  const absl::Status status = LoadStatus(repository);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(repository + "/m/config.pbtxt"));
  EXPECT_THAT(status.message(), HasSubstr("pruned_heads[1] must be in [0, 4), got 4"));
}

absl::StatusOr<std::unique_ptr<ModelRegistry>> Registry(
    const std::string& repository, bool builtin_model, const std::string& default_model) {
  ModelRegistry::Options options;
  options.model_repository = repository;
  options.builtin_model = builtin_model;
  options.default_model = default_model;
  return ModelRegistry::Create(options);
}

TEST(ModelRegistryTest, BuiltinModelCanBeTurnedOffAndTheOnlyModelIsTheDefault) {
  const std::string repository = NewRepository("only");
  WriteFile(repository + "/enc/config.pbtxt",
            "d_model: 64\nnum_heads: 4\ngenerated_weights: true\n");
  auto registry = Registry(repository, /*builtin_model=*/false, "");
  ASSERT_TRUE(registry.ok()) << registry.status();
  ASSERT_EQ((*registry)->models().size(), 1u);
  EXPECT_EQ((*registry)->default_model(), "enc");
  ASSERT_NE((*registry)->Find(""), nullptr);
  EXPECT_EQ((*registry)->Find("")->name, "enc");
  EXPECT_EQ((*registry)->Find(kDefaultModelName), nullptr);
  (*registry)->Shutdown();
}

TEST(ModelRegistryTest, ARepositoryOfOneModelIsTheDefaultBesideTheBuiltinModel) {
  const std::string repository = NewRepository("one_beside_builtin");
  WriteFile(repository + "/enc/config.pbtxt",
            "d_model: 64\nnum_heads: 4\ngenerated_weights: true\n");
  auto registry = Registry(repository, /*builtin_model=*/true, "");
  ASSERT_TRUE(registry.ok()) << registry.status();
  ASSERT_EQ((*registry)->models().size(), 2u);
  EXPECT_EQ((*registry)->default_model(), "enc");
  EXPECT_NE((*registry)->Find(kDefaultModelName), nullptr);
  (*registry)->Shutdown();
  // Two repository models: the built-in one stays the default.
  WriteFile(repository + "/dec/config.pbtxt",
            "d_model: 64\nnum_heads: 4\ngenerated_weights: true\n");
  auto two = Registry(repository, /*builtin_model=*/true, "");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ((*two)->default_model(), kDefaultModelName);
  (*two)->Shutdown();
}

TEST(ModelRegistryTest, DefaultModelIsChosenByName) {
  const std::string repository = NewRepository("two");
  for (const char* name : {"a", "b"}) {
    WriteFile(repository + "/" + name + "/config.pbtxt",
              "d_model: 32\nnum_heads: 2\ngenerated_weights: true\n");
  }
  auto registry = Registry(repository, /*builtin_model=*/true, "b");
  ASSERT_TRUE(registry.ok()) << registry.status();
  EXPECT_EQ((*registry)->Find("")->name, "b");
  (*registry)->Shutdown();

  const absl::Status unknown = Registry(repository, true, "c").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(),
              HasSubstr("default_model \"c\" is not served; models: a, b, mha-base"));
  const absl::Status none = Registry("", /*builtin_model=*/false, "").status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.message(),
              HasSubstr("--builtin_model=false needs a --model_repository"));
}

TEST(ModelRegistryTest, WithoutADefaultARequestMustNameItsModel) {
  const std::string repository = NewRepository("no_default");
  for (const char* name : {"a", "b"}) {
    WriteFile(repository + "/" + name + "/config.pbtxt",
              "d_model: 32\nnum_heads: 2\ngenerated_weights: true\n");
  }
  auto server = StartServer([&](AttentionServer::Options& options) {
    options.models.model_repository = repository;
    options.models.builtin_model = false;
  });
  ASSERT_NE(server.server, nullptr);
  v1::AttendRequest request;
  *request.mutable_query() = Float32Tensor(std::vector<float>(3 * 32, 0.5f), {3, 32});
  auto response = server.client->Attend(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(response.status().message(),
              HasSubstr("model must be set: this server has no default model (served: a "
                        "(version 1), b (version 1))"));
  // A request that does not fit its model says which model it was checked against.
  request.set_model("b");
  *request.mutable_query() = Float32Tensor(std::vector<float>(3 * 48, 0.5f), {3, 48});
  response = server.client->Attend(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(), HasSubstr("(model \"b\")"));
  request.set_model("a");
  *request.mutable_query() = Float32Tensor(std::vector<float>(3 * 32, 0.5f), {3, 32});
  EXPECT_TRUE(server.client->Attend(request).ok());
}

TEST(ModelRegistryTest, MalformedConfigNamesFileAndLine) {
  const std::string repository = NewRepository("malformed");
  WriteFile(repository + "/m/config.pbtxt", "d_model: 64\nnum_heads: four\n");
  const absl::Status status = LoadStatus(repository);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(repository + "/m/config.pbtxt"));
  EXPECT_THAT(status.message(), HasSubstr("line 2"));
}

TEST(ModelRegistryTest, MissingConfigIsNotFound) {
  const std::string repository = NewRepository("no_config");
  fs::create_directories(repository + "/m");
  const absl::Status status = LoadStatus(repository);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("config.pbtxt"));
}

TEST(ModelRegistryTest, MissingWeightsIsNotFound) {
  const std::string repository = NewRepository("no_weights");
  WriteFile(repository + "/m/config.pbtxt", "d_model: 64\nnum_heads: 4\n");
  const absl::Status status = LoadStatus(repository);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(repository + "/m/weights.safetensors"));
}

TEST(ModelRegistryTest, WeightsNotMatchingConfigNameTheTensor) {
  const std::string repository = NewRepository("mismatch");
  fs::create_directories(repository + "/m");
  fs::copy_file(std::string(ATTNSERVE_TEST_DATA_DIR) + "/self_d64_h4.weights.safetensors",
                repository + "/m/weights.safetensors");
  WriteFile(repository + "/m/config.pbtxt", "d_model: 32\nnum_heads: 4\n");
  const absl::Status status = LoadStatus(repository);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("in_proj_weight"));
  EXPECT_THAT(status.message(), HasSubstr("expected [96, 32], found [192, 64]"));
}

TEST(ModelRegistryTest, ConfigNameMustMatchFolder) {
  const std::string repository = NewRepository("name");
  WriteFile(repository + "/m/config.pbtxt",
            "name: \"other\"\nd_model: 64\nnum_heads: 4\n");
  const absl::Status status = LoadStatus(repository);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("must equal the folder name \"m\""));
}

TEST(ModelRegistryTest, MissingRepositoryIsNotFound) {
  const absl::Status status = LoadStatus("/nonexistent/models");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("/nonexistent/models"));
}

}  // namespace
}  // namespace attnserve::server
