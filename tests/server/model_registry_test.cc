// Model repositories: a PyTorch-trained module served over the wire, and every way a
// model folder can be wrong.
#include "server/model_registry.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "core/safetensors.h"
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
  const ServedModel* model = (*registry)->Find("big");
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->spec.d_model, 96);
  EXPECT_EQ(model->spec.num_heads, 6);
  (*registry)->Shutdown();
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
