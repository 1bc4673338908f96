// An in-process attnserve on 127.0.0.1:0 with a connected client, for server tests.
#ifndef ATTNSERVE_TESTS_SERVER_TEST_SERVER_H_
#define ATTNSERVE_TESTS_SERVER_TEST_SERVER_H_

#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/attention_client.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"

namespace attnserve::server::testing {

struct TestServer {
  std::unique_ptr<AttentionServer> server;
  std::unique_ptr<client::AttentionClient> client;

  AttentionBatcher& batcher(const std::string& model = kDefaultModelName) {
    return *server->registry().Find(model)->attention_batcher;
  }
};

inline TestServer StartServer(
    const std::function<void(AttentionServer::Options&)>& configure = nullptr) {
  AttentionServer::Options options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.grace_period = absl::Seconds(5);
  options.models.batching.max_queue_delay = absl::Milliseconds(1);
  if (configure) configure(options);
  TestServer test;
  auto server = AttentionServer::Create(options);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return test;
  test.server = std::move(server).value();
  client::AttentionClient::Options client_options;
  client_options.target = absl::StrCat("127.0.0.1:", test.server->port());
  client_options.timeout = absl::Seconds(30);
  test.client = std::move(client::AttentionClient::Create(client_options)).value();
  return test;
}

// Polls `condition` for up to 10 s (the server's bookkeeping trails the client's view).
inline bool Eventually(const std::function<bool()>& condition) {
  for (int i = 0; i < 1000 && !condition(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return condition();
}

inline std::vector<float> RandomValues(size_t count, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = distribution(generator);
  return values;
}

}  // namespace attnserve::server::testing

#endif  // ATTNSERVE_TESTS_SERVER_TEST_SERVER_H_
