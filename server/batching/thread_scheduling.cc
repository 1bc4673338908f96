#include "server/batching/thread_scheduling.h"

#include <sched.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace attnserve::server {

absl::Status SetSchedulingPolicy(pthread_t thread, SchedulingPolicy policy) {
  const bool batch = policy == SchedulingPolicy::kBatch;
  const sched_param priority{};  // static priority 0, the only one these policies take
  const int error =
      pthread_setschedparam(thread, batch ? SCHED_BATCH : SCHED_OTHER, &priority);
  if (error != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot set scheduling policy ",
                     batch ? "SCHED_BATCH" : "SCHED_OTHER", ": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::server
