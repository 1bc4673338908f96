#!/usr/bin/env bash
# The layers' dependencies point down only. Fails listing every offending include:
# - core/ knows nothing of gRPC, protobuf or Prometheus, and its folders point down:
#     base < io < attention < encoder < cuda, text over base alone;
# - client/ never uses core/ or server/;
# - inside server/, each folder includes only its own and lower folders:
#     server/ (AttentionServer, main) > frontends > observability > pipeline > models
#     > batching.
# usage: check_layering.sh [REPO_ROOT]
set -euo pipefail
root="${1:-.}"
cd "${root}"
status=0
if grep -rnE '#include\s*[<"](grpc|grpcpp|google/protobuf|prometheus)/|\.pb\.h' core/; then
  echo "check_layering: core/ must not include gRPC, protobuf or prometheus" >&2
  status=1
fi
# core/'s folders: each includes only those it may (text/ only base/; cuda/ is called
# by the backends' factories in attention/ and encoder/, and uses both).
declare -A core_may=(
  [base]="base" [io]="base|io" [text]="base|text" [attention]="base|io|attention|cuda"
  [encoder]="base|io|attention|encoder|cuda" [cuda]="base|io|attention|encoder|cuda")
for folder in "${!core_may[@]}"; do
  [[ -d "core/${folder}" ]] || { echo "check_layering: core/${folder} is missing" >&2; status=1; continue; }
  if grep -rnE "#include\s*\"core/" "core/${folder}" |
       grep -vE "#include\s*\"core/(${core_may[${folder}]})/"; then
    echo "check_layering: core/${folder} may include only core/{${core_may[${folder}]}}" >&2
    status=1
  fi
done
if [[ -d client ]] && grep -rnE '#include\s*"(core|server)/' client/; then
  echo "check_layering: client/ must not include core/ or server/" >&2
  status=1
fi
# server/'s folders from the bottom up; each may include only those before it.
layers=(batching models pipeline observability frontends)
for ((i = 0; i < ${#layers[@]}; ++i)); do
  folder="server/${layers[i]}"
  [[ -d "${folder}" ]] || { echo "check_layering: ${folder} is missing" >&2; status=1; continue; }
  higher=("${layers[@]:i+1}")
  pattern='#include\s*"server/[a-z_]+\.h"'  # the top level: AttentionServer
  if ((${#higher[@]} > 0)); then
    pattern="${pattern}|#include\\s*\"server/($(IFS='|'; echo "${higher[*]}"))/"
  fi
  if grep -rnE "${pattern}" "${folder}"; then
    echo "check_layering: ${folder} includes a higher layer (order: ${layers[*]}, server/)" >&2
    status=1
  fi
done
[[ ${status} -eq 0 ]] && echo "check_layering: ok"
exit ${status}
