#!/usr/bin/env bash
# Compiles every C++ source of the project's own libraries and programs (core/,
# transport/, server/, client/ and all their sub-folders) with clang's -Wthread-safety
# as errors, so every ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED annotation is
# enforced. The sources are found, not listed: a folder added or split later is covered
# without touching this file (check_thread_safety_test.sh proves both).
# CUDA sources (core/cuda/) need nvcc's headers and hold no locks; they are skipped.
# Usage: check_thread_safety.sh ROOT BUILD [ONLY]; ONLY, a substring of a path, compiles
# just the found sources whose path holds it (the self-test's injected files).
set -euo pipefail
root="$1"
build="$2"
only="${3:-}"
cd "${root}"
status=0
count=0
folders=()
while IFS= read -r -d '' file; do
  count=$((count + 1))
  folders+=("$(dirname "${file}")")
  [[ -n "${only}" && "${file}" != *"${only}"* ]] && continue
  if ! clang++ -std=c++17 -fsyntax-only -Wthread-safety -Werror=thread-safety \
      -I. -I"${build}/proto" "${file}"; then
    echo "check_thread_safety: ${file} fails" >&2
    status=1
  fi
done < <(find core transport server client -name '*.cc' -not -path 'core/cuda/*' -print0 | sort -z)
if [[ ${count} -eq 0 ]]; then
  echo "check_thread_safety: no sources found under ${root}" >&2
  exit 1
fi
folder_count=$(printf '%s\n' "${folders[@]}" | sort -u | wc -l)
[[ ${status} -eq 0 ]] && echo "check_thread_safety: ${count} files in ${folder_count} folders clean"
exit ${status}
