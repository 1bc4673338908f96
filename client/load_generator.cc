#include "client/load_generator.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace attnserve::client {

namespace {

// Every request carries the first L rows of this many random tokens.
constexpr int64_t kMaxPayloadTokens = 1 << 16;

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = p * static_cast<double>(sorted.size() - 1);
  const size_t low = static_cast<size_t>(std::floor(rank));
  const size_t high = std::min(low + 1, sorted.size() - 1);
  return sorted[low] + (sorted[high] - sorted[low]) * (rank - static_cast<double>(low));
}

}  // namespace

absl::StatusOr<LengthMix> LengthMix::Parse(const std::string& spec) {
  LengthMix mix;
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad length mix '", spec, "' (", why,
                     "); use 128, 16:512 (uniform) or 64*3,512*1 (length*weight list)"));
  };
  if (spec.find(':') != std::string::npos) {
    std::vector<std::string> parts = absl::StrSplit(spec, ':');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &mix.low_) ||
        !absl::SimpleAtoi(parts[1], &mix.high_) || mix.low_ < 1 || mix.high_ < mix.low_) {
      return bad("range must be LOW:HIGH with 1 <= LOW <= HIGH");
    }
    return mix;
  }
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    std::vector<std::string> parts = absl::StrSplit(item, '*');
    int64_t length = 0;
    double weight = 1;
    if (parts.empty() || parts.size() > 2 || !absl::SimpleAtoi(parts[0], &length) ||
        length < 1 ||
        (parts.size() == 2 && (!absl::SimpleAtod(parts[1], &weight) || !(weight > 0)))) {
      return bad("each entry is LENGTH or LENGTH*WEIGHT, LENGTH >= 1, WEIGHT > 0");
    }
    mix.lengths_.push_back(length);
    mix.cumulative_weights_.push_back(
        weight + (mix.cumulative_weights_.empty() ? 0 : mix.cumulative_weights_.back()));
  }
  if (mix.lengths_.empty()) return bad("empty");
  if (*std::max_element(mix.lengths_.begin(), mix.lengths_.end()) > kMaxPayloadTokens) {
    return bad(absl::StrCat("lengths above ", kMaxPayloadTokens));
  }
  return mix;
}

int64_t LengthMix::Draw(std::mt19937_64& generator) const {
  if (lengths_.empty()) {
    return std::uniform_int_distribution<int64_t>(low_, high_)(generator);
  }
  // Built once in Parse: a draw is one uniform number and a binary search.
  const double point =
      std::uniform_real_distribution<double>(0, cumulative_weights_.back())(generator);
  const size_t index = static_cast<size_t>(
      std::upper_bound(cumulative_weights_.begin(), cumulative_weights_.end(), point) -
      cumulative_weights_.begin());
  return lengths_[std::min(index, lengths_.size() - 1)];
}

int64_t LengthMix::MaxLength() const {
  return lengths_.empty() ? high_ : *std::max_element(lengths_.begin(), lengths_.end());
}

// Collects completions of one step; thread-safe.
class LoadGenerator::Recorder {
 public:
  explicit Recorder(absl::Duration window) : window_(window) {}

  void StartMeasuring(absl::Time now) {
    absl::MutexLock lock(&mu_);
    measure_start_ = now;
    measuring_ = true;
  }
  // Stops counting completions that end after `now`; returns the measured span.
  void StopMeasuring(absl::Time now) {
    absl::MutexLock lock(&mu_);
    measure_end_ = now;
    measuring_ = false;
    stopped_ = true;
  }
  bool stopping() const { return stop_.load(std::memory_order_acquire); }
  // Every call that finished so far, measured or not.
  int64_t completed() const { return completed_.load(std::memory_order_relaxed); }
  void RequestStop() { stop_.store(true, std::memory_order_release); }

