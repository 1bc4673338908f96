"""Triton's perf_analyzer (the binary in the project venv's tritonclient wheel) run on
attnserve's KServe v2 doors for the benchmarks, pinned to a core: query and memory
[128, 512] FP32 (it needs a shape for the optional memory, so this is cross-attention),
zero data (its random bytes are NaN as FP32), bounded windows (no stability wait: these
machines are noisy)."""
import csv
import os
import subprocess


def run(build, cpu, protocol, target, concurrency_range, request_count, scratch):
    """perf_analyzer over `protocol` ("grpc" or "http") at `target` for
    `concurrency_range` ("1:16:15"), `request_count` requests per window; returns its CSV
    rows (one per concurrency, as dicts). Raises CalledProcessError on failure."""
    venv = os.path.join(build, "venv", "bin")
    library = subprocess.run(
        [os.path.join(venv, "python"), "-c",
         "import nvidia.cuda_runtime, os; print(os.path.dirname(nvidia.cuda_runtime.__file__))"],
        check=True, capture_output=True, text=True).stdout.strip()
    report = os.path.join(scratch, "perf_analyzer.csv")
    subprocess.run(
        ["taskset", "-c", cpu, os.path.join(venv, "perf_analyzer"), "-m", "mha-base",
         "-u", target, "-i", protocol, "--shape", "query:128,512", "--shape",
         "memory:128,512", "--input-data", "zero", "--concurrency-range", concurrency_range,
         "--measurement-mode", "count_windows", "--measurement-request-count",
         str(request_count), "--stability-percentage", "999", "--max-trials", "3",
         "-f", report],
        check=True, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, LD_LIBRARY_PATH=os.path.join(library, "lib")))
    with open(report) as rows:
        return list(csv.DictReader(rows))
