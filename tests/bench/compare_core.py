#!/usr/bin/python3
"""Runs the core benchmark and PyTorch's nn.MultiheadAttention interleaved and prints one
table: per (B, L, d, h, threads) the median ms and GFLOP/s of each, the speed ratio
core/torch, and the core's fraction of the in-situ peak (oneDNN's 2048^3 f32 matmul at
the same thread count, measured in the same run).

Rounds alternate core, torch, core, torch, ... so both see the same machine weather;
medians are taken over rounds. Invoked by `make bench-core`.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_core(binary, min_time):
    # OMP_WAIT_POLICY is left as the caller set it (unset: libgomp spins briefly after
    # each parallel region, which helps many small primitives at 2 threads).
    env = dict(os.environ)
    out = subprocess.run(
        [binary, "--benchmark_format=json", f"--benchmark_min_time={min_time}",
         "--benchmark_filter=BM_MultiHeadAttention|BM_PeakMatmul"],
        check=True, capture_output=True, text=True, env=env).stdout
    results = {}
    for bench in json.loads(out)["benchmarks"]:
        name = bench["name"]
        args = dict((k, int(v)) for k, v in re.findall(r"(\w+):(\d+)", name))
        ms = bench["real_time"] if bench["time_unit"] == "ms" else bench["real_time"] / 1e6
        if name.startswith("BM_PeakMatmul"):
            results[("peak", args["threads"])] = bench["GFLOPs"]
        else:
            key = (args["B"], args["L"], args["d"], args["h"], args["threads"])
            results[key] = ms
    return results


def run_torch(min_seconds):
    env = dict(os.environ)
    # OpenBLAS picks its best kernel only without these overrides (set on this machine
    # for old OpenBLAS builds); they are dropped for this command alone.
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    # glibc malloc otherwise returns torch's large buffers to the OS on every call,
    # which makes torch ~3x slower and would flatter the core.
    env["MALLOC_MMAP_THRESHOLD_"] = "67108864"
    env["MALLOC_TRIM_THRESHOLD_"] = "134217728"
    out = subprocess.run(
        ["/usr/bin/python3", os.path.join(HERE, "torch_mha.py"),
         f"--min-seconds={min_seconds}"],
        check=True, capture_output=True, text=True, env=env).stdout
    results, info = {}, {}
    for line in out.splitlines():
        row = json.loads(line)
        if "openblas_core" in row:
            info = row
            continue
        results[(row["B"], row["L"], row["d"], row["h"], row["threads"])] = row["ms"]
    return results, info


def flops(batch, length, d_model):
    return 8.0 * batch * length * d_model ** 2 + 4.0 * batch * length ** 2 * d_model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--core-bench", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=0.5)
    args = parser.parse_args()

    core_rounds, torch_rounds, info = [], [], {}
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}/{args.rounds}: core", file=sys.stderr, flush=True)
        core_rounds.append(run_core(args.core_bench, args.min_time))
        print(f"round {round_index + 1}/{args.rounds}: torch", file=sys.stderr, flush=True)
        torch_result, info = run_torch(args.min_time)
        torch_rounds.append(torch_result)

    def median(rounds, key):
        values = [r[key] for r in rounds if key in r]
        return statistics.median(values) if values else float("nan")

    print(f"PyTorch {info.get('torch')} with OpenBLAS core '{info.get('openblas_core')}'; "
          f"medians of {args.rounds} interleaved rounds")
    peaks = {t: median(core_rounds, ("peak", t)) for t in (1, 2)}
    print(f"in-situ peak (oneDNN 2048^3 f32 matmul): 1 thread {peaks[1]:.1f} GFLOP/s, "
          f"2 threads {peaks[2]:.1f} GFLOP/s")
    header = (f"{'B':>3} {'L':>5} {'d':>5} {'h':>3} {'thr':>3} | {'core ms':>9} "
              f"{'GFLOP/s':>8} | {'torch ms':>9} {'GFLOP/s':>8} | {'vs torch':>8} "
              f"{'vs peak':>7}")
    print(header)
    print("-" * len(header))
    keys = sorted((k for k in core_rounds[0] if k[0] != "peak"), key=lambda k: (k[4], k[:4]))
    for key in keys:
        batch, length, d_model, heads, threads = key
        core_ms = median(core_rounds, key)
        torch_ms = median(torch_rounds, key)
        core_gflops = flops(batch, length, d_model) / core_ms / 1e6
        torch_gflops = flops(batch, length, d_model) / torch_ms / 1e6
        print(f"{batch:>3} {length:>5} {d_model:>5} {heads:>3} {threads:>3} | "
              f"{core_ms:>9.2f} {core_gflops:>8.1f} | {torch_ms:>9.2f} {torch_gflops:>8.1f} | "
              f"{torch_ms / core_ms:>7.2f}x {core_gflops / peaks[threads]:>7.2f}")
    for shape in sorted({k[:4] for k in keys}):
        one = median(core_rounds, shape + (1,))
        two = median(core_rounds, shape + (2,))
        print(f"2-thread speed-up {shape}: {one / two:.2f}x")


if __name__ == "__main__":
    main()
