#!/usr/bin/env bash
# check_layering.sh must fail on a back edge: a copy of server/ where batching includes
# the pipeline, and one where the pipeline includes a front door.
set -euo pipefail
root="$(cd "${1:-.}" && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "${scratch}"' EXIT
for edge in "batching:server/pipeline/request_pipeline.h" \
            "pipeline:server/frontends/kserve_http.h" \
            "frontends:server/attention_server.h"; do
  copy="${scratch}/${edge%%:*}"
  mkdir -p "${copy}"
  cp -r "${root}/core" "${root}/server" "${copy}/"
  echo "#include \"${edge#*:}\"" >> "${copy}/server/${edge%%:*}/back_edge.h"
  if bash "${root}/tests/tools/check_layering.sh" "${copy}" > /dev/null 2>&1; then
    echo "check_layering_test: ${edge} was not caught" >&2
    exit 1
  fi
done
bash "${root}/tests/tools/check_layering.sh" "${root}"
echo "check_layering_test: every back edge was caught"
