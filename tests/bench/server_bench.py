#!/usr/bin/python3
"""`make bench-server`: attnserve against its floors (a raw TCP echo and a bare gRPC echo
of the same bytes, the core alone), a Python grpcio + torch peer, itself without batching,
and large messages; then a table of the server's targets with PASS/FAIL. Not a test: it
prints numbers measured side by side in one run. Medians (p50) unless a row says mean.

Servers are pinned to core 0 with one compute thread and attnbench to core 1, so the
client does not steal the server's core. Every run is bounded (attnbench stops steps
by itself) and talks to 127.0.0.1 only.

usage: server_bench.py BUILD_DIR REPO_ROOT [--grid] [--peers-python=PYTHON]
  --grid: instances x intra-op threads, unpinned, instead (make bench-grid).
  --peers-python: the peers venv's Python (PyPI's PyTorch 2.x and ONNX Runtime): the
    Python server's backends from it join Debian's PyTorch 1.13, and the fastest at
    concurrency 1 on this host is the peer.
"""
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

BUILD, ROOT = sys.argv[1], sys.argv[2]
ATTNSERVE = os.path.join(BUILD, "server", "attnserve")
ATTNBENCH = os.path.join(BUILD, "client", "attnbench")
CORE_BENCH = os.path.join(BUILD, "tests", "bench", "core_bench")
ECHO_BENCH = os.path.join(BUILD, "tests", "bench", "echo_bench")
REQUEST_PATH_BENCH = os.path.join(BUILD, "tests", "bench", "request_path_bench")
KEPT_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "268435456",
               "MALLOC_TOP_PAD_": "16777216"}  # what transport::KeepAllocatorMemory sets
SERVER_CORE, CLIENT_CORE = "0", "1"
PEERS_PYTHON = next((arg.split("=", 1)[1] for arg in sys.argv[3:]
                     if arg.startswith("--peers-python=")), None)
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_info  # noqa: E402
import perf_analyzer_run  # noqa: E402
import stubs  # noqa: E402

TMP = tempfile.TemporaryDirectory()


def torch_env():
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    env.update(KEPT_MALLOC)
    env["OMP_NUM_THREADS"] = "1"
    return env


