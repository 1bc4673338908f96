// Shows that TsanHandOff/TsanTakeOver (core/base/thread_sanitizer.h) state a
// happens-before edge that ThreadSanitizer otherwise cannot see. Built in TSan builds
// only.
//
//   tsan_handoff_probe annotated   one thread writes a value and hands it to another
//                                  over a relaxed flag (which orders nothing for TSan),
//                                  stating the edge: no report, exit 0
//   tsan_handoff_probe bare        the same without the two calls: TSan reports a data
//                                  race (its self-test, proving the probe can fail)
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/base/thread_sanitizer.h"

namespace {

int Run(bool annotated) {
  int value = 0;
  int key = 0;  // the edge's address: only its identity matters
  std::atomic<bool> published{false};
  int seen = 0;
  // Started before the write, so its creation orders nothing after it.
  std::thread reader([&] {
    while (!published.load(std::memory_order_relaxed)) std::this_thread::yield();
    if (annotated) attnserve::core::TsanTakeOver(&key);
    seen = value;
  });
  value = 42;
  if (annotated) attnserve::core::TsanHandOff(&key);
  published.store(true, std::memory_order_relaxed);
  reader.join();
  std::printf("read %d\n", seen);
  return seen == 42 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 ||
      (std::strcmp(argv[1], "annotated") != 0 && std::strcmp(argv[1], "bare") != 0)) {
    std::fprintf(stderr, "usage: tsan_handoff_probe annotated|bare\n");
    return 2;
  }
  static_assert(attnserve::core::kThreadSanitizer,
                "build this probe with -fsanitize=thread");
  return Run(std::strcmp(argv[1], "annotated") == 0);
}
