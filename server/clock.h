// Clock: the batcher's source of time, injectable so that batching tests advance time
// by hand instead of sleeping.
#ifndef ATTNSERVE_SERVER_CLOCK_H_
#define ATTNSERVE_SERVER_CLOCK_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace attnserve::server {

// Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Blocks until `condition` holds or Now() >= deadline, whichever is first.
  // REQUIRES: `mu` is held (and is held again on return).
  virtual void AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                                 absl::Time deadline) = 0;
};

// Wall-clock time; waits with absl::Mutex::AwaitWithDeadline.
class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  void AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                         absl::Time deadline) override {
    mu->AwaitWithDeadline(condition, deadline);
  }
  // A process-wide instance.
  static RealClock* Get();
};

// Time that moves only when Advance() is called. Waiters whose deadline is reached by
// Advance() wake up. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(1))
      : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                         absl::Time deadline) override;
  // Moves time forward and wakes waiters so they re-check their deadlines.
  void Advance(absl::Duration duration);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Mutex*> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CLOCK_H_
