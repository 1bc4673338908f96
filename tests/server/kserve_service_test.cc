// inference.GRPCInferenceService (KServe v2 / Open Inference Protocol) over a real gRPC
// server on loopback, called with stubs generated from proto/inference: the same
// answers as attnserve's own Attend, and errors naming the protocol's fields.
#include "server/frontends/kserve_service.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/base/bfloat16.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/server/test_server.h"

namespace attnserve::server {
namespace {

using ::attnserve::client::Float32Tensor;
using ::attnserve::client::Float32Values;
using ::attnserve::server::testing::RandomValues;
using ::attnserve::server::testing::StartServer;
using ::attnserve::server::testing::TestServer;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kD = 512;

std::string FloatBytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4);
}

std::vector<float> BytesToFloats(const std::string& bytes) {
  std::vector<float> values(bytes.size() / 4);
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

class KServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new TestServer(StartServer());
    channel_ = new std::shared_ptr<grpc::Channel>(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->server->port()),
                            grpc::InsecureChannelCredentials()));
  }
  static void TearDownTestSuite() {
    delete channel_;
    delete server_;
  }

  std::unique_ptr<inference::GRPCInferenceService::Stub> Stub() {
    return inference::GRPCInferenceService::NewStub(*channel_);
  }

  // `query` [L, 512] fp32 through ModelInfer as raw contents.
  inference::ModelInferRequest Infer(const std::vector<float>& query, int64_t length) {
    inference::ModelInferRequest request;
    request.set_model_name("mha-base");
    request.set_id("kserve-1");
    auto* input = request.add_inputs();
    input->set_name("query");
    input->set_datatype("FP32");
    input->add_shape(length);
    input->add_shape(kD);
    request.add_raw_input_contents(FloatBytes(query));
    return request;
  }

  grpc::Status Call(const inference::ModelInferRequest& request,
                    inference::ModelInferResponse* response) {
    grpc::ClientContext context;
    return Stub()->ModelInfer(&context, request, response);
  }

  static TestServer* server_;
  static std::shared_ptr<grpc::Channel>* channel_;
};
TestServer* KServeTest::server_ = nullptr;
std::shared_ptr<grpc::Channel>* KServeTest::channel_ = nullptr;

