#!/usr/bin/python3
"""`make bench-doors`: the same requests through attnserve's KServe v2 doors, gRPC and
HTTP (Triton's binary tensor extension), measured by the same client, Triton's
perf_analyzer, against one server in one run. With --baseline=OTHER_ATTNSERVE, the same
gRPC figures for another build of the server beside this one (for a no-regression check
of a change). Not a test: it prints medians (perf_analyzer's p50) and ratios, each
target beside its figure, and the CPU.

The server is pinned to core 0 with one compute thread, perf_analyzer to core 1. The
requests are query and memory [128, 512] FP32 (perf_analyzer needs a shape for every
input with free dimensions, so this is cross-attention), zero data. Rounds alternate
the doors (and servers) so that drift on a shared machine hits each alike.

usage: doors_bench.py BUILD_DIR REPO_ROOT [--baseline=PATH_TO_ATTNSERVE] [--rounds=N]
"""
import os
import statistics
import subprocess
import sys
import tempfile

BUILD, ROOT = sys.argv[1], sys.argv[2]
OPTIONS = dict(arg[2:].split("=", 1) for arg in sys.argv[3:])
ATTNSERVE = os.path.join(BUILD, "server", "attnserve")
SERVER_CORE, CLIENT_CORE = "0", "1"
CONCURRENCY = (1, 16, 32)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_info  # noqa: E402
import perf_analyzer_run  # noqa: E402

TMP = tempfile.TemporaryDirectory()


def start(binary):
    process = subprocess.Popen(
        ["taskset", "-c", SERVER_CORE, binary, "--host=127.0.0.1", "--port=0",
         "--metrics_port=-1", "--http_port=0", "--instances=1", "--intra_op_threads=1"],
        env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True)
    grpc_target = process.stdout.readline().strip().rsplit(" ", 1)[1]
    http_target = process.stdout.readline().strip().rsplit(" ", 1)[1]
    return process, grpc_target, http_target


def perf_analyzer(protocol, target, concurrency):
    """(req/s, p50 ms) at one concurrency."""
    row = perf_analyzer_run.run(BUILD, CLIENT_CORE, protocol, target,
                                f"{concurrency}:{concurrency}", max(50, 10 * concurrency),
                                TMP.name)[0]
    return float(row["Inferences/Second"]), float(row["p50 latency"]) / 1000.0


def main():
    rounds = int(OPTIONS.get("rounds", "3"))
    servers = {"this build": ATTNSERVE}
    if "baseline" in OPTIONS:
        servers["baseline"] = OPTIONS["baseline"]
    print(host_info.cpu_description())
    results = {}  # (server, door, concurrency) -> [(req/s, p50 ms)]
    for _ in range(rounds):
        for name, binary in servers.items():
            process, grpc_target, http_target = start(binary)
            try:
                doors = {"gRPC": ("grpc", grpc_target)}
                if name == "this build":
                    doors["HTTP binary"] = ("http", http_target)
                for concurrency in CONCURRENCY:
                    for door, (protocol, target) in doors.items():
                        results.setdefault((name, door, concurrency), []).append(
                            perf_analyzer(protocol, target, concurrency))
            finally:
                process.terminate()
                process.wait(timeout=60)
    print(f"\nperf_analyzer, query+memory [128, 512] FP32, medians of {rounds} rounds")
    print(f"{'server':12} {'door':12} {'conc':>5} {'req/s':>9} {'p50 ms':>8}")
    median = {}
    for (name, door, concurrency), runs in sorted(results.items()):
        rate = statistics.median(r for r, _ in runs)
        p50 = statistics.median(p for _, p in runs)
        median[(name, door, concurrency)] = (rate, p50)
        print(f"{name:12} {door:12} {concurrency:>5} {rate:>9.1f} {p50:>8.2f}")
    print("\ntargets")
    http, grpc = median[("this build", "HTTP binary", 16)], median[("this build", "gRPC", 16)]
    ratio = http[0] / grpc[0]
    print(f"  HTTP binary / gRPC req/s at c16   x{ratio:.2f}   target >= x0.90   "
          f"{'PASS' if ratio >= 0.9 else 'FAIL'}")
    if "baseline" in servers:
        for concurrency in (1, 32):
            new = median[("this build", "gRPC", concurrency)][0]
            old = median[("baseline", "gRPC", concurrency)][0]
            print(f"  this build / baseline gRPC req/s at c{concurrency:<3} x{new / old:.2f}   "
                  f"target >= x0.95 (no regression)   {'PASS' if new / old >= 0.95 else 'FAIL'}")


if __name__ == "__main__":
    main()
