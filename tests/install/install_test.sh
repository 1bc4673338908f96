#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, builds tests/install/consumer (an
# outside project: find_package(attnserve), attnserve::client) against it, and runs it
# against a real attnserve on 127.0.0.1.
# usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
source="$2"
work="$(mktemp -d)"
server_pid=""
cleanup() {
  [[ -n "${server_pid}" ]] && kill "${server_pid}" 2>/dev/null && wait "${server_pid}" || true
  rm -rf "${work}"
}
trap cleanup EXIT

cmake --install "${build}" --prefix "${work}/prefix" > "${work}/install.log"
for header in client/attention_client.h attnserve/v1/attention.grpc.pb.h transport/transport.h; do
  [[ -f "${work}/prefix/include/${header}" ]] || { echo "not installed: ${header}" >&2; exit 1; }
done
cmake -S "${source}/tests/install/consumer" -B "${work}/consumer" \
  -DCMAKE_PREFIX_PATH="${work}/prefix" -DCMAKE_BUILD_TYPE=Release > "${work}/configure.log"
cmake --build "${work}/consumer" -j "$(nproc)" > "${work}/build.log"

# The installed server, told to write its port once bound; the wait is bounded.
"${work}/prefix/bin/attnserve" --host=127.0.0.1 --port=0 --metrics_port=-1 --http_port=-1 \
  --port_file="${work}/port" > "${work}/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1200); do
  [[ -s "${work}/port" ]] && break
  kill -0 "${server_pid}" 2>/dev/null || { cat "${work}/server.log" >&2; exit 1; }
  sleep 0.05
done
[[ -s "${work}/port" ]] || { echo "attnserve wrote no port file" >&2; exit 1; }
"${work}/consumer/consumer" "127.0.0.1:$(cat "${work}/port")"
echo "install_test: ok"