def start(command, env=None, metrics=False):
    """(process, target, metrics port, the first line it printed)."""
    process = subprocess.Popen(["taskset", "-c", SERVER_CORE, *command], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    banner = process.stdout.readline().strip()
    target = banner.rsplit(" ", 1)[1]
    metrics_port = None
    if metrics:
        metrics_port = process.stdout.readline().strip().rsplit(":", 1)[1]
    return process, target, metrics_port, banner


def attnserve(*flags):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return start([ATTNSERVE, "--host=127.0.0.1", "--port=0", "--metrics_host=127.0.0.1",
                  "--metrics_port=0", "--http_port=-1", "--instances=1", "--intra_op_threads=1", *flags], env=env, metrics=True)[:3]


def stop(process):
    process.terminate()
    process.wait(timeout=60)


def bench(target, *flags, metrics_port=None, model=""):
    out = os.path.join(TMP.name, "run.json")
    command = ["taskset", "-c", CLIENT_CORE, ATTNBENCH, f"--target={target}",
               f"--json={out}", "--warmup=1s", "--window=2s", "--max_duration=14s", *flags]
    if metrics_port:
        command.append(f"--metrics_url=http://127.0.0.1:{metrics_port}/metrics")
    if model:
        command.append(f"--model={model}")
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    return json.load(open(out))["steps"]


def python_peer(python, backend):
    """(process, target, what it runs) of python_peer_server.py on `backend`, run by
    `python`; the last is read from its "python peer NAME listening on ..." line."""
    process, target, _, banner = start(
        [python, os.path.join(ROOT, "tests/bench/python_peer_server.py"), ROOT,
         f"--backend={backend}"], env=torch_env())
    return process, target, banner[len("python peer "):banner.index(" listening on")]


def mean_steps(runs):
    """attnbench's steps of several runs of the same levels, as one run: the mean of
    each level's req/s, p50 and p99 (what line() and the rows below read)."""
    merged = []
    for steps in zip(*runs):
        merged.append({
            "level": steps[0]["level"],
            "requests_per_second": sum(s["requests_per_second"] for s in steps) / len(steps),
            "latency_ms": {q: sum(s["latency_ms"][q] for s in steps) / len(steps)
                           for q in ("p50", "p99")}})
    return merged


def fastest_python_peer():
    """Every Python peer backend this host has, timed at c1; the fastest one is
    returned as (python, backend, its name), stopped."""
    candidates = [("/usr/bin/python3", "torch-mha")]
    if PEERS_PYTHON:
        candidates += [(PEERS_PYTHON, backend) for backend in ("torch-mha", "torch-sdpa", "ort")]
    print("4a. Python peers at concurrency 1, L=128 (the fastest is the peer below):")
    best = None
    for python, backend in candidates:
        process, target, name = python_peer(python, backend)
        step = bench(target, "--concurrency=1", "--seq_len=128", model="torch-peer")[0]
        print(f"   {name:<40} {line(step)}", flush=True)
        stop(process)
        if best is None or step["requests_per_second"] > best[0]:
            best = (step["requests_per_second"], python, backend, name)
    print(f"   the peer: {best[3]}", flush=True)
    return best[1:]


def make_certificates():
    """A CA and a server certificate for 127.0.0.1 in TMP; returns (ca, cert, key)."""
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=TMP.name, check=True, capture_output=True,
                       timeout=60)
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
            "-subj", "/CN=bench-ca")
    openssl("req", *curve, "-keyout", "server.key", "-out", "server.csr", "-subj",
            "/CN=127.0.0.1")
    with open(os.path.join(TMP.name, "san.ext"), "w") as ext:
        ext.write("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "san.ext")
    return tuple(os.path.join(TMP.name, name) for name in ("ca.pem", "server.pem", "server.key"))


# Where perf's samples of a process fall, by shared object: compute is oneDNN (its JIT
# kernels appear as "[JIT] tid N"), the kernel is TCP and scheduling.
PROFILE_GROUPS = (("compute (oneDNN)", ("[JIT]", "libdnnl")), ("kernel", ("[kernel",)),
                  ("libc (memcpy, malloc)", ("libc.so",)),
                  ("gRPC", ("libgrpc", "libgpr", "libaddress_sorting", "libupb", "libssl",
                            "libcrypto")),
                  ("protobuf", ("libprotobuf",)),
                  ("attnserve, Abseil, libstdc++", ("attnserve", "libabsl", "libstdc++")))


def profile(pid, seconds, out):
    """Fills `out` with perf's CPU samples of `pid` over `seconds`, as {group: percent};
    leaves it empty where perf cannot record here."""
    data = os.path.join(TMP.name, "perf.data")
    record = subprocess.run(["perf", "record", "-F", "999", "-p", str(pid), "-o", data,
                             "--", "sleep", str(seconds)], capture_output=True, text=True)
    if record.returncode != 0:
        return
    report = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso",
                             "-g", "none", "--stdio"], capture_output=True, text=True).stdout
    groups = {name: 0.0 for name, _ in PROFILE_GROUPS}
    groups["other"] = 0.0
    for entry in report.splitlines():
        fields = entry.split(None, 1)
        if len(fields) != 2 or not fields[0].endswith("%") or entry.startswith("#"):
            continue
        share = float(fields[0].rstrip("%"))
        name = next((group for group, prefixes in PROFILE_GROUPS
                     if any(fields[1].strip().startswith(p) for p in prefixes)), "other")
        groups[name] += share
    out.update(groups)


@functools.lru_cache(maxsize=None)
def core_ms(batch, length=128):
    out = subprocess.run(
        ["taskset", "-c", SERVER_CORE, CORE_BENCH, "--benchmark_format=json",
         f"--benchmark_filter=BM_ServerShapes/B:{batch}/L:{length}/", "--benchmark_repetitions=3",
         "--benchmark_report_aggregates_only=true"],
        check=True, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=600).stdout
    for entry in json.loads(out)["benchmarks"]:
        if entry["name"].endswith("_median"):
            return entry["real_time"]
    raise RuntimeError("no median in core_bench output")


