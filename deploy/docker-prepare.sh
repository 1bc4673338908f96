#!/usr/bin/env bash
# Makes a Docker engine and attnserve's base image available on a machine with no image
# registry, so the image builds offline afterwards.
#
#   deploy/docker-prepare.sh --engine BUILD_DIR   start dockerd if none answers
#   deploy/docker-prepare.sh --all BUILD_DIR      the engine, debian:bookworm-slim made
#       with debootstrap (cached as BUILD_DIR/docker/bookworm-minbase.tar) and imported,
#       and the Dockerfile's package stages (build-deps, runtime-deps) built once, so
#       later builds reuse those layers without network; and attnserve-prometheus:debian
#       (deploy/prometheus/Dockerfile.debian, Debian's Prometheus) for compose_test
#
# The engine runs without a bridge network (--bridge=none, no iptables): containers use
# --network host on loopback ports only. Exit codes: 0 ready; 3 the engine cannot start
# here (the reason is printed); anything else a failure.
set -euo pipefail
mode="$1"
build="$(mkdir -p "$2" && cd "$2" && pwd)"
root="$(cd "$(dirname "$0")/.." && pwd)"
docker=/usr/bin/docker # Debian's docker.io client, the same release as its dockerd
state="${build}/docker"
mkdir -p "${state}"

start_engine() {
  if "${docker}" info >/dev/null 2>&1; then
    return 0
  fi
  if ! command -v dockerd >/dev/null; then
    echo "docker-prepare: dockerd is not installed (deploy/install-deps.sh --test)" >&2
    return 3
  fi
  if [[ "$(id -u)" -ne 0 ]]; then
    echo "docker-prepare: starting dockerd needs root" >&2
    return 3
  fi
  echo "docker-prepare: starting dockerd (log: ${state}/dockerd.log)"
  setsid dockerd --bridge=none --iptables=false --ip-masq=false \
    >"${state}/dockerd.log" 2>&1 </dev/null &
  local pid=$!
  for _ in $(seq 1 120); do
    "${docker}" info >/dev/null 2>&1 && return 0
    if ! kill -0 "${pid}" 2>/dev/null; then
      echo "docker-prepare: dockerd exited: $(tail -n 3 "${state}/dockerd.log")" >&2
      return 3
    fi
    sleep 0.5
  done
  echo "docker-prepare: dockerd did not answer within 60 s: $(tail -n 3 "${state}/dockerd.log")" >&2
  return 3
}

# debian:bookworm-slim, made locally: a debootstrap minbase root trimmed the way Debian's
# slim images are (no docs, man pages, locales or apt lists) and imported.
make_base_image() {
  if "${docker}" image inspect debian:bookworm-slim >/dev/null 2>&1; then
    return 0
  fi
  local tarball="${state}/bookworm-minbase.tar"
  if [[ ! -f "${tarball}" ]]; then
    local rootfs="${state}/rootfs"
    rm -rf "${rootfs}"
    echo "docker-prepare: debootstrap bookworm minbase into ${rootfs}"
    debootstrap --variant=minbase bookworm "${rootfs}" http://deb.debian.org/debian >/dev/null
    printf '%s\n' 'path-exclude=/usr/share/doc/*' 'path-include=/usr/share/doc/*/copyright' \
      'path-exclude=/usr/share/man/*' 'path-exclude=/usr/share/info/*' \
      'path-exclude=/usr/share/locale/*' >"${rootfs}/etc/dpkg/dpkg.cfg.d/01-slim"
    find "${rootfs}/usr/share/doc" -mindepth 2 ! -name copyright -delete 2>/dev/null || true
    rm -rf "${rootfs}"/usr/share/man/* "${rootfs}"/usr/share/info/* \
      "${rootfs}"/usr/share/locale/* "${rootfs}"/var/lib/apt/lists/* \
      "${rootfs}"/var/cache/apt/*.bin "${rootfs}"/var/cache/apt/archives/*.deb
    # The same archives as this machine (point releases and security updates).
    if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
      cp /etc/apt/sources.list.d/debian.sources "${rootfs}/etc/apt/sources.list.d/"
      rm -f "${rootfs}/etc/apt/sources.list"
    fi
    tar -C "${rootfs}" -cf "${tarball}.part" .
    mv "${tarball}.part" "${tarball}"
    rm -rf "${rootfs}"
  fi
  "${docker}" import "${tarball}" debian:bookworm-slim >/dev/null
  echo "docker-prepare: imported debian:bookworm-slim from ${tarball}"
}

warm_package_layers() {
  local stage
  for stage in runtime-deps build-deps; do
    echo "docker-prepare: building the ${stage} stage (packages from Debian's archive)"
    DOCKER_BUILDKIT=0 "${docker}" build -q --network host --target "${stage}" \
      -t "attnserve-${stage}:cache" "${root}" >/dev/null
  done
}

# Debian's Prometheus package in an image, standing in for prom/prometheus:v2.42.0
# (no registry here) when the compose stack is tested.
build_prometheus_image() {
  echo "docker-prepare: building attnserve-prometheus:debian (Debian's prometheus package)"
  DOCKER_BUILDKIT=0 "${docker}" build -q --network host -t attnserve-prometheus:debian \
    -f "${root}/deploy/prometheus/Dockerfile.debian" "${root}/deploy/prometheus" >/dev/null
}

case "${mode}" in
  --engine) start_engine ;;
  --all)
    start_engine || {
      code=$?
      echo "docker-prepare: no Docker engine here; the docker test will report SKIPPED" >&2
      exit $(( code == 3 ? 0 : code ))
    }
    make_base_image
    warm_package_layers
    build_prometheus_image
    ;;
  *)
    echo "usage: $0 --engine|--all BUILD_DIR" >&2
    exit 2
    ;;
esac
