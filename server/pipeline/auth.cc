#include "server/pipeline/auth.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace attnserve::server {

namespace {

constexpr absl::string_view kBearer = "Bearer ";

// The tokens of `path`, or an error naming it.
absl::StatusOr<std::vector<std::string>> ReadTokens(const std::string& path) {
  std::ifstream stream(path);
  if (!stream) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << stream.rdbuf();
  std::vector<std::string> tokens;
  for (absl::string_view line : absl::StrSplit(text.str(), '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    tokens.emplace_back(line);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": holds no token"));
  }
  return tokens;
}

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return difference == 0;
}

absl::StatusOr<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::Load(
    const std::string& path) {
  std::unique_ptr<TokenAuthenticator> auth(new TokenAuthenticator(path));
  absl::StatusOr<std::vector<std::string>> tokens = ReadTokens(path);
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_token_file=", tokens.status().message()));
  }
  absl::MutexLock lock(&auth->mu_);
  auth->tokens_ = *std::move(tokens);
  auth->checked_ = absl::InfinitePast();
  auth->MaybeReload();  // records the file's time and size
  return auth;
}

void TokenAuthenticator::MaybeReload() {
  const absl::Time now = absl::Now();
  if (now - checked_ < absl::Seconds(1)) return;
  checked_ = now;
  struct stat info;
  if (stat(path_.c_str(), &info) != 0) return;
  const int64_t mtime_ns =
      static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec;
  if (mtime_ns == file_mtime_ns_ && info.st_size == file_size_) return;
  absl::StatusOr<std::vector<std::string>> tokens = ReadTokens(path_);
  if (!tokens.ok()) return;  // keep serving with the tokens we have
  tokens_ = *std::move(tokens);
  file_mtime_ns_ = mtime_ns;
  file_size_ = info.st_size;
}

absl::Status TokenAuthenticator::Reload() {
  absl::StatusOr<std::vector<std::string>> tokens = ReadTokens(path_);
  if (!tokens.ok()) return tokens.status();
  absl::MutexLock lock(&mu_);
  tokens_ = *std::move(tokens);
  return absl::OkStatus();
}

absl::Status TokenAuthenticator::Check(absl::string_view authorization) {
  if (!absl::StartsWith(authorization, kBearer)) {
    return absl::UnauthenticatedError(
        "missing bearer token: send metadata \"authorization: Bearer <token>\"");
  }
  const absl::string_view presented = authorization.substr(kBearer.size());
  absl::MutexLock lock(&mu_);
  MaybeReload();
  bool match = false;
  for (const std::string& token : tokens_) match |= ConstantTimeEquals(presented, token);
  if (!match) return absl::UnauthenticatedError("the bearer token is not valid");
  return absl::OkStatus();
}

}  // namespace attnserve::server
