#!/usr/bin/env python3
"""The GPU issue's device check, run by device_check.sh on a machine with an NVIDIA GPU.

Steps, each printed with its figures and targets:
  1. correctness: cuda_attention_test (the CUDA backend against the fp64 reference:
     self, cross, causal, mixed lengths, head masks, pruned heads, bf16 inputs), then
     golden_test on goldens PyTorch makes on the same GPU (TF32 off);
  2. speed: cuda_bench against PyTorch's nn.MultiheadAttention and
     F.scaled_dot_product_attention on the same GPU, at (B, L, d, h) = (32,128,512,8),
     (8,512,768,12), (1,4096,1024,16), in TFLOP/s and as a fraction of a measured bf16
     matmul peak;
  3. encoders: cuda_encoder_test (the CUDA encoder against PyTorch's goldens), then
     encoder_check.py (the CUDA encoder beside PyTorch on MiniLM-L6- and BERT-base-shaped
     seeded checkpoints: numerics against float64, sentences/s against torch eager and
     torch.compile);
  4. the server end to end: attnserve --device=cuda:0 under attnbench, with the GPU's
     and the server process's CPU utilization sampled during the run; fp32 once more
     with --answer_threads=2 (responses built and sent off the compute threads).
usage: device_check.py BIN_DIR REPO_DIR OUT_DIR
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BIN, REPO, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
SHAPES = [(32, 128, 512, 8), (8, 512, 768, 12), (1, 4096, 1024, 16)]
results = {"steps": {}}


def log(*parts):
    print(*parts, flush=True)


def run(name, command, timeout, env=None):
    start = time.time()
    process = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                             env=dict(os.environ, **(env or {})))
    with open(os.path.join(OUT, name + ".log"), "w") as out:
        out.write(process.stdout + process.stderr)
    log(f"== {name}: exit {process.returncode} in {time.time() - start:.1f} s")
    results["steps"][name] = process.returncode
    return process


def correctness():
    test = run("cuda_attention_test", [os.path.join(BIN, "cuda_attention_test")], 300)
    for line in test.stdout.splitlines():
        if "relative error" in line or line.startswith("device:") or "FAILED" in line:
            log("  ", line)
    log("  ", test.stdout.strip().splitlines()[-1] if test.stdout.strip() else "")
    for kernel in ("ldmatrix_v", "transposed_v"):
        variant = run(f"cuda_attention_test_{kernel}",
                      [os.path.join(BIN, "cuda_attention_test"), "--gtest_filter=*TensorCore*"],
                      300, env={"ATTNSERVE_TENSOR_CORE_KERNEL": kernel})
        for line in variant.stdout.splitlines():
            if "FAILED" in line or line.startswith("[  PASSED"):
                log(f"   {kernel}:", line)
    goldens = tempfile.mkdtemp()
    run("make_golden_cuda", [sys.executable, os.path.join(REPO, "tests/tools/make_golden.py"),
                             goldens, "--device=cuda"], 300)
    golden = run("golden_test_cuda", [os.path.join(BIN, "golden_test")], 300,
                 env={"ATTNSERVE_GOLDEN_DIR": goldens, "ATTNSERVE_TEST_DEVICE": "cuda:0"})
    for line in golden.stdout.splitlines():
        if "difference from PyTorch" in line or "FAILED" in line:
            log("  ", line)
    log("  ", golden.stdout.strip().splitlines()[-1] if golden.stdout.strip() else "")


def torch_figures():
    import torch
    import torch.nn.functional as F
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    def time_ms(fn, iterations=20):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(iterations):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    peak = 2 * 8192 ** 3 / time_ms(lambda: a @ b, 10) / 1e9
    del a, b
    figures = {"bf16_peak_tflops": peak, "torch": torch.__version__, "rows": {}}
    for (B, L, d, h) in SHAPES:
        for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
            module = torch.nn.MultiheadAttention(d, h, batch_first=True).cuda().eval().to(dtype)
            x = torch.randn(B, L, d, device="cuda", dtype=dtype)
            with torch.inference_mode():
                mha = time_ms(lambda: module(x, x, x, need_weights=False))
            q = torch.randn(B, h, L, d // h, device="cuda", dtype=dtype)
            with torch.inference_mode():
                sdpa = time_ms(lambda: F.scaled_dot_product_attention(q, q, q))
            figures["rows"][f"{B},{L},{d},{h},{name}"] = {"mha_ms": mha, "sdpa_ms": sdpa}
    return figures


def speed():
    bench = run("cuda_bench", [os.path.join(BIN, "cuda_bench")], 400)
    ours = [json.loads(line) for line in bench.stdout.splitlines() if line.startswith("{")]
    theirs = torch_figures()
    peak = theirs["bf16_peak_tflops"]
    log(f"  torch {theirs['torch']}; measured bf16 matmul peak (8192^3): {peak:.0f} TFLOP/s")
    log("  shape (B,L,d,h) prec path          ours dev ms (TF/s) [attention ms]  ours wall ms   torch MHA ms  "
        "ours/MHA (target >= 1.0)  SDPA-only ms  %peak (target >= 50% at L>=512, bf16)")
    for row in ours:
        if "batch" not in row:
            log("  ", row)
            continue
        B, L, d, h = row["batch"], row["length"], row["d_model"], row["heads"]
        torch_row = theirs["rows"][f"{B},{L},{d},{h},{row['precision']}"]
        ratio = torch_row["mha_ms"] / row["device_ms"]
        fraction = row["device_tflops"] / peak
        log(f"  ({B},{L},{d},{h}) {row['precision']} {row['path']:12s} "
            f"{row['device_ms']:8.3f} ({row['device_tflops']:6.1f}) [{row['attention_ms']:7.3f}]  "
            f"{row['wall_ms']:8.3f}   "
            f"{torch_row['mha_ms']:8.3f}      x{ratio:5.2f} {'PASS' if ratio >= 1 else 'FAIL'}"
            f"          {torch_row['sdpa_ms']:8.3f}     {100 * fraction:5.1f}%")
        row.update(torch_mha_ms=torch_row["mha_ms"], torch_sdpa_ms=torch_row["sdpa_ms"],
                   ratio_vs_mha=ratio, fraction_of_peak=fraction)
    results["speed"] = {"ours": ours, "torch": theirs}


def smi(*args):
    """nvidia-smi's answer, or '' where there is none."""
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server(precision, flags=(), name=None):
    """attnserve on the GPU under attnbench at c=1, 16, 64; `flags` are added to its
    command line and `name` (default server_PRECISION) keys the results."""
    name = name or f"server_{precision}"
    port_file = tempfile.mktemp()
    server = subprocess.Popen(
        [os.path.join(BIN, "attnserve"), "--device=cuda:0", f"--precision={precision}",
         "--host=127.0.0.1", "--port=0", f"--port_file={port_file}", "--metrics_port=18080",
         "--metrics_host=127.0.0.1", "--http_port=-1", "--instances=2",
         "--max_batch_size=64", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True).start()
    deadline = time.time() + 120
    while not os.path.exists(port_file) or not open(port_file).read().strip():
        if server.poll() is not None or time.time() > deadline:
            log("  attnserve did not start:", "".join(lines)[-2000:])
            results["steps"][name] = 1
            return
        time.sleep(0.2)
    port = open(port_file).read().strip()
    utilization, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            out = smi("--query-gpu=utilization.gpu", "--format=csv,noheader,nounits")
            if out:
                utilization.append(float(out.splitlines()[0]))
            time.sleep(0.2)

    steps = []
    for concurrency in (1, 16, 64):
        utilization.clear()
        sampler = threading.Thread(target=sample)
        cpu_before, wall_before = cpu_seconds(server.pid), time.time()
        stop.clear()
        sampler.start()
        out = tempfile.mktemp()
        bench = subprocess.run(
            [os.path.join(BIN, "attnbench"), f"--target=127.0.0.1:{port}",
             f"--concurrency={concurrency}", "--seq_len=128", "--warmup=1s", "--window=3s",
             "--max_duration=10s", f"--json={out}"] +
            (["--dtype=bf16"] if precision == "bf16" else []),
            capture_output=True, text=True, timeout=120)
        stop.set()
        sampler.join()
        cpu = (cpu_seconds(server.pid) - cpu_before) / (time.time() - wall_before)
        if bench.returncode != 0:
            log("  attnbench failed:", bench.stderr[-1000:])
            results["steps"][name] = bench.returncode
            break
        step = json.load(open(out))["steps"][0]
        gpu = statistics.median(utilization) if utilization else float("nan")
        log(f"  {precision} c={concurrency:3d}: {step['requests_per_second']:8.1f} req/s  "
            f"p50 {step['latency_ms']['p50']:6.2f} ms  p99 {step['latency_ms']['p99']:6.2f} ms  "
            f"GPU utilization (median of samples) {gpu:5.1f}%  server CPU {100 * cpu:5.1f}% "
            f"of one core ({os.cpu_count()} cores here)")
        steps.append({"concurrency": concurrency, "step": step, "gpu_utilization": gpu,
                      "server_cpu_cores": cpu})
    else:
        results["steps"][name] = 0
    try:
        import urllib.request
        metrics = urllib.request.urlopen("http://127.0.0.1:18080/metrics", timeout=10).read()
        for line in metrics.decode().splitlines():
            if line.startswith(("attnserve_device_memory_bytes", "attnserve_model_info")):
                log("  ", line)
    except OSError as error:
        log("  /metrics:", error)
        results["steps"][f"metrics_{name}"] = 1
    server.terminate()
    server.wait(timeout=60)
    results[name] = steps


def encoders():
    data = {"ATTNSERVE_TEST_DATA_DIR": os.path.join(REPO, "tests", "data")}
    test = run("cuda_encoder_test", [os.path.join(BIN, "cuda_encoder_test")], 300, env=data)
    for line in test.stdout.splitlines():
        if "error vs PyTorch" in line or "FAILED" in line:
            log("  ", line)
    log("  ", test.stdout.strip().splitlines()[-1] if test.stdout.strip() else "")
    check = subprocess.run([sys.executable, os.path.join(REPO, "tests/gpu/encoder_check.py"),
                            BIN, os.path.join(OUT, "encoders")], text=True, timeout=420)
    results["steps"]["encoder_check"] = check.returncode


def memcheck():
    """compute-sanitizer's memcheck over a few fp32 and bf16 cases, where it runs."""
    try:
        run("memcheck", ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1",
                         os.path.join(BIN, "cuda_attention_test"),
                         "--gtest_filter=*MixedLengths/*:*Causal*/Fused*:*Pruned*/Auto*:"
                         "*WideHeads*/AutoFp32:*Cross*/MaterializedBf16"], 240)
        run("memcheck_encoder", ["compute-sanitizer", "--tool", "memcheck",
                                 "--error-exitcode", "1",
                                 os.path.join(BIN, "cuda_encoder_test")], 240,
            env={"ATTNSERVE_TEST_DATA_DIR": os.path.join(REPO, "tests", "data")})
    except FileNotFoundError:
        log("  compute-sanitizer: not on this machine")
    with open(os.path.join(OUT, "memcheck.log")) as out:
        log("  ", out.read().strip().splitlines()[-1])


