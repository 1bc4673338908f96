#!/usr/bin/env bash
# Installs npm packages that a test needs into PREFIX (under the build folder), once:
# nothing is fetched when every package is already there. One prefix per tool, so
# tests running in parallel never share a node_modules.
#
# usage: npm_tool.sh PREFIX PACKAGE[@VERSION]...
set -euo pipefail
prefix="$1"
shift
missing=()
for package in "$@"; do
  name="${package%@*}"                 # strip a version, keep a leading @scope
  [[ -z "${name}" ]] && name="${package}"
  [[ -d "${prefix}/node_modules/${name}" ]] || missing+=("${package}")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
if ! command -v npm >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends npm >&2
fi
mkdir -p "${prefix}"
npm install --prefix "${prefix}" --no-audit --no-fund --silent "${missing[@]}" >&2
