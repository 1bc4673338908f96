// Clock: the batcher's source of time, injectable so that batching tests advance time
// by hand instead of sleeping (tests/server/fake_clock.h).
#ifndef ATTNSERVE_SERVER_BATCHING_CLOCK_H_
#define ATTNSERVE_SERVER_BATCHING_CLOCK_H_

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

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_BATCHING_CLOCK_H_
