#!/usr/bin/env bash
# check_thread_safety.sh must fail on a lock violation wherever it is: in a copy of the
# tree, a new source in a sub-folder (server/pipeline/, server/batching/) or in core/
# writes a guarded field without its lock. The check must also see every folder that
# holds sources, so a folder split never silently leaves it.
set -euo pipefail
root="$(cd "$1" && pwd)"
build="$(cd "$2" && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "${scratch}"' EXIT
violation='#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
namespace {
class Counter {
 public:
  void Add() { ++count_; }  // writes count_ without mu_
 private:
  absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};
}  // namespace
void UseCounter() { Counter counter; counter.Add(); }'
for folder in server/pipeline server/batching core; do
  copy="${scratch}/${folder//\//_}"
  mkdir -p "${copy}"
  cp -r "${root}/core" "${root}/transport" "${root}/server" "${root}/client" "${copy}/"
  printf '%s\n' "${violation}" > "${copy}/${folder}/injected_violation.cc"
  if bash "${root}/tests/tools/check_thread_safety.sh" "${copy}" "${build}" \
      injected_violation > "${scratch}/out" 2>&1; then
    echo "check_thread_safety_test: a violation in ${folder}/ was not caught" >&2
    exit 1
  fi
  if ! grep -q "${folder}/injected_violation.cc fails" "${scratch}/out"; then
    echo "check_thread_safety_test: the check failed, but not on ${folder}/" >&2
    cat "${scratch}/out" >&2
    exit 1
  fi
  rm -rf "${copy}"
done
# Every folder with project sources is checked.
out="$(bash "${root}/tests/tools/check_thread_safety.sh" "${root}" "${build}")"
echo "${out}"
expected=$(cd "${root}" && find core transport server client -name '*.cc' -not -path 'core/cuda/*' \
  -printf '%h\n' | sort -u | wc -l)
if ! grep -q "in ${expected} folders clean" <<< "${out}"; then
  echo "check_thread_safety_test: expected ${expected} folders checked" >&2
  exit 1
fi
echo "check_thread_safety_test: violations in server/pipeline, server/batching and core caught"
