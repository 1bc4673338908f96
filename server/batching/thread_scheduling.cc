#include "server/batching/thread_scheduling.h"

#include <sched.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace attnserve::server {

absl::string_view SchedulingPolicyName(SchedulingPolicy policy) {
  return policy == SchedulingPolicy::kBatch ? "SCHED_BATCH" : "SCHED_OTHER";
}

absl::Status SetSchedulingPolicy(pthread_t thread, SchedulingPolicy policy) {
  sched_param priority{};
  priority.sched_priority = 0;
  const int error = pthread_setschedparam(
      thread, policy == SchedulingPolicy::kBatch ? SCHED_BATCH : SCHED_OTHER, &priority);
  if (error != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot set scheduling policy ",
                                                      SchedulingPolicyName(policy), ": ",
                                                      std::strerror(error)));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::server