  void Record(absl::Time start, absl::Time done, const absl::Status& status,
              int64_t tokens) {
    completed_.fetch_add(1, std::memory_order_relaxed);
    absl::MutexLock lock(&mu_);
    if (!measuring_ || done < measure_start_) return;
    if (status.ok()) {
      latencies_ms_.push_back(absl::ToDoubleMilliseconds(done - start));
      ++requests_;
      tokens_ += tokens;
      ++window_counts_[static_cast<size_t>((done - measure_start_) / window_)];
    } else {
      ++errors_[std::string(absl::StatusCodeToString(status.code()))];
      error_latencies_ms_.push_back(absl::ToDoubleMilliseconds(done - start));
    }
  }
  void CountSent() {
    absl::MutexLock lock(&mu_);
    if (measuring_) ++sent_;
  }
  void CountReopened() {
    absl::MutexLock lock(&mu_);
    if (measuring_) ++reopened_;
  }

  int64_t requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  // Completions in window `index` (0-based since measurement began).
  int64_t WindowCount(size_t index) const {
    absl::MutexLock lock(&mu_);
    const auto it = window_counts_.find(index);
    return it == window_counts_.end() ? 0 : it->second;
  }

  void Fill(StepResult& result) {
    absl::MutexLock lock(&mu_);
    std::sort(latencies_ms_.begin(), latencies_ms_.end());
    result.seconds = absl::ToDoubleSeconds(measure_end_ - measure_start_);
    result.requests = requests_;
    result.tokens = tokens_;
    result.sent = sent_;
    result.errors = errors_;
    result.streams_reopened = reopened_;
    result.p50 = Percentile(latencies_ms_, 0.50);
    result.p90 = Percentile(latencies_ms_, 0.90);
    result.p95 = Percentile(latencies_ms_, 0.95);
    result.p99 = Percentile(latencies_ms_, 0.99);
    result.p999 = Percentile(latencies_ms_, 0.999);
    result.max = latencies_ms_.empty() ? 0 : latencies_ms_.back();
    double total = 0;
    for (double latency : latencies_ms_) total += latency;
    result.mean = latencies_ms_.empty() ? 0 : total / latencies_ms_.size();
    std::sort(error_latencies_ms_.begin(), error_latencies_ms_.end());
    result.error_p50 = Percentile(error_latencies_ms_, 0.50);
    result.error_p99 = Percentile(error_latencies_ms_, 0.99);
  }

 private:
  const absl::Duration window_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> completed_{0};
  mutable absl::Mutex mu_;
  bool measuring_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time measure_start_ ABSL_GUARDED_BY(mu_);
  absl::Time measure_end_ ABSL_GUARDED_BY(mu_);
  std::vector<double> latencies_ms_ ABSL_GUARDED_BY(mu_);
  std::vector<double> error_latencies_ms_ ABSL_GUARDED_BY(mu_);
  int64_t requests_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reopened_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> errors_ ABSL_GUARDED_BY(mu_);
  std::map<size_t, int64_t> window_counts_ ABSL_GUARDED_BY(mu_);
};

LoadGenerator::LoadGenerator(const AttentionClient* client, Options options)
    : client_(client), options_(std::move(options)) {
  std::mt19937_64 generator(options_.seed);
  std::uniform_real_distribution<float> distribution(-1.0f, 1.0f);
  const int64_t values = options_.lengths.MaxLength() * options_.d_model;
  payload_.resize(values * (options_.bf16 ? 2 : 4));
  for (int64_t i = 0; i < values; ++i) {
    const float value = distribution(generator);
    if (options_.bf16) {
      uint32_t bits;
      std::memcpy(&bits, &value, 4);
      const uint16_t high = static_cast<uint16_t>(bits >> 16);
      std::memcpy(payload_.data() + 2 * i, &high, 2);
    } else {
      std::memcpy(payload_.data() + 4 * i, &value, 4);
    }
  }
}

