// Calls attnserve at argv[1] with the installed client library: health, then one
// Attend of a [4, 512] query; prints the output shape. Exit 0 when both succeed.
#include <cstdio>
#include <vector>

#include "client/attention_client.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer HOST:PORT\n");
    return 2;
  }
  attnserve::client::AttentionClient::Options options;
  options.target = argv[1];
  auto client = attnserve::client::AttentionClient::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  auto serving = (*client)->IsServing();
  if (!serving.ok() || !*serving) {
    std::fprintf(stderr, "not serving: %s\n", serving.status().ToString().c_str());
    return 1;
  }
  attnserve::v1::AttendRequest request;
  const std::vector<float> query(4 * 512, 0.5f);
  *request.mutable_query() = attnserve::client::Float32Tensor(query, {4, 512});
  auto response = (*client)->Attend(request);
  if (!response.ok()) {
    std::fprintf(stderr, "%s\n", response.status().ToString().c_str());
    return 1;
  }
  const auto& shape = response->output().shape();
  std::printf("output shape [%lld, %lld]\n", static_cast<long long>(shape[0]),
              static_cast<long long>(shape[1]));
  return shape.size() == 2 && shape[0] == 4 && shape[1] == 512 ? 0 : 1;
}
