#!/usr/bin/env bash
# clang-tidy (.clang-tidy: bugprone, performance, google, abseil, selected modernize)
# over the request path: every front door and the pipeline they share, where any
# warning is an error. Needs the build folder's compile_commands.json.
# usage: clang_tidy.sh REPO_ROOT BUILD_DIR
set -euo pipefail
root="$(cd "$1" && pwd)"
build="$(cd "$2" && pwd)"
cd "${root}"
mapfile -t files < <(git ls-files 'server/frontends/*.cc' 'server/pipeline/*.cc')
if [[ ${#files[@]} -eq 0 ]]; then
  echo "clang_tidy: no files found" >&2
  exit 1
fi
status=0
for file in "${files[@]}"; do
  if ! clang-tidy --quiet -p "${build}" "${file}" 2> /dev/null; then
    status=1
  fi
done
[[ ${status} -eq 0 ]] && echo "clang_tidy: ${#files[@]} files clean"
exit ${status}