def main():
    os.makedirs(OUT, exist_ok=True)
    log("== device:", smi("--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader") or "nvidia-smi: none")
    steps = {"correctness": correctness, "encoders": encoders, "speed": speed,
             "server_bf16": lambda: server("bf16"), "server_fp32": lambda: server("fp32"),
             # Responses built and sent off the compute threads, beside server_fp32:
             # on the GPU compute leaves the CPU free, so this is where it can pay off.
             "server_fp32_answer_threads": lambda: server(
                 "fp32", ["--answer_threads=2"], "server_fp32_answer_threads"),
             "memcheck": memcheck}
    # DEVICE_CHECK_STEPS=speed,memcheck runs some of them (a rerun inside a short lease).
    chosen = os.environ.get("DEVICE_CHECK_STEPS", ",".join(steps)).split(",")
    for step in (steps[name] for name in chosen):
        try:
            step()
        except Exception as error:  # keep going: every step's figures are wanted
            log("  step failed:", repr(error))
            results["steps"][getattr(step, "__name__", "step")] = repr(error)
    with open(os.path.join(OUT, "device_check.json"), "w") as out:
        json.dump(results, out, indent=1)
    failed = [name for name, code in results["steps"].items() if code != 0]
    log("== device check:", "FAILED " + ", ".join(failed) if failed else "all steps passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
