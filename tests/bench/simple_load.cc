// A minimal closed-loop load: C client threads call Attend back to back for a fixed
// time against a running attnserve and print requests/s and latency percentiles.
// Until attnbench exists this is how the server's figure in the notes is measured:
//   simple_load TARGET CONCURRENCY SECONDS SEQ_LEN
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "client/attention_client.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s TARGET CONCURRENCY SECONDS SEQ_LEN\n", argv[0]);
    return 2;
  }
  attnserve::client::AttentionClient::Options options;
  options.target = argv[1];
  const int concurrency = std::atoi(argv[2]);
  const double seconds = std::atof(argv[3]);
  const int64_t length = std::atoll(argv[4]);
  auto client = attnserve::client::AttentionClient::Create(options);
  if (!client.ok()) return 1;
  attnserve::v1::AttendRequest request;
  *request.mutable_query() = attnserve::client::Float32Tensor(
      std::vector<float>(length * 512, 0.1f), {length, 512});
  if (!(*client)->Attend(request).ok()) {
    std::fprintf(stderr, "warm-up call failed\n");
    return 1;
  }
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(seconds));
  std::vector<std::vector<double>> latencies(concurrency);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&, t] {
      while (std::chrono::steady_clock::now() < end) {
        const auto start = std::chrono::steady_clock::now();
        if (!(*client)->Attend(request).ok()) ++errors;
        latencies[t].push_back(std::chrono::duration<double, std::milli>(
                                   std::chrono::steady_clock::now() - start)
                                   .count());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<double> all;
  for (const auto& per_thread : latencies)
    all.insert(all.end(), per_thread.begin(), per_thread.end());
  std::sort(all.begin(), all.end());
  const auto percentile = [&](double p) {
    return all[static_cast<size_t>(p * (all.size() - 1))];
  };
  std::printf(
      "concurrency=%d seq_len=%lld requests=%zu errors=%d rps=%.1f p50_ms=%.2f "
      "p99_ms=%.2f\n",
      concurrency, static_cast<long long>(length), all.size(), errors.load(),
      all.size() / seconds, percentile(0.5), percentile(0.99));
  return errors.load() == 0 ? 0 : 1;
}
