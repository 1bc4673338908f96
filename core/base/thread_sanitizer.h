// Whether this build is instrumented by ThreadSanitizer.
//
// TSan cannot see the synchronization inside GCC's OpenMP runtime (libgomp is not
// instrumented), so code of ours inside a parallel region would be reported as racing
// with the thread that set its data up. Core code that opens parallel regions of its own
// runs them on the calling thread in TSan builds; the other builds test the parallel
// path.
//
// Uninstrumented libraries also order work between threads that TSan cannot see: gRPC's
// core hands a started read or write to the thread that runs its completion.
// TsanHandOff and TsanTakeOver state such an edge (a release and an acquire on `key`,
// no memory access), and compile to nothing in other builds.
#ifndef ATTNSERVE_CORE_BASE_THREAD_SANITIZER_H_
#define ATTNSERVE_CORE_BASE_THREAD_SANITIZER_H_

#if defined(__SANITIZE_THREAD__)
#define ATTNSERVE_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ATTNSERVE_THREAD_SANITIZER 1
#endif
#endif

#ifdef ATTNSERVE_THREAD_SANITIZER
// The TSan runtime's annotation entry points (compiler-rt's sanitizer/tsan_interface.h).
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace attnserve::core {

#ifdef ATTNSERVE_THREAD_SANITIZER
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif

// Everything this thread did so far happens before what follows TsanTakeOver(key) on
// the thread an uninstrumented library hands the work to.
inline void TsanHandOff([[maybe_unused]] const void* key) {
#ifdef ATTNSERVE_THREAD_SANITIZER
  __tsan_release(const_cast<void*>(key));
#endif
}

inline void TsanTakeOver([[maybe_unused]] const void* key) {
#ifdef ATTNSERVE_THREAD_SANITIZER
  __tsan_acquire(const_cast<void*>(key));
#endif
}

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_BASE_THREAD_SANITIZER_H_
