// Linux scheduling policies for the server's threads, for running compute first: every
// thread but the batch workers runs under SCHED_BATCH, whose wake-ups (a packet for a
// gRPC poller, a timer) do not preempt the thread on the CPU. A batch that is computing
// then keeps its core and caches until it blocks or its time slice ends, and the I/O
// that arrived meanwhile is handled in one go. The workers, and the intra-op threads
// they start (which inherit their policy), stay SCHED_OTHER.
#ifndef ATTNSERVE_SERVER_BATCHING_THREAD_SCHEDULING_H_
#define ATTNSERVE_SERVER_BATCHING_THREAD_SCHEDULING_H_

#include <pthread.h>

#include "absl/status/status.h"

namespace attnserve::server {

enum class SchedulingPolicy {
  kOther,  // SCHED_OTHER, Linux's default: a waking thread may preempt the running one.
  kBatch,  // SCHED_BATCH: the same share of the CPU, without preempting on wake-up.
};

// Sets `thread`'s policy, at static priority 0; threads it starts later inherit it.
// Needs no privilege: any thread may move itself or a sibling between these two.
// Returns FailedPrecondition naming the policy and the kernel's reason where it refuses
// (a seccomp filter, say). Does not block.
absl::Status SetSchedulingPolicy(pthread_t thread, SchedulingPolicy policy);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_BATCHING_THREAD_SCHEDULING_H_