v1::AttendRequest LoadGenerator::MakeRequest(int64_t length) const {
  v1::AttendRequest request;
  request.set_model(options_.model);
  v1::Tensor* query = request.mutable_query();
  query->set_dtype(options_.bf16 ? v1::DATA_TYPE_BF16 : v1::DATA_TYPE_FP32);
  query->add_shape(length);
  query->add_shape(options_.d_model);
  query->set_raw(payload_.data(), length * options_.d_model * (options_.bf16 ? 2 : 4));
  return request;
}

bool LoadGenerator::SleepUnlessStopped(absl::Time until) const {
  // Slices short enough that an interrupt ends the step promptly.
  constexpr absl::Duration kSlice = absl::Milliseconds(50);
  while (true) {
    if (options_.stop != nullptr && options_.stop->load(std::memory_order_acquire)) {
      return false;
    }
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) return true;
    absl::SleepFor(std::min(left, kSlice));
  }
}

StepResult LoadGenerator::Measure(Recorder& recorder, const std::string& mode,
                                  double level) {
  absl::SleepFor(options_.warmup);
  int64_t during_hooks = 0;
  if (options_.on_measure_start) {
    const int64_t before = recorder.completed();
    options_.on_measure_start();
    during_hooks += recorder.completed() - before;
  }
  const absl::Time start = absl::Now();
  recorder.StartMeasuring(start);
  StepResult result;
  result.mode = mode;
  result.level = level;
  int windows = 0;
  absl::Time end;
  while (true) {
    if (!SleepUnlessStopped(start + options_.window * (windows + 1))) {
      result.interrupted = true;
      end = absl::Now();
      break;
    }
    ++windows;
    end = start + options_.window * windows;
    if (windows >= 3) {
      // Stable when the last three windows' throughputs are within 10% of their mean.
      const double a = recorder.WindowCount(windows - 1);
      const double b = recorder.WindowCount(windows - 2);
      const double c = recorder.WindowCount(windows - 3);
      const double mean = (a + b + c) / 3;
      const double spread = std::max({a, b, c}) - std::min({a, b, c});
      if (mean > 0 && spread <= 0.1 * mean) {
        result.stable = true;
        break;
      }
    }
    if (options_.window * windows >= options_.max_duration ||
        recorder.requests() >= options_.max_requests) {
      break;
    }
  }
  recorder.StopMeasuring(end);
  if (options_.on_measure_end) {
    const int64_t before = recorder.completed();
    options_.on_measure_end();
    during_hooks += recorder.completed() - before;
  }
  recorder.RequestStop();
  result.windows = windows;
  result.completed_during_hooks = during_hooks;
  return result;
}

absl::StatusOr<StepResult> LoadGenerator::RunClosedLoop(int concurrency) {
  if (concurrency < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("concurrency must be >= 1, got ", concurrency));
  }
  Recorder recorder(options_.window);
  if (options_.stream) {
    std::thread streams([&] { RunStreams(concurrency, recorder); });
    StepResult result = Measure(recorder, "concurrency", concurrency);
    streams.join();
    recorder.Fill(result);
    return result;
  }
  // Each slot re-issues its call from the previous call's completion.
  absl::Mutex mu;
  int in_flight = 0;
  std::mt19937_64 generator(options_.seed);
  std::function<void()> issue;
  issue = [&] {
    int64_t length;
    {
      absl::MutexLock lock(&mu);
      if (recorder.stopping()) return;
      ++in_flight;
      length = options_.lengths.Draw(generator);
    }
    // Latency counts from the send, as perf_analyzer's does: building the request
    // (a copy of the tokens) is the caller's own work, not the call's.
    v1::AttendRequest request = MakeRequest(length);
    const absl::Time start = absl::Now();
    client_->AttendAsync(std::move(request), options_.timeout,
                         [&, start, length](absl::StatusOr<v1::AttendResponse> response) {
                           recorder.Record(start, absl::Now(), response.status(), length);
                           issue();
                           absl::MutexLock lock(&mu);
                           --in_flight;
                         });
  };
  for (int i = 0; i < concurrency; ++i) issue();
  StepResult result = Measure(recorder, "concurrency", concurrency);
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](int* count) { return *count == 0; }, &in_flight));
  recorder.Fill(result);
  return result;
}

