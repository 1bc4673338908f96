#!/usr/bin/env bash
# Compiles the core, server and client sources with clang's -Wthread-safety as errors,
# so every ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED annotation is enforced.
set -euo pipefail
root="$1"
build="$2"
cd "${root}"
status=0
count=0
for file in core/*.cc transport/*.cc server/*.cc client/*.cc; do
  count=$((count + 1))
  if ! clang++ -std=c++17 -fsyntax-only -Wthread-safety -Werror=thread-safety \
      -I. -I"${build}/proto" "${file}"; then
    status=1
  fi
done
[[ ${status} -eq 0 ]] && echo "check_thread_safety: ${count} files clean"
exit ${status}
