#include "client/security_flags.h"

#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle to verify the server with; turns TLS on.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate chain, for mTLS (with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM client private key, for mTLS.");
ABSL_FLAG(std::string, token_file, "",
          "File whose first non-empty line is the bearer token sent with every call.");

namespace attnserve::client {

absl::Status ApplySecurityFlags(AttentionClient::Options& options) {
  options.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  const std::string path = absl::GetFlag(FLAGS_token_file);
  if (path.empty()) return absl::OkStatus();
  std::ifstream stream(path);
  if (!stream) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token_file=", path, ": cannot read"));
  }
  std::string line;
  while (std::getline(stream, line)) {
    const std::string token(absl::StripAsciiWhitespace(line));
    if (!token.empty()) {
      options.token = token;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--token_file=", path, ": holds no token"));
}

}  // namespace attnserve::client
