#!/usr/bin/env bash
# The core layer knows nothing of gRPC, protobuf or Prometheus; the client never uses
# core or server. Fails listing the offending includes.
set -euo pipefail
root="${1:-.}"
cd "${root}"
status=0
if grep -rnE '#include\s*[<"](grpc|grpcpp|google/protobuf|prometheus)/|\.pb\.h' core/; then
  echo "check_layering: core/ must not include gRPC, protobuf or prometheus" >&2
  status=1
fi
if [[ -d client ]] && grep -rnE '#include\s*"(core|server)/' client/; then
  echo "check_layering: client/ must not include core/ or server/" >&2
  status=1
fi
[[ ${status} -eq 0 ]] && echo "check_layering: ok"
exit ${status}
