"""Load and faults on loopback, bounded in time: `make overload` and `make soak`.

attnserve (Release build) runs pinned to core 0 with one compute thread; attnbench
processes run on core 1. First the capacity (closed loop, concurrency 16, mixed
lengths) and the unloaded p99 (open loop at 10% of capacity) are measured, then:

  overload  open loop at 2x capacity against a short queue (--max_queue_size=8): the
            excess must be refused with RESOURCE_EXHAUSTED quickly (p99 of refusals,
            target < 1 ms as the client sees it) while admitted calls keep a p99 within
            3x the unloaded one.
  soak      SECONDS at 80% of capacity with mixed lengths, plus a streaming client and a
            client of 256-token calls with an 8 ms deadline (most end DEADLINE_EXCEEDED or
            CANCELLED: intended), about 80% of capacity together; any other error fails. The server's RSS is sampled
            every 10 s; after the first minute of warm-up it may grow at most 5%.

Each measured figure is printed beside its target; exit 1 when a target is missed.

usage: reliability.py BUILD_DIR (overload | soak [SECONDS])
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

BUILD = sys.argv[1]
MODE = sys.argv[2]
ATTNSERVE = os.path.join(BUILD, "server", "attnserve")
ATTNBENCH = os.path.join(BUILD, "client", "attnbench")
LENGTHS = os.environ.get("RELIABILITY_LENGTHS", "16*4,64*3,256*1")
# Memory kept by glibc malloc on both sides (page faults dominate otherwise; see
# transport/transport.h).
ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "268435456",
       "MALLOC_TRIM_THRESHOLD_": "1073741824", "MALLOC_TOP_PAD_": "67108864",
       "OMP_WAIT_POLICY": "passive"}


def cpu_model():
    with open("/proc/cpuinfo") as f:
        fields = {key.strip(): value.strip()
                  for key, value in (line.split(":", 1) for line in f if ":" in line)}
    name = fields["model name"]
    flags = fields["flags"].split()
    isa = "avx512_bf16" if "avx512_bf16" in flags else (
        "avx512f" if "avx512f" in flags else ("avx2" if "avx2" in flags else "sse"))
    return f"{name} ({isa}), {os.cpu_count()} cores"


class Server:
    def __init__(self, *flags):
        self.process = subprocess.Popen(
            ["taskset", "-c", "0", ATTNSERVE, "--host=127.0.0.1", "--port=0",
             "--metrics_host=127.0.0.1", "--metrics_port=0", "--http_port=-1", "--instances=1",
             "--intra_op_threads=1", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
        line = self.process.stdout.readline()
        if "listening on" not in line:
            raise SystemExit(f"attnserve did not start: {line!r}")
        self.target = line.split()[-1]
        self.metrics_url = (f"http://127.0.0.1:"
                            f"{self.process.stdout.readline().strip().rsplit(':', 1)[1]}/metrics")

    def refusal_p99_ms(self):
        """The server's own refusal time, p99: the upper bound of the histogram bucket
        that holds the 99th percentile of attnserve_refusal_duration_seconds."""
        text = urllib.request.urlopen(self.metrics_url, timeout=30).read().decode()
        buckets = sorted(
            (float(bound), float(value)) for bound, value in re.findall(
                r'attnserve_refusal_duration_seconds_bucket\{[^}]*le="([^"+]+)"[^}]*\} (\S+)',
                text))
        total = next((float(v) for v in re.findall(
            r"attnserve_refusal_duration_seconds_count\{[^}]*\} (\S+)", text)), 0.0)
        if total == 0:
            return 0.0
        return next(bound for bound, count in buckets if count >= 0.99 * total) * 1e3

    def rss_mib(self):
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self):
        self.process.terminate()
        return self.process.wait(timeout=120)


def bench(target, *args, wait=True, lengths=LENGTHS):
    """Runs attnbench on core 1; returns its first step as a dict (or the Popen)."""
    out = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
    process = subprocess.Popen(
        ["taskset", "-c", "1", ATTNBENCH, f"--target={target}", f"--seq_len={lengths}",
         f"--json={out.name}", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    process.json_path = out.name
    return result(process) if wait else process


def result(process):
    _, err = process.communicate(timeout=3600)
    with open(process.json_path) as f:
        text = f.read()
    os.unlink(process.json_path)
    if not text:
        raise SystemExit(f"attnbench failed: {err}")
    return json.loads(text)["steps"][0]


def check(name, value, target, ok):
    print(f"  {name:<44} {value:>12}   target {target:<12} {'ok' if ok else 'MISSED'}")
    return ok


def capacity(server):
    step = bench(server.target, "--concurrency=16", "--max_duration=15s")
    unloaded = bench(server.target, f"--rate={step['requests_per_second'] * 0.1:.0f}",
                     "--max_duration=10s")
    print(f"capacity {step['requests_per_second']:.0f} req/s (closed loop, concurrency "
          f"16, lengths {LENGTHS}); unloaded p99 {unloaded['latency_ms']['p99']:.2f} ms "
          f"at {step['requests_per_second'] * 0.1:.0f} req/s")
    return step["requests_per_second"], unloaded["latency_ms"]["p99"]


def overload():
    server = Server("--max_queue_size=8")
    try:
        rate, unloaded_p99 = capacity(server)
        step = bench(server.target, f"--rate={2 * rate:.0f}", "--max_duration=20s")
        server_refusal_p99 = server.refusal_p99_ms()
    finally:
        code = server.stop()
    errors = step["errors"]
    refused = errors.get("RESOURCE_EXHAUSTED", 0)
    other = {k: v for k, v in errors.items() if k != "RESOURCE_EXHAUSTED"}
    print(f"overload: {2 * rate:.0f} req/s offered for {step['seconds']:.0f} s: "
          f"{step['requests']} answered, {refused} refused, other errors {other}")
    ok = all([
        check("refused share of offered", f"{refused / max(step['sent'], 1):.0%}", "> 0",
              refused > 0),
        check("refusal p99 (client-side)", f"{step['error_latency_ms']['p99']:.3f} ms",
              "< 1 ms", step["error_latency_ms"]["p99"] < 1.0),
        check("refusal p99 (server-side, bucket bound)", f"<= {server_refusal_p99:.3f} ms",
              "< 1 ms", server_refusal_p99 < 1.0),
        check("admitted p99 / unloaded p99",
              f"{step['latency_ms']['p99'] / unloaded_p99:.2f}", "<= 3",
              step["latency_ms"]["p99"] <= 3 * unloaded_p99),
        check("errors other than RESOURCE_EXHAUSTED", sum(other.values()), "0", not other),
        check("exit code after SIGTERM", code, "0", code == 0),
    ])
    return ok


def soak(seconds):
    server = Server()
    try:
        rate, _ = capacity(server)
        duration = f"--max_duration={seconds}s"
        # Together the three clients offer about 80% of capacity: unary calls at 65%,
        # one stream and one impatient client (its calls cost transport only).
        unary = bench(server.target, f"--rate={0.65 * rate:.0f}", duration, "--warmup=0s",
                      f"--window={seconds}s", wait=False)
        stream = bench(server.target, "--stream", "--concurrency=1", duration,
                       "--warmup=0s", f"--window={seconds}s", wait=False)
        # Calls with a deadline shorter than most of them need: they end
        # DEADLINE_EXCEEDED or CANCELLED, dropped before compute where still queued.
        impatient = bench(server.target, "--concurrency=1", "--timeout=8ms", duration,
                          "--warmup=0s", f"--window={seconds}s", wait=False,
                          lengths="256")
        curve = []
        start = time.monotonic()
        while unary.poll() is None:
            curve.append((time.monotonic() - start, server.rss_mib()))
            time.sleep(10)
        results = [result(p) for p in (unary, stream, impatient)]
    finally:
        code = server.stop()
    print("RSS of attnserve (MiB) every 10 s: " +
          " ".join(f"{rss:.0f}" for _, rss in curve))
    after_warmup = [rss for t, rss in curve if t >= 60] or [curve[-1][1]]
    growth = (after_warmup[-1] - after_warmup[0]) / after_warmup[0]
    unintended = {}
    for name, step in zip(("unary", "stream", "impatient"), results):
        allowed = {"DEADLINE_EXCEEDED", "CANCELLED"} if name == "impatient" else set()
        for code_name, count in step["errors"].items():
            if code_name not in allowed:
                unintended[f"{name}:{code_name}"] = count
        print(f"  {name:<9} {step['requests']:>8} OK, errors {step['errors']}, "
              f"p99 {step['latency_ms']['p99']:.2f} ms")
    return all([
        check("unintended errors", sum(unintended.values()), "0", not unintended),
        check("RSS growth after the first minute", f"{growth:+.1%}", "<= +5%",
              growth <= 0.05),
        check("exit code after SIGTERM", code, "0", code == 0),
    ])


if __name__ == "__main__":
    print(f"machine: {cpu_model()}")
    if MODE == "overload":
        passed = overload()
    elif MODE == "soak":
        passed = soak(int(sys.argv[3]) if len(sys.argv) > 3 else 300)
    else:
        raise SystemExit(__doc__)
    sys.exit(0 if passed else 1)
