#!/usr/bin/env bash
# Lints proto/ with buf's DEFAULT rules (proto/buf.yaml). buf comes from the npm
# package @bufbuild/buf, installed once under the build folder (TOOLS_DIR).
set -euo pipefail
root="$1"
tools="$2"
if ! command -v npm >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends npm
fi
buf="${tools}/npm-buf/node_modules/.bin/buf"
if [[ ! -x "${buf}" ]]; then
  mkdir -p "${tools}/npm-buf"
  npm install --prefix "${tools}/npm-buf" --no-audit --no-fund --silent @bufbuild/buf@1 >&2
fi
cd "${root}/proto"
"${buf}" --version
"${buf}" lint
echo "buf lint: proto/ passes the DEFAULT rules"
