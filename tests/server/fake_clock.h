// FakeClock: time that tests move by hand, so that batching tests wait on events and
// never on the wall clock. Test-only; the server runs on RealClock.
#ifndef ATTNSERVE_TESTS_SERVER_FAKE_CLOCK_H_
#define ATTNSERVE_TESTS_SERVER_FAKE_CLOCK_H_

#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/batching/clock.h"

namespace attnserve::server {

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
  // Blocks until `n` threads wait in AwaitWithDeadline (a worker that found nothing
  // due), so that a test can act after a decision instead of racing it.
  void AwaitWaiters(size_t n);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Mutex*> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_TESTS_SERVER_FAKE_CLOCK_H_
