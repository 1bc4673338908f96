#!/usr/bin/env bash
# The image's runtime stage, exercised for real without a Docker engine: a minimal
# Debian 12 root from debootstrap (cached under the build folder), the runtime package
# list of deploy/install-deps.sh installed into it, the binaries copied in, attnserve
# started inside it with chroot as the non-root user, and called from outside with
# attnctl over loopback (a chroot shares the host's network).
#
# usage: runtime_root_test.sh REPO_ROOT BUILD_DIR
set -euo pipefail
root="$(cd "$1" && pwd)"
build="$(cd "$2" && pwd)"
rootfs="${build}/deploy/rootfs"
runtime_list="$("${root}/deploy/install-deps.sh" --list-runtime | tr '\n' ' ')"
stamp="runtime: ${runtime_list}"
uid=10001

cleanup() {
  if [[ -n "${server_pid:-}" ]] && kill -0 "${server_pid}" 2>/dev/null; then
    kill -KILL "${server_pid}" 2>/dev/null || true
  fi
  mountpoint -q "${rootfs}/proc" && umount "${rootfs}/proc" || true
}
trap cleanup EXIT

if [[ ! -f "${rootfs}/.attnserve-stamp" ]] || [[ "$(cat "${rootfs}/.attnserve-stamp")" != "${stamp}" ]]; then
  echo "runtime_root_test: building the Debian 12 root in ${rootfs} (cached afterwards)"
  mountpoint -q "${rootfs}/proc" && umount "${rootfs}/proc" || true
  rm -rf "${rootfs}"
  mkdir -p "$(dirname "${rootfs}")"
  debootstrap --variant=minbase bookworm "${rootfs}" http://deb.debian.org/debian >/dev/null
  # The same archives as this machine (point releases and security updates).
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    cp /etc/apt/sources.list.d/debian.sources "${rootfs}/etc/apt/sources.list.d/"
    rm -f "${rootfs}/etc/apt/sources.list"
  fi
  cp /etc/resolv.conf "${rootfs}/etc/resolv.conf"
  # The image's runtime stage runs exactly this script with --runtime.
  mkdir -p "${rootfs}/tmp/deploy"
  cp "${root}/deploy/install-deps.sh" "${rootfs}/tmp/deploy/install-deps.sh"
  chroot "${rootfs}" /tmp/deploy/install-deps.sh --runtime >/dev/null
  chroot "${rootfs}" useradd --system --uid "${uid}" --no-create-home \
    --shell /usr/sbin/nologin attnserve
  echo "${stamp}" > "${rootfs}/.attnserve-stamp"
fi

install -m 0755 "${build}/server/attnserve" "${build}/client/attnctl" \
  "${build}/client/attnbench" "${rootfs}/usr/local/bin/"
mountpoint -q "${rootfs}/proc" || mount -t proc proc "${rootfs}/proc"

# Every binary resolves all its libraries inside the root.
for binary in attnserve attnctl attnbench; do
  if chroot "${rootfs}" ldd "/usr/local/bin/${binary}" | grep -q "not found"; then
    chroot "${rootfs}" ldd "/usr/local/bin/${binary}" | grep "not found" >&2
    echo "runtime_root_test: ${binary} misses libraries in the runtime root" >&2
    exit 1
  fi
done

out="$(mktemp)"
chroot --userspec="${uid}:${uid}" "${rootfs}" /usr/local/bin/attnserve \
  --host=127.0.0.1 --port=0 --metrics_port=0 --metrics_host=127.0.0.1 >"${out}" 2>/dev/null &
server_pid=$!
for _ in $(seq 1 300); do
  grep -q "metrics on" "${out}" && break
  kill -0 "${server_pid}" 2>/dev/null || { echo "attnserve died in the root" >&2; exit 1; }
  sleep 0.1
done
port="$(head -1 "${out}" | sed 's/.*://')"
metrics_port="$(sed -n 2p "${out}" | sed 's/.*://')"
echo "runtime_root_test: attnserve runs in the root as uid ${uid} on port ${port}"

# Called from outside the root, as a client of the container would.
"${build}/client/attnctl" --target="127.0.0.1:${port}" health | grep -qx SERVING
"${build}/client/attnctl" --target="127.0.0.1:${port}" infer --random --seq_len=16 |
  grep -q "output_shape=\[16, 512\]"
# The image's HEALTHCHECK command, run inside the root.
chroot --userspec="${uid}:${uid}" "${rootfs}" /usr/local/bin/attnctl \
  --target="127.0.0.1:${port}" --timeout=3s health | grep -qx SERVING
# The process really runs as the non-root user.
[[ "$(stat -c %u "/proc/${server_pid}")" == "${uid}" ]] || {
  echo "attnserve is not running as uid ${uid}" >&2
  exit 1
}
# /proc is mounted, so the process metrics come from inside the root too.
"${build}/client/attnctl" --target="127.0.0.1:${port}" models | grep -q mha-base
bash -c "exec 3<>/dev/tcp/127.0.0.1/${metrics_port}; printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3; cat <&3" |
  grep -q '^process_resident_memory_bytes'

kill -TERM "${server_pid}"
wait "${server_pid}" && code=0 || code=$?
server_pid=""
rm -f "${out}"
[[ "${code}" == "0" ]] || { echo "attnserve exited ${code} after SIGTERM" >&2; exit 1; }
echo "runtime_root_test: served from the runtime root, drained, exit 0"
