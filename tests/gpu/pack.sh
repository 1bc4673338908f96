#!/usr/bin/env bash
# Packs what the device check runs into CARRY_DIR/attnserve-gpu.tar.xz: the binaries of
# a CUDA build and the shared libraries they load from this Debian (gRPC, protobuf,
# oneDNN, Abseil, ...), less the C runtime and CUDA's own, which the GPU machine has.
#   tests/gpu/pack.sh BUILD_DIR CARRY_DIR
set -euo pipefail
build="${1:?usage: pack.sh BUILD_DIR CARRY_DIR}"
carry="${2:?usage: pack.sh BUILD_DIR CARRY_DIR}"
stage="$(mktemp -d)"
trap 'rm -rf "${stage}"' EXIT
mkdir -p "${stage}/bin" "${stage}/lib" "${carry}"
binaries=("${build}/server/attnserve" "${build}/client/attnbench"
  "${build}/tests/core/cuda_attention_test" "${build}/tests/core/golden_test"
  "${build}/tests/gpu/cuda_bench" "${build}/tests/core/cuda_encoder_test"
  "${build}/tests/bench/encoder_bench")
cp "${binaries[@]}" "${stage}/bin/"
ldd "${binaries[@]}" | awk '/=> \// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64|libcuda|libcublas|libcublasLt|libcudart)\.so' |
  xargs -r cp -L -t "${stage}/lib/"
tar -cJf "${carry}/attnserve-gpu.tar.xz" -C "${stage}" bin lib
ls -la "${carry}/attnserve-gpu.tar.xz"
