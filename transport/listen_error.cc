#include "transport/listen_error.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace attnserve::transport {
namespace {

// What binding host:port says now: "" when it succeeds. SO_REUSEADDR as both gRPC and
// civetweb set it, so a port in TIME_WAIT alone does not count as taken; no
// SO_REUSEPORT, so a listener there does.
std::string BindCause(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  const int resolved =
      getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (resolved != 0) return absl::AsciiStrToLower(gai_strerror(resolved));
  std::string cause;
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    const int fd = socket(address->ai_family, address->ai_socktype, address->ai_protocol);
    if (fd < 0) {
      cause = absl::AsciiStrToLower(std::strerror(errno));
      continue;
    }
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    const bool bound = bind(fd, address->ai_addr, address->ai_addrlen) == 0;
    const int bind_errno = errno;
    close(fd);
    if (bound) {
      cause.clear();
      break;
    }
    cause = absl::AsciiStrToLower(std::strerror(bind_errno));
  }
  freeaddrinfo(found);
  return cause;
}

}  // namespace

absl::Status ListenError(absl::string_view what, absl::string_view flag,
                         const std::string& host, int port) {
  absl::string_view bare = host;
  if (absl::ConsumePrefix(&bare, "[")) absl::ConsumeSuffix(&bare, "]");
  const std::string cause = BindCause(std::string(bare), port);
  const bool ipv6 = bare.find(':') != absl::string_view::npos;
  return absl::UnavailableError(absl::StrCat(
      "cannot listen on ", ipv6 ? absl::StrCat("[", bare, "]") : std::string(bare), ":",
      port, " (", what, "): ",
      cause.empty() ? "the server could not bind it (free when checked again)" : cause,
      "; ", flag, " picks another port"));
}

}  // namespace attnserve::transport