TEST_F(KServeTest, HealthAndMetadata) {
  auto stub = Stub();
  {
    grpc::ClientContext context;
    inference::ServerLiveResponse live;
    ASSERT_TRUE(stub->ServerLive(&context, {}, &live).ok());
    EXPECT_TRUE(live.live());
  }
  {
    grpc::ClientContext context;
    inference::ServerReadyResponse ready;
    ASSERT_TRUE(stub->ServerReady(&context, {}, &ready).ok());
    EXPECT_TRUE(ready.ready());
  }
  for (const auto& [name, version, expected] :
       std::vector<std::tuple<std::string, std::string, bool>>{{"mha-base", "", true},
                                                               {"mha-base", "1", true},
                                                               {"mha-base", "2", false},
                                                               {"nope", "", false}}) {
    grpc::ClientContext context;
    inference::ModelReadyRequest request;
    request.set_name(name);
    request.set_version(version);
    inference::ModelReadyResponse ready;
    ASSERT_TRUE(stub->ModelReady(&context, request, &ready).ok());
    EXPECT_EQ(ready.ready(), expected) << name << " " << version;
  }
  {
    grpc::ClientContext context;
    inference::ServerMetadataResponse metadata;
    ASSERT_TRUE(stub->ServerMetadata(&context, {}, &metadata).ok());
    EXPECT_EQ(metadata.name(), "attnserve");
    EXPECT_EQ(metadata.version(), kServerVersion);
  }
  {
    grpc::ClientContext context;
    inference::ModelMetadataRequest request;
    request.set_name("mha-base");
    inference::ModelMetadataResponse metadata;
    ASSERT_TRUE(stub->ModelMetadata(&context, request, &metadata).ok());
    EXPECT_THAT(metadata.versions(), ElementsAre("1"));
    ASSERT_EQ(metadata.inputs_size(), 2);
    EXPECT_EQ(metadata.inputs(0).name(), "query");
    EXPECT_THAT(metadata.inputs(0).shape(), ElementsAre(-1, kD));
    EXPECT_EQ(metadata.outputs(1).name(), "attention");
    EXPECT_THAT(metadata.outputs(1).shape(), ElementsAre(8, -1, -1));
  }
  {
    grpc::ClientContext context;
    inference::ModelMetadataRequest request;
    request.set_name("nope");
    inference::ModelMetadataResponse metadata;
    EXPECT_EQ(stub->ModelMetadata(&context, request, &metadata).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
}

TEST_F(KServeTest, InferEqualsAttendRawTypedAndWithWeights) {
  const std::vector<float> query = RandomValues(9 * kD, 41);
  v1::AttendRequest attend;
  attend.set_model("mha-base");
  *attend.mutable_query() = Float32Tensor(query, {9, kD});
  attend.set_causal(true);
  attend.set_return_attention(true);
  auto expected = server_->client->Attend(attend);
  ASSERT_TRUE(expected.ok()) << expected.status();

  inference::ModelInferRequest raw = Infer(query, 9);
  (*raw.mutable_parameters())["causal"].set_bool_param(true);
  raw.add_outputs()->set_name("output");
  raw.add_outputs()->set_name("attention");  // asks for the weights
  inference::ModelInferResponse response;
  ASSERT_TRUE(Call(raw, &response).ok());
  EXPECT_EQ(response.model_name(), "mha-base");
  EXPECT_EQ(response.model_version(), "1");
  EXPECT_EQ(response.id(), "kserve-1");
  ASSERT_EQ(response.outputs_size(), 2);
  ASSERT_EQ(response.raw_output_contents_size(), 2);
  EXPECT_EQ(response.outputs(0).name(), "output");
  EXPECT_EQ(response.outputs(0).datatype(), "FP32");
  EXPECT_THAT(response.outputs(0).shape(), ElementsAre(9, kD));
  EXPECT_EQ(BytesToFloats(response.raw_output_contents(0)),
            *Float32Values(expected->output()));
  EXPECT_THAT(response.outputs(1).shape(), ElementsAre(8, 9, 9));
  EXPECT_EQ(BytesToFloats(response.raw_output_contents(1)),
            *Float32Values(expected->attention()));

  // Typed contents give the same answer; only "output" comes back when only it is asked.
  inference::ModelInferRequest typed = Infer(query, 9);
  typed.clear_raw_input_contents();
  typed.mutable_inputs(0)->mutable_contents()->mutable_fp32_contents()->Add(query.begin(),
                                                                            query.end());
  (*typed.mutable_parameters())["causal"].set_bool_param(true);
  typed.add_outputs()->set_name("output");
  inference::ModelInferResponse typed_response;
  ASSERT_TRUE(Call(typed, &typed_response).ok());
  ASSERT_EQ(typed_response.outputs_size(), 1);
  EXPECT_EQ(typed_response.raw_output_contents(0), response.raw_output_contents(0));
}

TEST_F(KServeTest, Bf16InBf16OutAndHeadMask) {
  const std::vector<float> values = RandomValues(5 * kD, 42);
  std::string bits;
  std::vector<float> rounded;
  for (float value : values) {
    const uint16_t b = core::FloatToBf16(value);
    bits.append(reinterpret_cast<const char*>(&b), 2);
    rounded.push_back(core::Bf16ToFloat(b));
  }
  inference::ModelInferRequest request = Infer({}, 5);
  request.mutable_inputs(0)->set_datatype("BF16");
  request.set_raw_input_contents(0, bits);
  (*request.mutable_parameters())["head_mask"].set_string_param("1,1,0,1,1,0.5,1,1");
  inference::ModelInferResponse response;
  ASSERT_TRUE(Call(request, &response).ok());
  EXPECT_EQ(response.outputs(0).datatype(), "BF16");
  ASSERT_EQ(response.raw_output_contents(0).size(), 5u * kD * 2);

  v1::AttendRequest attend;
  *attend.mutable_query() = Float32Tensor(rounded, {5, kD});
  for (float factor : {1.f, 1.f, 0.f, 1.f, 1.f, 0.5f, 1.f, 1.f})
    attend.add_head_mask(factor);
  auto expected = server_->client->Attend(attend);
  ASSERT_TRUE(expected.ok());
  const std::vector<float> want = *Float32Values(expected->output());
  for (size_t i = 0; i < want.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, response.raw_output_contents(0).data() + 2 * i, 2);
    EXPECT_NEAR(core::Bf16ToFloat(b), want[i], std::abs(want[i]) / 256 + 1e-6);
  }
}

TEST_F(KServeTest, BadRequestsNameTheProtocolField) {
  const std::vector<float> query = RandomValues(2 * kD, 43);
  struct Case {
    std::function<void(inference::ModelInferRequest&)> change;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r.mutable_inputs(0)->set_name("x"); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "inputs[0].name must be \"query\" or \"memory\""},
      {[](auto& r) { r.mutable_inputs(0)->set_datatype("INT8"); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "inputs[0] (\"query\").datatype must be FP32 or BF16"},
      {[](auto& r) { r.add_raw_input_contents("extra"); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "raw_input_contents must have one entry per input (1), got 2"},
      {[](auto& r) { (*r.mutable_parameters())["priority"].set_int64_param(1); },
       grpc::StatusCode::INVALID_ARGUMENT, "parameters[\"priority\"] is not a parameter"},
      {[](auto& r) { (*r.mutable_parameters())["causal"].set_string_param("yes"); },
       grpc::StatusCode::INVALID_ARGUMENT, "parameters[\"causal\"] must be a bool_param"},
      {[](auto& r) { r.add_outputs()->set_name("logits"); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "outputs[0].name must be \"output\" or \"attention\""},
      {[](auto& r) { r.set_model_version("7"); }, grpc::StatusCode::NOT_FOUND,
       "version \"7\" is not served (served: mha-base (version 1))"},
      {[](auto& r) { (*r.mutable_parameters())["timeout"].set_string_param("1s"); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "parameters[\"timeout\"] must be an int64_param of microseconds >= 0"},
      {[](auto& r) { (*r.mutable_parameters())["timeout"].set_int64_param(-1); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "parameters[\"timeout\"] must be an int64_param of microseconds >= 0"},
      {[](auto& r) { r.mutable_inputs(0)->set_shape(1, 100); },
       grpc::StatusCode::INVALID_ARGUMENT, "query.shape"},
  };
  for (const Case& c : cases) {
    inference::ModelInferRequest request = Infer(query, 2);
    c.change(request);
    inference::ModelInferResponse response;
    const grpc::Status status = Call(request, &response);
    EXPECT_EQ(status.error_code(), c.code) << c.message;
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
  }
  inference::ModelInferResponse response;
  EXPECT_TRUE(Call(Infer(query, 2), &response).ok());  // still serving
}

// The repository extension over gRPC: load and unload under explicit control, each
// mistake refused naming its field, and refused outright when models are fixed.
TEST(KServeRepositoryTest, LoadAndUnloadOverGrpcNameTheirMistakes) {
  const std::string repository = ::testing::TempDir() + "/kserve_repository";
  std::filesystem::remove_all(repository);
  std::filesystem::create_directories(repository + "/m");
  std::ofstream(repository + "/m/config.pbtxt")
      << "d_model: 32\nnum_heads: 2\ngenerated_weights: true\n";
  auto server = StartServer([&](AttentionServer::Options& options) {
    options.models.model_repository = repository;
    options.models.control_mode = ModelControlMode::kExplicit;
  });
  ASSERT_NE(server.server, nullptr);
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", server.server->port()),
                          grpc::InsecureChannelCredentials()));
  const auto load = [&](const inference::RepositoryModelLoadRequest& request) {
    grpc::ClientContext context;
    inference::RepositoryModelLoadResponse response;
    return stub->RepositoryModelLoad(&context, request, &response);
  };
  const auto unload = [&](const inference::RepositoryModelUnloadRequest& request) {
    grpc::ClientContext context;
    inference::RepositoryModelUnloadResponse response;
    return stub->RepositoryModelUnload(&context, request, &response);
  };
  inference::RepositoryModelLoadRequest good;
  good.set_model_name("m");
  (*good.mutable_parameters())["config"].set_string_param(
      R"({"d_model": 64, "num_heads": 4, "generated_weights": true})");
  EXPECT_TRUE(load(good).ok());
  EXPECT_EQ(server.client->GetModel("m")->d_model(), 64);

  struct Case {
    inference::RepositoryModelLoadRequest request;
    grpc::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases(5);
  cases[0].request.set_model_name("m");
  (*cases[0].request.mutable_parameters())["config"].set_int64_param(3);
  cases[0] = {cases[0].request, grpc::StatusCode::INVALID_ARGUMENT,
              "parameters[\"config\"] must be a string_param"};
  cases[1].request.set_model_name("m");
  (*cases[1].request.mutable_parameters())["file:1/weights"].set_bytes_param("x");
  cases[1] = {cases[1].request, grpc::StatusCode::INVALID_ARGUMENT,
              "unknown parameter \"file:1/weights\""};
  cases[2].request.set_model_name("m");
  (*cases[2].request.mutable_parameters())["config"].set_string_param("{");
  cases[2] = {cases[2].request, grpc::StatusCode::INVALID_ARGUMENT,
              "config is not a ModelConfig in JSON"};
  cases[3].request.set_model_name("../m");
  cases[3] = {cases[3].request, grpc::StatusCode::INVALID_ARGUMENT, "must name a folder"};
  cases[4].request.set_model_name("absent");
  cases[4] = {cases[4].request, grpc::StatusCode::NOT_FOUND, "has no folder"};
  for (const Case& c : cases) {
    const grpc::Status status = load(c.request);
    EXPECT_EQ(status.error_code(), c.code) << c.message;
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
  }
  // The model loaded first still serves.
  EXPECT_EQ(server.client->GetModel("m")->d_model(), 64);

  inference::RepositoryModelUnloadRequest bad_unload;
  bad_unload.set_model_name("m");
  (*bad_unload.mutable_parameters())["config"].set_string_param("{}");
  const grpc::Status refused = unload(bad_unload);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("unload takes: unload_dependents"));
  inference::RepositoryModelUnloadRequest good_unload;
  good_unload.set_model_name("m");
  (*good_unload.mutable_parameters())["unload_dependents"].set_bool_param(false);
  EXPECT_TRUE(unload(good_unload).ok());
  EXPECT_EQ(unload(good_unload).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(server.client->GetModel("m").status().code(), absl::StatusCode::kNotFound);
}

// Per-model grpc.health.v1 status (what Kubernetes probes and health-checking gRPC
// clients read) follows the registry: a model loaded at runtime turns SERVING, a
// replaced one stays SERVING, an unloaded one turns NOT_SERVING; ModelReady agrees.
TEST(ServerHealthTest, PerModelHealthFollowsLoadReplaceAndUnload) {
  const std::string repository = ::testing::TempDir() + "/health_repository";
  std::filesystem::remove_all(repository);
  std::filesystem::create_directories(repository + "/m");
  std::ofstream(repository + "/m/config.pbtxt")
      << "d_model: 32\nnum_heads: 2\ngenerated_weights: true\n";
  auto server = StartServer([&](AttentionServer::Options& options) {
    options.models.model_repository = repository;
    options.models.control_mode = ModelControlMode::kExplicit;
    options.models.builtin_model = false;
    options.models.warm_up = false;
  });
  ASSERT_NE(server.server, nullptr);
  const auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", server.server->port()),
                          grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  auto kserve = inference::GRPCInferenceService::NewStub(channel);
  using Serving = grpc::health::v1::HealthCheckResponse;
  // The model's health status, or -1 when the service answers NOT_FOUND.
  const auto status_of = [&](const std::string& model) {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(model);
    Serving response;
    const grpc::Status status = health->Check(&context, request, &response);
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) return -1;
    EXPECT_TRUE(status.ok()) << status.error_message();
    return static_cast<int>(response.status());
  };
  const auto ready = [&](const std::string& model) {
    grpc::ClientContext context;
    inference::ModelReadyRequest request;
    request.set_name(model);
    inference::ModelReadyResponse response;
    EXPECT_TRUE(kserve->ModelReady(&context, request, &response).ok());
    return response.ready();
  };
  const auto load = [&](const std::string& model, const std::string& config) {
    grpc::ClientContext context;
    inference::RepositoryModelLoadRequest request;
    request.set_model_name(model);
    if (!config.empty())
      (*request.mutable_parameters())["config"].set_string_param(config);
    inference::RepositoryModelLoadResponse response;
    return kserve->RepositoryModelLoad(&context, request, &response);
  };
  const auto unload = [&](const std::string& model) {
    grpc::ClientContext context;
    inference::RepositoryModelUnloadRequest request;
    request.set_model_name(model);
    inference::RepositoryModelUnloadResponse response;
    return kserve->RepositoryModelUnload(&context, request, &response);
  };
  // The repository's model at start; a folder added later is not known yet.
  EXPECT_EQ(status_of("m"), Serving::SERVING);
  EXPECT_EQ(status_of("n"), -1);
  EXPECT_FALSE(ready("n"));

  std::filesystem::create_directories(repository + "/n");
  std::ofstream(repository + "/n/config.pbtxt")
      << "d_model: 32\nnum_heads: 2\ngenerated_weights: true\n";
  ASSERT_TRUE(load("n", "").ok());
  EXPECT_EQ(status_of("n"), Serving::SERVING);
  EXPECT_TRUE(ready("n"));

  // Replaced by a new configuration: still serving, now the new one.
  ASSERT_TRUE(
      load("n", R"({"d_model": 64, "num_heads": 4, "generated_weights": true})").ok());
  EXPECT_EQ(server.client->GetModel("n")->d_model(), 64);
  EXPECT_EQ(status_of("n"), Serving::SERVING);

  ASSERT_TRUE(unload("n").ok());
  EXPECT_EQ(status_of("n"), Serving::NOT_SERVING);
  EXPECT_FALSE(ready("n"));
  ASSERT_TRUE(unload("m").ok());
  EXPECT_EQ(status_of("m"), Serving::NOT_SERVING);
  EXPECT_FALSE(ready("m"));

  ASSERT_TRUE(load("m", "").ok());
  EXPECT_EQ(status_of("m"), Serving::SERVING);
  EXPECT_TRUE(ready("m"));
}

TEST_F(KServeTest, LoadAndUnloadAreRefusedWhenModelsAreFixed) {
  inference::RepositoryModelLoadRequest request;
  request.set_model_name("mha-base");
  grpc::ClientContext context;
  inference::RepositoryModelLoadResponse response;
  const grpc::Status status = Stub()->RepositoryModelLoad(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("--model_control_mode=explicit"));
}

}  // namespace
}  // namespace attnserve::server
