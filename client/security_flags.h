// The security flags attnctl and attnbench share: --tls_ca, --tls_cert, --tls_key and
// --token_file, applied to AttentionClient::Options.
#ifndef ATTNSERVE_CLIENT_SECURITY_FLAGS_H_
#define ATTNSERVE_CLIENT_SECURITY_FLAGS_H_

#include "absl/status/status.h"
#include "client/attention_client.h"

namespace attnserve::client {

// The file whose flags --help lists beside the binary's own.
inline constexpr char kSecurityFlagsFile[] = "client/security_flags.cc";

// Copies the TLS flags into `options` and reads the token (the file's first non-empty
// line). InvalidArgument naming the flag when the token file cannot be read.
absl::Status ApplySecurityFlags(AttentionClient::Options& options);

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_SECURITY_FLAGS_H_
