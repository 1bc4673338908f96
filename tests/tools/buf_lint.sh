#!/usr/bin/env bash
# Lints proto/ with buf's DEFAULT rules (proto/buf.yaml). buf comes from the npm
# package @bufbuild/buf, installed once under the build folder (TOOLS_DIR).
set -euo pipefail
root="$1"
tools="$2"
bash "${root}/tests/tools/npm_tool.sh" "${tools}/npm-buf" @bufbuild/buf@1
buf="${tools}/npm-buf/node_modules/.bin/buf"
cd "${root}/proto"
"${buf}" --version
"${buf}" lint
echo "buf lint: proto/ passes the DEFAULT rules"
