#!/usr/bin/env bash
# Lints the Dockerfile with dockerfilelint (npm, installed once under the build folder)
# and checks that it builds and installs with the scripts CI runs, so CI covers its
# steps: deploy/install-deps.sh (--build, --runtime) and the Makefile's build.
set -euo pipefail
root="$1"
tools="$2"
dockerfile="${root}/Dockerfile"
bash "${root}/tests/tools/npm_tool.sh" "${tools}/npm-dockerfilelint" dockerfilelint@1
lint="${tools}/npm-dockerfilelint/node_modules/.bin/dockerfilelint"
"${lint}" "${dockerfile}"

status=0
expect() {
  if ! grep -qE "$1" "${dockerfile}"; then
    echo "check_dockerfile: missing: $2" >&2
    status=1
  fi
}
expect '^RUN deploy/install-deps.sh --build$' "build stage installs with deploy/install-deps.sh --build"
expect '^RUN make build ' "build stage builds with the Makefile CI uses"
expect '^RUN /tmp/deploy/install-deps.sh --runtime' "runtime stage installs deploy/install-deps.sh --runtime"
expect '^USER [0-9]+$' "a numeric non-root USER"
expect '^HEALTHCHECK ' "a HEALTHCHECK"
expect '^EXPOSE 50051 8080$' "EXPOSE 50051 8080"
expect '^ENTRYPOINT \["attnserve"\]$' "ENTRYPOINT attnserve"
# No RUN step may install packages by name outside the script.
if grep -E '^RUN .*apt-get install' "${dockerfile}"; then
  echo "check_dockerfile: install packages through deploy/install-deps.sh only" >&2
  status=1
fi
[[ ${status} -eq 0 ]] && echo "check_dockerfile: lint clean, steps use the CI scripts"
exit ${status}
