// Whether this build is instrumented by ThreadSanitizer.
//
// TSan cannot see the synchronization inside GCC's OpenMP runtime (libgomp is not
// instrumented), so code of ours inside a parallel region would be reported as racing
// with the thread that set its data up. Core code that opens parallel regions of its own
// runs them on the calling thread in TSan builds; the other builds test the parallel
// path.
#ifndef ATTNSERVE_CORE_THREAD_SANITIZER_H_
#define ATTNSERVE_CORE_THREAD_SANITIZER_H_

namespace attnserve::core {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_THREAD_SANITIZER_H_
