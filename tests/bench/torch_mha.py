#!/usr/bin/python3
"""PyTorch nn.MultiheadAttention over the core benchmark's grid: the peer we compare with.

Prints one JSON object per line: {"B", "L", "d", "h", "threads", "ms" (median), "gflops"}
and first a line {"openblas_core": ...} naming the OpenBLAS kernel in use. Run it
through `make bench-core` (tests/bench/compare_core.py), which sets the environment
torch needs to be fast here: OpenBLAS (libopenblas0-pthread), a glibc malloc that does
not return memory on every free, and no OPENBLAS_CORETYPE override.
"""
import argparse
import ctypes
import json
import statistics
import time

import torch

GRID = [(1, 128, 512, 8), (8, 128, 512, 8), (32, 128, 512, 8), (8, 512, 768, 12),
        (1, 2048, 1024, 16), (64, 64, 256, 4)]


def openblas_core():
    for name in ("libblas.so.3", "libopenblas.so.0"):
        try:
            lib = ctypes.CDLL(name)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
        except (OSError, AttributeError):
            continue
    return "not OpenBLAS"


def flops(batch, length, d_model):
    return 8.0 * batch * length * d_model ** 2 + 4.0 * batch * length ** 2 * d_model


def measure(batch, length, d_model, heads, threads, min_seconds):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(d_model, heads, batch_first=True).eval()
    x = torch.rand(batch, length, d_model)
    times = []
    with torch.inference_mode():
        for _ in range(2):
            module(x, x, x, need_weights=False)
        start = time.perf_counter()
        while len(times) < 3 or time.perf_counter() - start < min_seconds:
            begin = time.perf_counter()
            module(x, x, x, need_weights=False)
            times.append(time.perf_counter() - begin)
    ms = statistics.median(times) * 1e3
    return {"B": batch, "L": length, "d": d_model, "h": heads, "threads": threads,
            "ms": ms, "gflops": flops(batch, length, d_model) / ms / 1e6}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--min-seconds", type=float, default=0.5)
    args = parser.parse_args()
    print(json.dumps({"openblas_core": openblas_core(), "torch": torch.__version__}),
          flush=True)
    for threads in [int(t) for t in args.threads.split(",")]:
        for shape in GRID:
            print(json.dumps(measure(*shape, threads, args.min_seconds)), flush=True)


if __name__ == "__main__":
    main()
