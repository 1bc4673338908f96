#!/usr/bin/env bash
# Fails when any project C++ file differs from what clang-format (.clang-format) makes.
set -euo pipefail
root="${1:-.}"
cd "${root}"
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
  '*.h' '*.cc' '*.proto' | grep -v '^tests/data/' || true)
if [[ ${#files[@]} -eq 0 ]]; then
  echo "check_format: no files found" >&2
  exit 1
fi
existing=()
for file in "${files[@]}"; do
  [[ -f "${file}" ]] && existing+=("${file}")
done
clang-format --dry-run --Werror "${existing[@]}"
echo "check_format: ${#existing[@]} files formatted"
