#include "tests/server/fake_clock.h"

#include <algorithm>

namespace attnserve::server {

void FakeClock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                                  absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    waiting_.push_back(mu);
  }
  struct Args {
    FakeClock* clock;
    const absl::Condition* condition;
    absl::Time deadline;
  } args{this, &condition, deadline};
  // absl::Mutex re-evaluates a waiter's condition whenever the mutex is released;
  // Advance() releases every waiting mutex once after moving time.
  mu->Await(absl::Condition(
      +[](Args* a) { return a->condition->Eval() || a->clock->Now() >= a->deadline; },
      &args));
  absl::MutexLock lock(&mu_);
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), mu));
}

void FakeClock::Advance(absl::Duration duration) {
  std::vector<absl::Mutex*> waiting;
  {
    absl::MutexLock lock(&mu_);
    now_ += duration;
    waiting = waiting_;
  }
  for (absl::Mutex* mu : waiting) {
    mu->Lock();
    mu->Unlock();
  }
}

void FakeClock::AwaitWaiters(size_t n) {
  absl::MutexLock lock(&mu_);
  const auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return waiting_.size() >= n;
  };
  mu_.Await(absl::Condition(&enough));
}

}  // namespace attnserve::server
