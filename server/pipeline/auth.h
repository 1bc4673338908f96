// TokenAuthenticator: bearer tokens from a file (one per line), compared in constant
// time, re-read when the file changes so that tokens rotate without a restart.
#ifndef ATTNSERVE_SERVER_PIPELINE_AUTH_H_
#define ATTNSERVE_SERVER_PIPELINE_AUTH_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attnserve::server {

// Thread-safe.
class TokenAuthenticator {
 public:
  // Reads `path`: one token per line; blank lines and lines starting with '#' are
  // skipped. InvalidArgument naming the file when it cannot be read or holds no token.
  static absl::StatusOr<std::unique_ptr<TokenAuthenticator>> Load(
      const std::string& path);

  // OK when `authorization` (the value of the "authorization" header or metadata) is
  // "Bearer <token>" for a current token; else Unauthenticated, whose message never
  // contains what was sent. Re-reads the file first when it changed (checked at most
  // once a second); a file that became unreadable or empty keeps the old tokens.
  absl::Status Check(absl::string_view authorization);

  // Re-reads the file now. On an error the old tokens stay.
  absl::Status Reload();

 private:
  explicit TokenAuthenticator(std::string path) : path_(std::move(path)) {}
  // Re-reads the file if its modification time or size changed.
  void MaybeReload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  std::vector<std::string> tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t file_mtime_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t file_size_ ABSL_GUARDED_BY(mu_) = -1;
};

// Whether `a` equals `b`, in time that depends only on their lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_PIPELINE_AUTH_H_
