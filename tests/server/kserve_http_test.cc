// KServeHttp on 127.0.0.1:0 over a real model registry and RequestPipeline, called
// with civetweb's HTTP client and raw sockets: what the door does at its edges (an
// exception at the C boundary, a client that hangs up, a request's timeout). The
// malformed-body matrix is tests/e2e/http_malformed_test.py.
#include "server/frontends/kserve_http.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/frontends/embeddings_api.h"
#include "server/models/model_registry.h"
#include "server/observability/server_metrics.h"
#include "server/pipeline/request_pipeline.h"

namespace attnserve::server {
namespace {

using ::testing::HasSubstr;

struct Reply {
  int status = 0;
  std::string body;
};

class KServeHttpTest : public ::testing::Test {
 protected:
  // A model whose lone request waits an hour for company: it stays queued until it is
  // cancelled or its deadline passes.
  void Start(absl::Duration queue_delay) {
    ModelRegistry::Options models;
    models.warm_up = false;
    models.intra_op_threads = 1;
    models.batching.max_queue_delay = queue_delay;
    auto registry = ModelRegistry::Create(models);
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = *std::move(registry);
    ServiceObserver observer;
    observer.on_internal_error = [this](absl::string_view) { ++internal_errors_; };
    observer.on_request_finished = [this](const std::string&, const absl::Status& status,
                                          absl::Duration, int64_t) {
      last_code_ = status.code();
      if (!finished_.HasBeenNotified()) finished_.Notify();
    };
    pipeline_ = std::make_unique<RequestPipeline>(registry_.get(),
                                                  RequestPipeline::Options(), observer);
    KServeHttp::Options options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.threads = 4;
    options.on_request = [](absl::string_view uri) {
      if (uri == "/v2/throw/std") throw std::runtime_error("injected fault");
      if (uri == "/v2/throw/other") throw 7;
    };
    auto http = KServeHttp::Start(options, pipeline_.get(), &metrics_);
    ASSERT_TRUE(http.ok()) << http.status();
    http_ = *std::move(http);
  }

  void TearDown() override {
    if (http_ != nullptr) http_->Stop();
    if (registry_ != nullptr) registry_->Shutdown();
  }

  Reply Request(const std::string& method, const std::string& path,
                const std::string& body = "") {
    char error[256] = {};
    mg_connection* connection =
        mg_download("127.0.0.1", http_->port(), 0, error, sizeof(error),
                    "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %zu\r\n\r\n%s",
                    method.c_str(), path.c_str(), body.size(), body.c_str());
    Reply reply;
    if (connection == nullptr) {
      ADD_FAILURE() << "no connection: " << error;
      return reply;
    }
    reply.status = mg_get_response_info(connection)->status_code;
    char chunk[4096];
    int read = 0;
    while ((read = mg_read(connection, chunk, sizeof(chunk))) > 0) {
      reply.body.append(chunk, static_cast<size_t>(read));
    }
    mg_close_connection(connection);
    return reply;
  }

  static std::string InferBody(const std::string& parameters = "{}") {
    std::string data;
    for (int i = 0; i < 512; ++i) absl::StrAppend(&data, i == 0 ? "" : ",", "0.25");
    return absl::StrCat(R"({"parameters":)", parameters, R"(,"inputs":[{"name":"query",)",
                        R"("shape":[1,512],"datatype":"FP32","data":[)", data, "]}]}");
  }

