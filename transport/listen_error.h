#ifndef ATTNSERVE_TRANSPORT_LISTEN_ERROR_H_
#define ATTNSERVE_TRANSPORT_LISTEN_ERROR_H_

// Why a server could not listen on a port, in words a user can act on. gRPC and civetweb
// report only that binding failed (gRPC logs the cause, civetweb does not), so a second
// server on a taken port used to exit with "cannot listen on 0.0.0.0:50051" alone.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attnserve::transport {

// UNAVAILABLE "cannot listen on <host>:<port> (<what>): <cause>; <flag> picks another
// port", where the cause is what binding `host`:`port` here says now, after the
// server's own attempt failed: "address already in use" for a taken port, "cannot assign
// requested address" for a host that is not this machine's, and so on. `host` is a name
// or address, IPv6 with or without brackets. Does not block beyond the probe's bind.
absl::Status ListenError(absl::string_view what, absl::string_view flag,
                         const std::string& host, int port);

}  // namespace attnserve::transport

#endif  // ATTNSERVE_TRANSPORT_LISTEN_ERROR_H_
