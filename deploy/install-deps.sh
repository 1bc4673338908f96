#!/usr/bin/env bash
# Installs the Debian 12 packages attnserve needs. The single list of dependencies:
# the Makefile, CI and the Dockerfile all call this script.
#
#   deploy/install-deps.sh            build + test dependencies (default)
#   deploy/install-deps.sh --runtime  only the shared libraries the binaries load
#   deploy/install-deps.sh --bench    extra peers used by `make bench-core` only
#   deploy/install-deps.sh --list-runtime   print the runtime list, one per line
#
# Idempotent: packages already installed are not fetched again, and `apt-get update`
# runs only when something is missing.
set -euo pipefail

# Every package providing a shared library that attnserve, attnctl or attnbench load
# (tests/deploy/check_runtime_libs.sh checks this against ldd), plus certificates.
runtime_packages=(
  libabsl20220623
  libc-ares2
  libc6
  libcivetweb1
  libdnnl2
  libgcc-s1
  libgomp1
  libgrpc++1.51
  libgrpc29
  libprometheus-cpp-core1.0
  libprometheus-cpp-pull1.0
  libprotobuf32
  libre2-9
  libssl3
  libstdc++6
  ocl-icd-libopencl1
  zlib1g
  ca-certificates
)

build_packages=(
  build-essential
  cmake
  pkg-config
  git
  protobuf-compiler
  protobuf-compiler-grpc
  libprotobuf-dev
  libgrpc++-dev
  libgrpc-dev
  libdnnl-dev
  ocl-icd-opencl-dev
  opencl-c-headers
  libabsl-dev
  prometheus-cpp-dev
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  clang-format
  clang
  debootstrap
  python3
  python3-grpcio
  python3-grpc-tools
  python3-protobuf
  python3-numpy
  python3-yaml
  prometheus
  kubectl
)

bench_packages=(
  python3-torch
  python3-numpy
  python3-yaml
  libopenblas0-pthread
)

mode="${1:---build}"
if [[ "${mode}" == "--list-runtime" ]]; then
  printf '%s\n' "${runtime_packages[@]}"
  exit 0
fi
case "${mode}" in
  --runtime) wanted=("${runtime_packages[@]}") ;;
  --build) wanted=("${runtime_packages[@]}" "${build_packages[@]}") ;;
  --bench) wanted=("${bench_packages[@]}") ;;
  *)
    echo "usage: $0 [--build|--runtime|--bench]" >&2
    exit 2
    ;;
esac

missing=()
for package in "${wanted[@]}"; do
  if ! dpkg-query -W -f='${Status}' "${package}" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("${package}")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#wanted[@]} packages present (${mode})"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [[ "$(id -u)" -ne 0 ]]; then
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