  ServerMetrics metrics_;
  std::unique_ptr<ModelRegistry> registry_;
  std::unique_ptr<RequestPipeline> pipeline_;
  std::unique_ptr<KServeHttp> http_;
  std::atomic<int> internal_errors_{0};
  std::atomic<absl::StatusCode> last_code_{absl::StatusCode::kOk};
  absl::Notification finished_;
};

TEST_F(KServeHttpTest, AnExceptionAtTheBoundaryIsA500AndTheServerKeepsServing) {
  Start(absl::Milliseconds(1));
  const Reply thrown = Request("GET", "/v2/throw/std");
  EXPECT_EQ(thrown.status, 500);
  EXPECT_THAT(thrown.body, HasSubstr("internal error: injected fault"));
  const Reply other = Request("GET", "/v2/throw/other");
  EXPECT_EQ(other.status, 500);
  EXPECT_THAT(other.body, HasSubstr("unknown exception"));
  EXPECT_EQ(internal_errors_.load(), 2);
  EXPECT_EQ(Request("GET", "/v2/health/live").status, 200);
  const Reply answered = Request("POST", "/v2/models/mha-base/infer", InferBody());
  EXPECT_EQ(answered.status, 200) << answered.body;
}

TEST_F(KServeHttpTest, AClientThatHangsUpCancelsItsQueuedRequest) {
  Start(absl::Hours(1));
  const std::string body = InferBody();
  const int socket = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(socket, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(http_->port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(socket, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const std::string request =
      absl::StrCat("POST /v2/models/mha-base/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                   "Content-Length: ", body.size(), "\r\n\r\n", body);
  ASSERT_EQ(send(socket, request.data(), request.size(), 0),
            static_cast<ssize_t>(request.size()));
  // Queued (it waits an hour for company), then the client goes away.
  const AttentionBatcher& batcher = *registry_->Find("mha-base")->attention_batcher;
  for (int i = 0; i < 6000 && batcher.queue_depth() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(batcher.queue_depth(), 1);
  close(socket);
  ASSERT_TRUE(finished_.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(last_code_.load(), absl::StatusCode::kCancelled);
}

TEST_F(KServeHttpTest, TheTimeoutParameterEndsAQueuedRequestWith504) {
  Start(absl::Hours(1));
  const Reply reply =
      Request("POST", "/v2/models/mha-base/infer", InferBody(R"({"timeout": 200000})"));
  EXPECT_EQ(reply.status, 504) << reply.body;
  EXPECT_EQ(last_code_.load(), absl::StatusCode::kDeadlineExceeded);
}

// Cohere's /v2/embed body and its embedding types.
TEST(CohereEmbedTest, ParsesTheBodyCohereSendsAndRefusesTheRestNamingIt) {
  using Type = EmbeddingsCall::EmbeddingType;
  absl::StatusOr<EmbeddingsCall> call = ParseCohereEmbed(
      R"({"model": "m", "texts": ["a", "b"], "input_type": "search_query",
          "embedding_types": ["int8", "float", "int8", "ubinary"], "truncate": "NONE",
          "output_dimension": 256, "max_tokens": 512, "priority": 0, "images": null})");
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->encode.model(), "m");
  EXPECT_EQ(call->encode.text_size(), 2);
  EXPECT_FALSE(call->encode.truncate());
  EXPECT_EQ(call->encode.dimensions(), 256);
  EXPECT_EQ(call->max_tokens_per_doc, 512);
  EXPECT_THAT(call->embedding_types,
              ::testing::ElementsAre(Type::kInt8, Type::kFloat, Type::kUbinary));
  call = ParseCohereEmbed(R"({"model": "m", "texts": ["a"]})");
  ASSERT_TRUE(call.ok());
  EXPECT_TRUE(call->encode.truncate());  // END by default
  EXPECT_THAT(call->embedding_types, ::testing::ElementsAre(Type::kFloat));
  const struct {
    const char* body;
    const char* words;
  } refused[] = {
      {R"({"texts": ["a"]})", "model is required"},
      {R"({"model": "m"})", "texts is required"},
      {R"({"model": "m", "texts": []})", "texts must be a non-empty list of strings"},
      {R"({"model": "m", "texts": [1]})", "texts must be a non-empty list of strings"},
      {R"({"model": "m", "texts": ["a", 2]})", "texts[1] must be a string"},
      {R"({"model": "m", "texts": ["a"], "images": ["x"]})", "images is not served"},
      {R"({"model": "m", "inputs": []})", "inputs is not served"},
      {R"({"model": "m", "texts": ["a"], "truncate": "START"})",
       "\"START\" is not served"},
      {R"({"model": "m", "texts": ["a"], "input_type": "image"})", "input_type must be"},
      {R"({"model": "m", "texts": ["a"], "embedding_types": ["float", "int4"]})",
       "embedding_types[1] must be"},
      {R"({"model": "m", "texts": ["a"], "embedding_types": []})",
       "embedding_types must be a non-empty list"},
      {R"({"model": "m", "texts": ["a"], "output_dimension": 0})",
       "dimensions must be a positive integer"},
      {R"({"model": "m", "texts": ["a"], "max_tokens": -1})",
       "max_tokens must be a positive integer"},
      {R"({"model": "m", "texts": ["a"], "dimensions": 4})",
       "unknown field \"dimensions\""},
      {R"(["a"])", "JSON object"},
  };
  for (const auto& [body, words] : refused) {
    call = ParseCohereEmbed(body);
    EXPECT_EQ(call.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_THAT(call.status().message(), HasSubstr(words)) << body;
  }
}

TEST(CohereEmbedTest, QuantizesAsSentenceTransformers) {
  // tests/tools/make_quantization_golden.py: quantize_embeddings' own answers, ranges
  // [-1, 1], on seeded values, every level's boundary, the ends, zero and -0.
  std::ifstream in(std::string(ATTNSERVE_TEST_DATA_DIR) + "/quantization.golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  using Type = EmbeddingsCall::EmbeddingType;
  const std::pair<const char*, Type> types[] = {{"int8", Type::kInt8},
                                                {"uint8", Type::kUint8},
                                                {"binary", Type::kBinary},
                                                {"ubinary", Type::kUbinary}};
  const nlohmann::json& rows = golden["values"];
  ASSERT_EQ(rows.size(), 8u);
  for (const auto& [name, type] : types) {
    for (size_t r = 0; r < rows.size(); ++r) {
      std::vector<float> values;
      for (const double value : rows[r]) values.push_back(static_cast<float>(value));
      EXPECT_EQ(QuantizeEmbedding(values, type),
                golden["values_quantized"][name][r].get<std::vector<int>>())
          << name << " row " << r;
    }
  }
}

}  // namespace
}  // namespace attnserve::server