void LoadGenerator::RunStreams(int slots, Recorder& recorder) {
  std::vector<std::thread> threads;
  for (int slot = 0; slot < slots; ++slot) {
    threads.emplace_back([this, slot, &recorder] {
      std::mt19937_64 generator(options_.seed + slot);
      // The message waiting for an answer survives a reopen: it is sent again on the
      // next stream (attention has no side effects, so a repeat is harmless).
      v1::AttendStreamRequest message;
      int64_t length = 0;
      absl::Time start;
      bool pending = false;
      int attempt = 0;
      while (!recorder.stopping()) {
        grpc::ClientContext context;
        client_->PrepareContext(context, absl::InfiniteDuration());
        auto stream = client_->stub()->AttendStream(&context);
        bool broke = false;
        while (!recorder.stopping()) {
          if (!pending) {
            length = options_.lengths.Draw(generator);
            *message.mutable_request() = MakeRequest(length);
            start = absl::Now();
            pending = true;
            attempt = 0;
          }
          v1::AttendStreamResponse answer;
          if (!stream->Write(message) || !stream->Read(&answer)) {
            broke = true;
            break;
          }
          pending = false;
          const absl::Status status =
              answer.has_error()
                  ? absl::Status(static_cast<absl::StatusCode>(answer.error().code()),
                                 answer.error().message())
                  : absl::OkStatus();
          recorder.Record(start, absl::Now(), status, length);
        }
        if (!broke) {
          stream->WritesDone();
          (void)stream->Finish();
          break;
        }
        const grpc::Status ended = stream->Finish();
        if (ended.error_code() == grpc::StatusCode::UNAVAILABLE &&
            ++attempt < options_.stream_attempts) {
          recorder.CountReopened();
          absl::SleepFor(
              std::min(absl::Milliseconds(20) * (1 << std::min(attempt - 1, 5)),
                       absl::Milliseconds(500)));
          continue;
        }
        // Out of attempts, or an end that reopening would not fix: the message
        // fails with the stream's status and the slot goes on with a new stream.
        recorder.Record(
            start, absl::Now(),
            ended.ok() ? absl::UnknownError("the stream ended without an answer")
                       : absl::Status(static_cast<absl::StatusCode>(ended.error_code()),
                                      ended.error_message()),
            0);
        pending = false;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

absl::StatusOr<StepResult> LoadGenerator::RunOpenLoop(double rate) {
  if (!(rate > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("rate must be > 0, got ", rate));
  }
  if (options_.stream) {
    return absl::InvalidArgumentError(
        "--stream runs closed loop only (use --concurrency)");
  }
  Recorder recorder(options_.window);
  absl::Mutex mu;
  int64_t in_flight = 0;
  std::thread scheduler([&] {
    std::mt19937_64 generator(options_.seed);
    std::exponential_distribution<double> gap(rate);
    absl::Time next = absl::Now();
    while (!recorder.stopping()) {
      next += absl::Seconds(gap(generator));
      absl::SleepFor(next - absl::Now());
      const int64_t length = options_.lengths.Draw(generator);
      // Latency counts from the scheduled time: if this thread or the server falls
      // behind, the wait is part of what a real caller would have seen.
      const absl::Time scheduled = next;
      {
        absl::MutexLock lock(&mu);
        ++in_flight;
      }
      recorder.CountSent();
      client_->AttendAsync(MakeRequest(length), options_.timeout,
                           [&, scheduled, length](absl::StatusOr<v1::AttendResponse> r) {
                             recorder.Record(scheduled, absl::Now(), r.status(), length);
                             absl::MutexLock lock(&mu);
                             --in_flight;
                           });
    }
  });
  StepResult result = Measure(recorder, "rate", rate);
  scheduler.join();
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](int64_t* count) { return *count == 0; }, &in_flight));
  recorder.Fill(result);
  return result;
}

}  // namespace attnserve::client