def line(step):
    lat = step["latency_ms"]
    return (f"{step['requests_per_second']:8.1f} req/s  p50 {lat['p50']:7.2f} ms  "
            f"p99 {lat['p99']:7.2f} ms")


def cpu_ms(process):
    """CPU time (user + system) the process has used so far, in ms."""
    with open(f"/proc/{process.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def echo(kind, size, tuned=True, work_ms=0, concurrency=1):
    """One echo of `size` bytes each way, server on core 0: p50/p99/mean ms, or with
    concurrency > 1 (gRPC) the echoes per second one server core answers and the
    server's CPU ms per echo. With work_ms the server answers from a worker thread after
    that much busy work."""
    flags = ([] if tuned else ["--tuned=false"]) + ([f"--work_ms={work_ms}"] if work_ms else [])
    server = subprocess.Popen(["taskset", "-c", SERVER_CORE, ECHO_BENCH,
                               f"--mode={kind}_server", *flags],
                              stdout=subprocess.PIPE, text=True)
    port = server.stdout.readline().split()[-1]
    try:
        out = subprocess.run(["taskset", "-c", CLIENT_CORE, ECHO_BENCH,
                              f"--mode={kind}_client", f"--port={port}", f"--bytes={size}",
                              "--seconds=3", f"--concurrency={concurrency}", *flags],
                             check=True, capture_output=True, text=True, timeout=120).stdout
        result = json.loads(out)
        if "all_calls" in result:
            result["server_cpu_ms_per_call"] = cpu_ms(server) / result["all_calls"]
    finally:
        stop(server)
    return result


PYTHON_CLIENT = """
import sys, time
sys.path.insert(0, sys.argv[2])
import grpc, numpy as np, stubs
keep = stubs.generate_stubs(sys.argv[2].rsplit("/tests/", 1)[0])
from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2
channel = grpc.insecure_channel(sys.argv[1], options=[
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.experimental.tcp_read_chunk_size", 1 << 20)])
stub = attention_pb2_grpc.AttentionServiceStub(channel)
query = np.random.default_rng(0).standard_normal((128, 512), dtype=np.float32)
request = attention_pb2.AttendRequest(query=tensor_pb2.Tensor(
    dtype=tensor_pb2.DATA_TYPE_FP32, shape=[128, 512], raw=query.tobytes()))
times = []
end = time.monotonic() + 4
while time.monotonic() < end:
    start = time.perf_counter()
    stub.Attend(request, timeout=30)
    times.append((time.perf_counter() - start) * 1e3)
times = sorted(times[len(times) // 5:])
print(times[len(times) // 2])
"""


def python_client_p50(target):
    env = dict(os.environ, **KEPT_MALLOC)
    out = subprocess.run(["taskset", "-c", CLIENT_CORE, "/usr/bin/python3", "-c",
                          PYTHON_CLIENT, target, os.path.join(ROOT, "tests", "e2e")],
                         check=True, capture_output=True, text=True, env=env, timeout=120)
    return float(out.stdout.strip().splitlines()[-1])


def rss_mib(process):
    """The server's peak resident set (VmHWM) in MiB."""
    with open(f"/proc/{process.pid}/status") as f:
        for entry in f:
            if entry.startswith("VmHWM:"):
                return int(entry.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def isa():
    return host_info.cpu_description()


def main():
    rows = []  # (measure, figure, target, passed)
    print(f"CPU: {isa()}; server on core {SERVER_CORE}, client on core {CLIENT_CORE}",
          flush=True)

    # 0. Floors: the same 256 KiB each way over a raw socket and over bare gRPC.
    kib256 = 128 * 512 * 4
    tcp = echo("tcp", kib256)
    grpc_default = echo("grpc", kib256, tuned=False)
    grpc_tuned = echo("grpc", kib256)
    print(f"0. echo of 256 KiB each way (p50 / p99):\n"
          f"   raw TCP socket            {tcp['p50_ms']:.3f} / {tcp['p99_ms']:.3f} ms\n"
          f"   gRPC, gRPC+glibc defaults {grpc_default['p50_ms']:.3f} / "
          f"{grpc_default['p99_ms']:.3f} ms\n"
          f"   gRPC, attnserve transport {grpc_tuned['p50_ms']:.3f} / "
          f"{grpc_tuned['p99_ms']:.3f} ms", flush=True)

    # 1. Latency floor at concurrency 1: where each millisecond goes.
    server, target, metrics = attnserve()
    floor = bench(target, "--concurrency=1", "--seq_len=128", metrics_port=metrics)[0]
    python_p50 = python_client_p50(target)
    stop(server)
    alone = core_ms(1)
    # The same echo, answered the way attnserve answers: queued to a worker thread that
    # is busy for the core's time, then replies. This is gRPC's cost with a server that
    # thinks before it answers.
    thinking = echo("grpc", kib256, work_ms=round(alone, 3))
    p50 = floor["latency_ms"]["p50"]
    in_server = floor["server"]["mean_queue_ms"] + floor["server"]["mean_compute_ms"]
    print(f"1. concurrency 1, L=128, d=512 fp32 (256 KiB each way):\n"
          f"   attnbench p50 {p50:.2f} ms = core alone {alone:.2f} + gRPC echo "
          f"{grpc_tuned['p50_ms']:.2f} + serving {p50 - alone - grpc_tuned['p50_ms']:.2f} ms\n"
          f"   server-side: queue {floor['server']['mean_queue_ms']:.3f} ms, compute "
          f"{floor['server']['mean_compute_ms']:.2f} ms (mean)\n"
          f"   gRPC echo answered from a worker after {alone:.2f} ms of busy work: p50 "
          f"{thinking['p50_ms']:.2f} ms (gRPC beyond the work: "
          f"{thinking['p50_ms'] - alone:.2f} ms)\n"
          f"   Python grpcio client p50 {python_p50:.2f} ms "
          f"(overhead beyond core {python_p50 - alone:.2f} ms)", flush=True)
    rows.append(("p50 at c1, L=128", f"{p50:.2f} ms",
                 f"<= echo {grpc_tuned['p50_ms']:.2f} + core {alone:.2f} + 0.15 ms",
                 p50 <= grpc_tuned["p50_ms"] + alone + 0.15))
    rows.append(("p50 at c1 vs the thinking echo", f"{p50:.2f} ms",
                 f"<= thinking echo {thinking['p50_ms']:.2f} + 0.15 ms (attribution)",
                 p50 <= thinking["p50_ms"] + 0.15))
    rows.append(("overhead beyond compute at c1", f"{p50 - in_server:.2f} ms", "<= 0.5 ms",
                 p50 - in_server <= 0.5))

    # 2. Server vs core at saturating concurrency; RSS under load.
    server, target, metrics = attnserve("--max_queue_bytes=33554432")
    step = bench(target, "--concurrency=32", "--seq_len=128", metrics_port=metrics)[0]
    stop(server)
    batch = step["server"]["mean_batch_size"]
    nearest = min((1, 2, 4, 8, 16, 32), key=lambda b: abs(b - batch))
    core_rps = nearest / (core_ms(nearest) / 1e3)
    ratio = step["requests_per_second"] / core_rps
    # What one core must spend per call besides compute: the server's CPU per request
    # beyond the compute it reported, beside a bare gRPC echo's CPU per call of the same
    # bytes (an estimate of gRPC's share: attnserve's batches may amortise some of it).
    core_per_request = 1e3 / core_rps
    beyond = (1e3 / step["requests_per_second"]
              - step["server"]["mean_compute_ms"] / batch)
    echo_cpu = echo("grpc", kib256, concurrency=32)["server_cpu_ms_per_call"]
    bound = core_per_request / (core_per_request + echo_cpu)
    print(f"2. server vs core (L=128, concurrency 32, 1 compute thread):\n"
          f"   server {line(step)}, mean batch {batch:.2f}\n"
          f"   core at B={nearest}: {core_rps:.1f} req/s  ->  ratio {ratio:.2f}\n"
          f"   per request on the server core: compute {core_per_request:.2f} ms (core "
          f"alone), everything else {beyond:.2f} ms; a bare gRPC echo of 256 KiB at c32 "
          f"uses {echo_cpu:.2f} ms of server CPU per call: with only that beyond compute, the "
          f"ratio would be about x{bound:.3f}", flush=True)
    # The same load again with perf sampling the server core for 5 s (sampling slows
    # it, so this run is not the one measured above).
    server, target, metrics = attnserve("--max_queue_bytes=33554432")
    shares = {}
    sampler = threading.Timer(2.0, profile, (server.pid, 5, shares)) if shutil.which("perf") \
        else None
    if sampler:
        sampler.start()
        bench(target, "--concurrency=32", "--seq_len=128", "--max_duration=8s")
        sampler.join()
    stop(server)
    if shares:
        print("   where the server core's time goes under this load (perf, a second run): "
              + ", ".join(f"{name} {share:.1f}%" for name, share in shares.items()),
              flush=True)
    else:
        print("   (no perf profile: perf is missing or cannot record here)", flush=True)
    rows.append(("saturated c32 L=128 vs core alone",
                 f"x{ratio:.2f} (compute + echo CPU: x{bound:.2f})", ">= 0.95",
                 ratio >= 0.95))

    # 2b. Answering off the compute thread (--answer_threads=1) against on it, same core.
    steps = {}
    for threads in (0, 1):
        server, target, metrics = attnserve(f"--answer_threads={threads}")
        steps[threads] = bench(target, "--concurrency=1,32", "--seq_len=128")
        stop(server)
    print("2b. responses built and sent by an answer thread (--answer_threads=1) vs by the "
          "compute thread (0), L=128, one core:")
    for worker, handed_off in zip(steps[0], steps[1]):
        gain = handed_off["requests_per_second"] / worker["requests_per_second"]
        print(f"   concurrency {worker['level']:>4.0f}: on the compute thread {line(worker)} | "
              f"answer thread {line(handed_off)} | x{gain:.2f}", flush=True)

    # 3. Batching gain on short sequences, and RSS under c64 with a 32 MiB queue budget.
    server, target, metrics = attnserve("--max_queue_bytes=33554432")
    batched = bench(target, "--concurrency=64", "--seq_len=16", metrics_port=metrics)[0]
    rss = rss_mib(server)
    stop(server)
    server, target, metrics = attnserve("--max_batch_size=1")
    single = bench(target, "--concurrency=64", "--seq_len=16", metrics_port=metrics)[0]
    stop(server)
    gain = batched["requests_per_second"] / single["requests_per_second"]
    core_gain = 32 * core_ms(1, 16) / core_ms(32, 16)
    echo_rps = echo("grpc", 16 * 512 * 4, concurrency=64)["per_second"]
    print(f"3. batching gain (L=16, concurrency 64):\n"
          f"   default      {line(batched)}  mean batch {batched['server']['mean_batch_size']:.1f}"
          f"\n   batch size 1 {line(single)}\n   gain x{gain:.2f}; the core alone gains "
          f"x{core_gain:.2f} from B=1 to B=32 (the ceiling); a bare gRPC echo of the same "
          f"32 KiB at concurrency 64 answers {echo_rps:.0f}/s on one core\n"
          f"   server peak RSS {rss:.0f} MiB", flush=True)
    rows.append(("batching gain L=16 c64 vs batch 1", f"x{gain:.2f} (core alone x{core_gain:.2f})",
                 ">= 3", gain >= 3))
    weights_mib = (4 * 512 * 512 + 4 * 512) * 4 / 2**20
    budget = weights_mib + 32 + 64
    rows.append(("server peak RSS under c64 (32 MiB queue)", f"{rss:.0f} MiB",
                 f"<= weights {weights_mib:.0f} + queue 32 + 64 MiB", rss <= budget))

    # 4. Server vs the Python peer, same pinning, same client, same allocator settings.
    # The peer is the fastest at c1 of the backends users deploy (python_peer_server.py).
    # Alternating attnserve, peer, attnserve, peer, and the mean of each side's two runs,
    # so that drift in this shared host's speed falls on both.
    peer_python, peer_backend, peer_name = fastest_python_peer()
    ours_runs, theirs_runs = [], []
    for _ in range(2):
        server, target, metrics = attnserve()
        ours_runs.append(bench(target, "--concurrency=1,16", "--seq_len=128"))
        stop(server)
        peer_process, peer_target, _ = python_peer(peer_python, peer_backend)
        theirs_runs.append(bench(peer_target, "--concurrency=1,16", "--seq_len=128",
                                 model="torch-peer"))
        stop(peer_process)
    ours, theirs = mean_steps(ours_runs), mean_steps(theirs_runs)
    # bf16 where the CPU runs it (its own end-to-end target); the peer stays fp32
    # torch, the client sends fp32 as before.
    ours_bf16 = None
    if "avx512_bf16" in isa() or "amx_tile" in isa():
        server, target, metrics = attnserve("--precision=bf16")
        ours_bf16 = bench(target, "--concurrency=1,16", "--seq_len=128")
        stop(server)
    print(f"4. attnserve vs the Python grpcio peer around {peer_name} (L=128, 1 core each; "
          f"mean of 2 alternating runs each):")
    for a, b in zip(ours, theirs):
        print(f"   concurrency {a['level']:>4.0f}: attnserve {line(a)} | peer {line(b)} | "
              f"throughput x{a['requests_per_second'] / b['requests_per_second']:.2f}",
              flush=True)
    c1_ratio = ours[0]["requests_per_second"] / theirs[0]["requests_per_second"]
    # What a server costing only the thinking echo of row 1 (gRPC answered from a worker
    # after the core's time) would reach against the same peer at c1: one call at a time,
    # so each side's time per call is 1 / its rate.
    peer_c1_ms = 1e3 / theirs[0]["requests_per_second"]
    c1_bound = peer_c1_ms / thinking["mean_ms"]
    print(f"   at c1 the peer takes {peer_c1_ms:.2f} ms per call and the thinking echo "
          f"{thinking['mean_ms']:.2f} (mean): a server costing only the core and gRPC would "
          f"be x{c1_bound:.2f} the peer", flush=True)
    rows.append(("vs Python peer at c1", f"x{c1_ratio:.2f} (core + gRPC only: x{c1_bound:.2f})",
                 ">= 1.3x", c1_ratio >= 1.3))
    a, b = ours[-1], theirs[-1]
    peer_ratio = a["requests_per_second"] / b["requests_per_second"]
    # What a server costing only the core (batches of 16 at c16), or the core plus a
    # bare gRPC echo's CPU per call (row 2), would reach against the same peer.
    peer_ms = 1e3 / b["requests_per_second"]
    peer_bound = peer_ms / (core_ms(16) / 16)
    peer_grpc_bound = peer_ms / (core_ms(16) / 16 + echo_cpu)
    print(f"   at c16 the peer takes {peer_ms:.2f} ms per request and the core alone "
          f"{core_ms(16) / 16:.2f} at B=16: a server costing only the core would be "
          f"x{peer_bound:.2f} the peer, one costing the core plus gRPC's echo CPU "
          f"({echo_cpu:.2f} ms) x{peer_grpc_bound:.2f}", flush=True)
    rows.append(("vs Python peer at c16", f"x{peer_ratio:.2f}, p99 {a['latency_ms']['p99']:.1f}"
                 f" vs {b['latency_ms']['p99']:.1f} ms (core only: x{peer_bound:.2f}, core + echo"
                 f" CPU: x{peer_grpc_bound:.2f})",
                 ">= 1.5x, lower p99",
                 peer_ratio >= 1.5 and a["latency_ms"]["p99"] < b["latency_ms"]["p99"]))
    if ours_bf16 is None:
        print("   bf16: not measured (no AVX512_BF16 or AMX on this CPU)")
    else:
        for a, b in zip(ours_bf16, theirs):
            print(f"   concurrency {a['level']:>4.0f}: attnserve --precision=bf16 {line(a)} | "
                  f"throughput x{a['requests_per_second'] / b['requests_per_second']:.2f} "
                  f"the peer", flush=True)
        a = ours_bf16[-1]
        bf16_ratio = a["requests_per_second"] / b["requests_per_second"]
        rows.append(("bf16 vs Python peer (fp32) at c16", f"x{bf16_ratio:.2f}", ">= 3x",
                     bf16_ratio >= 3))

    # 4b. TLS against plaintext: the same server and load over TLS (certificates made
    # here with openssl), p50 at c1 and throughput at c16.
    ca, cert, key = make_certificates()
    server, target, metrics = attnserve(f"--tls_cert={cert}", f"--tls_key={key}")
    secure = bench(target, "--concurrency=1,16", "--seq_len=128", f"--tls_ca={ca}")
    stop(server)
    print("4b. TLS (gRPC's own credentials, ECDSA P-256) vs plaintext, L=128:")
    for plain, tls in zip(ours, secure):
        print(f"   concurrency {plain['level']:>4.0f}: plaintext {line(plain)} | TLS {line(tls)}"
              f" | p50 +{tls['latency_ms']['p50'] - plain['latency_ms']['p50']:.2f} ms, "
              f"throughput x{tls['requests_per_second'] / plain['requests_per_second']:.2f}",
              flush=True)

    # 4c. Triton's perf_analyzer through the KServe v2 front door, beside attnbench's
    # figures from 4 (same server flags; perf_analyzer's requests are cross-attention
    # over 128 + 128 tokens, twice attnbench's request bytes).
    server, target, metrics = attnserve()
    perf = perf_analyzer_run.run(BUILD, CLIENT_CORE, "grpc", target, "1:16:15", 100,
                                 TMP.name)
    stop(server)
    print("4c. Triton's perf_analyzer (KServe v2 gRPC, query + memory [128, 512]) beside "
          "attnbench (attnserve API, query [128, 512]):")
    # perf_analyzer orders its CSV rows by throughput, not by concurrency.
    by_level = {int(row["Concurrency"]): row for row in perf}
    for a in ours:
        row = by_level[int(a["level"])]
        print(f"   concurrency {a['level']:>4.0f}: attnbench {line(a)} | perf_analyzer "
              f"{float(row['Inferences/Second']):8.1f} req/s  p50 "
              f"{int(row['p50 latency']) / 1e3:7.2f} ms  p99 {int(row['p99 latency']) / 1e3:7.2f} ms",
              flush=True)

    # 4d. The design choice --compute_first against the default (every thread under
    # SCHED_OTHER): fresh servers, alternating default, on, default, on, so that drift
    # in this shared host's speed falls on both; the mean of each pair of runs.
    runs = {"default": [], "on": []}
    for _ in range(2):
        for arm, flags in (("default", ()), ("on", ("--compute_first",))):
            server, target, metrics = attnserve(*flags)
            runs[arm].append(bench(target, "--concurrency=1,16", "--seq_len=128"))
            stop(server)
    print("4d. --compute_first (I/O threads SCHED_BATCH, compute SCHED_OTHER) vs the default "
          "(all SCHED_OTHER), L=128, mean of 2 alternating runs each:")
    for on, off in zip(mean_steps(runs["on"]), mean_steps(runs["default"])):
        on_rps, off_rps = on["requests_per_second"], off["requests_per_second"]
        on_p99, off_p99 = on["latency_ms"]["p99"], off["latency_ms"]["p99"]
        print(f"   concurrency {on['level']:>4.0f}: on {on_rps:8.1f} req/s  "
              f"p99 {on_p99:7.2f} ms | default {off_rps:8.1f} req/s  p99 {off_p99:7.2f} ms | "
              f"throughput x{on_rps / off_rps:.2f}, p99 x{on_p99 / off_p99:.2f}", flush=True)

    # 5. Large messages: d=1024, L=2048 (8 MiB each way). Transport time = client mean
    # minus the server's own request time; the echo shows the floor for the same bytes.
    mib8 = 2048 * 1024 * 4
    big_tcp, big_echo = echo("tcp", mib8), echo("grpc", mib8)
    repo = os.path.join(TMP.name, "models")
    os.makedirs(os.path.join(repo, "big"))
    with open(os.path.join(repo, "big", "config.pbtxt"), "w") as f:
        f.write("d_model: 1024\nnum_heads: 16\ngenerated_weights: true\nseed: 1\n")
    server, target, metrics = attnserve(f"--model_repository={repo}")
    step = bench(target, "--concurrency=1", "--seq_len=2048", "--max_requests=6", "--window=4s",
                 "--max_duration=12s", metrics_port=metrics, model="big")[0]
    stop(server)
    server_ms = step["server"]["mean_queue_ms"] + step["server"]["mean_compute_ms"]
    transport = step["latency_ms"]["mean"] - server_ms
    each_way = mib8 / (transport / 2 / 1e3) / 1e9
    print(f"5. large messages (L=2048, d=1024: 8 MiB request + 8 MiB response):\n"
          f"   raw TCP echo {big_tcp['p50_ms']:.1f} ms, gRPC echo {big_echo['p50_ms']:.1f} ms"
          f" ({mib8 / (big_echo['p50_ms'] / 2 / 1e3) / 1e9:.2f} GB/s each way)\n"
          f"   attnserve: client mean {step['latency_ms']['mean']:.1f} ms, server "
          f"{server_ms:.1f} ms, transport {transport:.1f} ms = {each_way:.2f} GB/s each way",
          flush=True)
    rows.append(("8 MiB request + 8 MiB response", f"{each_way:.2f} GB/s each way",
                 ">= 1 GB/s", each_way >= 1.0))

    # 6. Heap allocations per request (every malloc in the process, L=16).
    out = subprocess.run([REQUEST_PATH_BENCH, "--benchmark_format=json"], check=True,
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1")).stdout
    allocs = {b["name"].split("/")[0]: b["allocs_per_request"]
              for b in json.loads(out)["benchmarks"]}
    print(f"6. heap allocations per request (L=16): core Forward {allocs['BM_CoreForward']:.0f}"
          f", + serving (validate, queue, batch, respond) "
          f"{allocs['BM_ServicePath'] - allocs['BM_CoreForward']:.0f}, + gRPC at both ends "
          f"{allocs['BM_GrpcCall'] - allocs['BM_ServicePath']:.0f}", flush=True)

    print("\ntargets, one run:")
    width = max(len(r[0]) for r in rows)
    for measure, figure, target_text, passed in rows:
        print(f"  {measure:<{width}}  {figure:<28} target {target_text:<36} "
              f"{'PASS' if passed else 'FAIL'}")


def grid():
    """Instances x intra-op threads on this whole machine: server and attnbench unpinned,
    sharing every core, as a small deployment runs them."""
    cores = os.cpu_count()
    print(f"CPU: {isa()}; {cores} cores; server and client unpinned", flush=True)
    print(f"{'instances':>9} {'threads':>7} | {'c1 p50 ms':>9} {'c1 req/s':>8} | "
          f"{'c32 req/s':>9} {'c32 p99 ms':>10} {'batch':>5}")
    for instances in (1, 2):
        for threads in (1, 2):
            env = dict(os.environ)
            env.pop("OMP_NUM_THREADS", None)
            server = subprocess.Popen(
                [ATTNSERVE, "--host=127.0.0.1", "--port=0", "--metrics_host=127.0.0.1",
                 "--metrics_port=0", "--http_port=-1", f"--instances={instances}",
                 f"--intra_op_threads={threads}"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            target = server.stdout.readline().strip().rsplit(" ", 1)[1]
            metrics = server.stdout.readline().strip().rsplit(":", 1)[1]
            out = os.path.join(TMP.name, "grid.json")
            subprocess.run([ATTNBENCH, f"--target={target}", "--concurrency=1,32",
                            "--seq_len=128", f"--json={out}", "--warmup=1s", "--window=2s",
                            "--max_duration=10s",
                            f"--metrics_url=http://127.0.0.1:{metrics}/metrics"],
                           check=True, capture_output=True, text=True, timeout=300)
            stop(server)
            one, many = json.load(open(out))["steps"]
            print(f"{instances:>9} {threads:>7} | {one['latency_ms']['p50']:>9.2f} "
                  f"{one['requests_per_second']:>8.1f} | {many['requests_per_second']:>9.1f} "
                  f"{many['latency_ms']['p99']:>10.1f} "
                  f"{many['server']['mean_batch_size']:>5.1f}", flush=True)


if __name__ == "__main__":
    if "--grid" in sys.argv[3:]:
        grid()
    else:
        main()
