#!/usr/bin/env bash
# check_layering.sh must fail on a back edge: copies of the tree where server/'s
# batching includes the pipeline, the pipeline a front door, a front door the server's
# wiring, core/'s text/ the attention math, attention/ an encoder, and base/ a model file.
set -euo pipefail
root="$(cd "${1:-.}" && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "${scratch}"' EXIT
for edge in "server/batching:server/pipeline/request_pipeline.h" \
            "server/pipeline:server/frontends/kserve_http.h" \
            "server/frontends:server/attention_server.h" \
            "core/text:core/attention/model_spec.h" \
            "core/attention:core/encoder/encoder_spec.h" \
            "core/base:core/io/safetensors.h"; do
  copy="${scratch}/${edge%%:*}"
  mkdir -p "${copy}"
  cp -r "${root}/core" "${root}/server" "${copy}/"
  echo "#include \"${edge#*:}\"" >> "${copy}/${edge%%:*}/back_edge.h"
  if bash "${root}/tests/tools/check_layering.sh" "${copy}" > /dev/null 2>&1; then
    echo "check_layering_test: ${edge} was not caught" >&2
    exit 1
  fi
done
bash "${root}/tests/tools/check_layering.sh" "${root}"
echo "check_layering_test: every back edge was caught"
