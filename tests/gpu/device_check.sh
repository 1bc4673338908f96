#!/usr/bin/env bash
# The GPU issue's device check, on a machine with an NVIDIA GPU, CUDA 13's libraries and
# PyTorch (the lent H200 machine has those, not gRPC or oneDNN). Here, first:
#   tests/gpu/pack.sh build build/gpu_carry     # the binaries and the libraries they need
# then there, from the repository root (carrying build/gpu_carry):
#   tests/gpu/device_check.sh build/gpu_carry OUT_DIR
# It unpacks the binaries, finds cuBLAS 13, and runs tests/gpu/device_check.py, whose
# output (figures beside their targets) is the check's report; logs go to OUT_DIR.
set -euo pipefail
carry="${1:?usage: device_check.sh CARRY_DIR OUT_DIR}"
out="${2:?usage: device_check.sh CARRY_DIR OUT_DIR}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
tar -xJf "${carry}/attnserve-gpu.tar.xz" -C "${work}"
# cuBLAS 13 from the CUDA toolkit or from PyTorch's wheels, whichever is there.
cublas="$(dirname "$( (ls /usr/local/cuda/lib64/libcublas.so.13 2>/dev/null;
  find / -xdev -name 'libcublas.so.13' 2>/dev/null) | head -n 1)")"
export LD_LIBRARY_PATH="${work}/lib:${cublas}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
echo "cuBLAS from ${cublas}"
mkdir -p "${out}"
exec "${PYTHON:-python3}" "${root}/tests/gpu/device_check.py" "${work}/bin" "${root}" "${out}"
