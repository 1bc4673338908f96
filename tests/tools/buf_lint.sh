#!/usr/bin/env bash
# Lints proto/ with buf's DEFAULT rules (proto/buf.yaml). buf comes from the PyPI
# package buf-bin in the project virtualenv (deploy/install-deps.sh --test).
#
# usage: buf_lint.sh REPO_ROOT VENV_DIR
set -euo pipefail
root="$1"
buf="$2/bin/buf"
cd "${root}/proto"
"${buf}" --version
"${buf}" lint
echo "buf lint: proto/ passes the DEFAULT rules"
