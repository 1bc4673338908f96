#!/usr/bin/env bash
# Every shared library the shipped binaries load must come from a package on the
# runtime list of deploy/install-deps.sh (what the image's runtime stage installs).
set -euo pipefail
root="$1"
shift
declare -A runtime
while read -r package; do runtime["${package}"]=1; done \
  < <("${root}/deploy/install-deps.sh" --list-runtime)
missing=0
checked=0
for binary in "$@"; do
  while read -r library; do
    [[ -z "${library}" ]] && continue
    package=$(dpkg -S "${library}" 2>/dev/null | awk -F: 'NR == 1 {print $1}' || true)
    if [[ -z "${package}" ]]; then
      package=$(dpkg -S "$(readlink -f "${library}")" 2>/dev/null | awk -F: 'NR == 1 {print $1}' || true)
    fi
    checked=$((checked + 1))
    if [[ -z "${package}" ]]; then
      echo "check_runtime_libs: ${binary}: ${library} belongs to no package" >&2
      missing=1
    # A lookup, not `printf | grep -q`: under pipefail, grep exiting at its first match
    # can kill printf with SIGPIPE and fail the pipeline (seen on a loaded machine).
    elif [[ -z "${runtime[${package}]:-}" ]]; then
      echo "check_runtime_libs: ${binary}: ${library} comes from ${package}," \
        "which is not on the runtime list" >&2
      missing=1
    fi
  done < <(ldd "${binary}" | awk '/=>/ {print $3}')
done
echo "check_runtime_libs: ${checked} library references checked"
exit ${missing}
