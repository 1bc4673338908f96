// LoadGenerator: drives an attnserve with Attend calls, closed loop (a fixed number of
// calls in flight) or open loop (Poisson arrivals at a fixed rate, latency measured from
// each call's scheduled send time, so a slow server cannot hide its queueing), and
// measures throughput and latency until consecutive windows agree.
#ifndef ATTNSERVE_CLIENT_LOAD_GENERATOR_H_
#define ATTNSERVE_CLIENT_LOAD_GENERATOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/attention_client.h"

namespace attnserve::client {

// Sequence lengths to send: "128", "16:512" (uniform), or "64*3,512*1" (weighted list).
class LengthMix {
 public:
  // InvalidArgument naming the problem for a malformed spec or a length < 1.
  static absl::StatusOr<LengthMix> Parse(const std::string& spec);
  int64_t Draw(std::mt19937_64& generator) const;
  int64_t MaxLength() const;

 private:
  int64_t low_ = 0, high_ = 0;  // uniform range when the list is empty
  std::vector<int64_t> lengths_;
  std::vector<double> cumulative_weights_;  // running sums of the list's weights
};

// What one step (one concurrency or one rate) measured.
struct StepResult {
  std::string mode;      // "concurrency" or "rate"
  double level = 0;      // the concurrency, or the target rate in requests/s
  double seconds = 0;    // measured time (warm-up excluded)
  int64_t requests = 0;  // completed OK
  int64_t tokens = 0;
  int64_t sent = 0;                       // open loop: calls issued during measurement
  std::map<std::string, int64_t> errors;  // gRPC code name -> count
  // Latency percentiles in milliseconds of the calls that succeeded.
  double p50 = 0, p90 = 0, p95 = 0, p99 = 0, p999 = 0, max = 0, mean = 0;
  // The same for the calls that failed (how fast an overloaded server refuses).
  double error_p50 = 0, error_p99 = 0;
  int windows = 0;
  bool stable = false;  // three consecutive windows agreed within 10%
  // Calls that finished while on_measure_start/on_measure_end ran (e.g. scraping the
  // server's /metrics): a server-side count taken inside those hooks may or may not
  // include them.
  int64_t completed_during_hooks = 0;
  // Streams that ended UNAVAILABLE (a draining replica) and were reopened, with their
  // unanswered message sent again on the new stream.
  int64_t streams_reopened = 0;
  // Measurement ended early because `stop` was set (e.g. attnbench got SIGINT).
  bool interrupted = false;
  double requests_per_second() const { return seconds > 0 ? requests / seconds : 0; }
  double tokens_per_second() const { return seconds > 0 ? tokens / seconds : 0; }
};

// Not thread-safe: one step at a time.
class LoadGenerator {
 public:
  struct Options {
    std::string model;
    // The model's d_model (queries are [L, d_model]).
    int64_t d_model = 512;
    LengthMix lengths;
    // DATA_TYPE_FP32 or DATA_TYPE_BF16 query bytes.
    bool bf16 = false;
    // Use AttendStream (one stream per concurrency slot) instead of unary calls.
    bool stream = false;
    absl::Duration warmup = absl::Seconds(1);
    absl::Duration window = absl::Seconds(2);
    // A step ends after this much measurement even if windows still disagree.
    absl::Duration max_duration = absl::Seconds(20);
    // A step ends after this many measured requests (bounds every run).
    int64_t max_requests = 1000000;
    // Deadline of each call.
    absl::Duration timeout = absl::Seconds(30);
    uint64_t seed = 1;
    // Streams: attempts per message when a stream ends UNAVAILABLE before answering
    // it (the server is draining: "reopen the stream on another replica"). Each
    // attempt reopens the stream after a back-off of 20 ms doubling to 0.5 s, as the
    // unary retry policy does. 1 = never reopen.
    int stream_attempts = 1;
    // When set and it turns true, the step being measured ends at once (its figures
    // cover the time until then). Not owned; may be null.
    const std::atomic<bool>* stop = nullptr;
    // Called when measurement of a step begins and ends (for server-side deltas).
    std::function<void()> on_measure_start;
    std::function<void()> on_measure_end;
  };

  LoadGenerator(const AttentionClient* client, Options options);

  // `concurrency` calls always in flight. InvalidArgument for concurrency < 1.
  absl::StatusOr<StepResult> RunClosedLoop(int concurrency);
  // Poisson arrivals at `rate` requests/s. InvalidArgument for rate <= 0.
  absl::StatusOr<StepResult> RunOpenLoop(double rate);

 private:
  class Recorder;
  v1::AttendRequest MakeRequest(int64_t length) const;
  StepResult Measure(Recorder& recorder, const std::string& mode, double level);
  // Sleeps until `until`; false (at once) if options_.stop is set.
  bool SleepUnlessStopped(absl::Time until) const;

  // Runs `slots` AttendStream streams, each sending its next message when the previous
  // answer arrives.
  void RunStreams(int slots, Recorder& recorder);

  const AttentionClient* client_;
  Options options_;
  // Raw query bytes for the longest length; a request of length L sends a prefix.
  std::string payload_;
};

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_LOAD_GENERATOR_H_
