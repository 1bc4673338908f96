#!/usr/bin/python3
"""`make bench-server`: the server's speed against the core, a Python peer, itself
without batching, its latency floor, and large messages. Not a test: it prints numbers.

Servers are pinned to core 0 with one compute thread and attnbench to core 1, so the
client does not steal the server's core. Every run is bounded (attnbench stops steps
by itself) and talks to 127.0.0.1 only.

usage: server_bench.py BUILD_DIR REPO_ROOT
"""
import json
import os
import re
import subprocess
import sys
import tempfile

BUILD, ROOT = sys.argv[1], sys.argv[2]
ATTNSERVE = os.path.join(BUILD, "server", "attnserve")
ATTNBENCH = os.path.join(BUILD, "client", "attnbench")
CORE_BENCH = os.path.join(BUILD, "tests", "bench", "core_bench")
SERVER_CORE, CLIENT_CORE = "0", "1"
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import stubs  # noqa: E402

TMP = tempfile.TemporaryDirectory()


def torch_env():
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    env["MALLOC_MMAP_THRESHOLD_"] = "67108864"
    env["MALLOC_TRIM_THRESHOLD_"] = "134217728"
    env["OMP_NUM_THREADS"] = "1"
    return env


def start(command, env=None, metrics=False):
    process = subprocess.Popen(["taskset", "-c", SERVER_CORE, *command], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    target = process.stdout.readline().strip().rsplit(" ", 1)[1]
    metrics_port = None
    if metrics:
        metrics_port = process.stdout.readline().strip().rsplit(":", 1)[1]
    return process, target, metrics_port


def attnserve(*flags):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return start([ATTNSERVE, "--host=127.0.0.1", "--port=0", "--metrics_host=127.0.0.1",
                  "--metrics_port=0", "--intra_op_threads=1", *flags], env=env, metrics=True)


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


def core_ms(batch):
    out = subprocess.run(
        ["taskset", "-c", SERVER_CORE, CORE_BENCH, "--benchmark_format=json",
         f"--benchmark_filter=BM_ServerShapes/B:{batch}/", "--benchmark_repetitions=3",
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


def main():
    results = {}
    # 1. Server vs core at saturating concurrency.
    server, target, metrics = attnserve()
    step = bench(target, "--concurrency=32", "--seq_len=128", metrics_port=metrics)[0]
    stop(server)
    batch = step["server"]["mean_batch_size"]
    nearest = min((1, 2, 4, 8, 16, 32), key=lambda b: abs(b - batch))
    core_rps = nearest / (core_ms(nearest) / 1e3)
    print(f"1. server vs core (L=128, d=512, concurrency 32, 1 compute thread):\n"
          f"   server {line(step)}, mean batch {batch:.2f}\n"
          f"   core at B={nearest}: {core_rps:.1f} req/s  ->  ratio "
          f"{step['requests_per_second'] / core_rps:.2f} (target >= 0.85)", flush=True)

    # 2. Server vs the Python peer, same pinning, same client.
    peer = start(["/usr/bin/python3", os.path.join(ROOT, "tests/bench/python_peer_server.py"),
                  ROOT], env=torch_env())
    server, target, metrics = attnserve()
    ours = bench(target, "--concurrency=1,16", "--seq_len=128")
    theirs = bench(peer[1], "--concurrency=1,16", "--seq_len=128", model="torch-peer")
    stop(server)
    stop(peer[0])
    print("2. attnserve vs Python grpcio + torch peer (L=128, 1 core each):")
    for a, b in zip(ours, theirs):
        print(f"   concurrency {a['level']:>4.0f}: attnserve {line(a)} | peer {line(b)} | "
              f"throughput x{a['requests_per_second'] / b['requests_per_second']:.2f}",
              flush=True)

    # 3. Batching gain on short sequences.
    server, target, metrics = attnserve()
    batched = bench(target, "--concurrency=64", "--seq_len=16", metrics_port=metrics)[0]
    stop(server)
    server, target, metrics = attnserve("--max_batch_size=1")
    single = bench(target, "--concurrency=64", "--seq_len=16", metrics_port=metrics)[0]
    stop(server)
    print(f"3. batching gain (L=16, concurrency 64):\n"
          f"   default      {line(batched)}  mean batch {batched['server']['mean_batch_size']:.1f}\n"
          f"   batch size 1 {line(single)}\n"
          f"   gain x{batched['requests_per_second'] / single['requests_per_second']:.2f}"
          " (target >= 3)", flush=True)

    # 4. Latency floor.
    server, target, metrics = attnserve()
    floor = bench(target, "--concurrency=1", "--seq_len=128", metrics_port=metrics)[0]
    stop(server)
    alone = core_ms(1)
    print(f"4. latency floor (concurrency 1, L=128): p50 {floor['latency_ms']['p50']:.2f} ms, "
          f"core alone {alone:.2f} ms, overhead {floor['latency_ms']['p50'] - alone:.2f} ms "
          f"(target <= 0.4); server-side queue {floor['server']['mean_queue_ms']:.3f} ms, "
          f"compute {floor['server']['mean_compute_ms']:.2f} ms", flush=True)

    # 5. Large messages: d=1024, L=2048 (8 MiB each way); transport time = client
    # latency minus the server's own request time.
    repo = os.path.join(TMP.name, "models")
    os.makedirs(os.path.join(repo, "big"))
    with open(os.path.join(repo, "big", "config.pbtxt"), "w") as f:
        f.write("d_model: 1024\nnum_heads: 16\ngenerated_weights: true\nseed: 1\n")
    megabytes = 2 * 2048 * 1024 * 4 / 1e6
    print("5. large messages (L=2048, d=1024: 8.4 MB request + 8.4 MB response):")
    for label, args in (("defaults", ""),
                        ("max_frame_size 16 MiB + 8 MiB BDP-free window",
                         "grpc.http2.max_frame_size=16777215,"
                         "grpc.http2.lookahead_bytes=8388608,grpc.http2.bdp_probe=0")):
        flags = [f"--model_repository={repo}"] + ([f"--grpc_args={args}"] if args else [])
        server, target, metrics = attnserve(*flags)
        client_flags = ["--concurrency=1", "--seq_len=2048", "--max_requests=6",
                        "--window=4s", "--max_duration=12s"]
        if args:
            client_flags.append(f"--grpc_args={args}")
        step = bench(target, *client_flags, metrics_port=metrics, model="big")[0]
        stop(server)
        server_ms = step["server"]["mean_queue_ms"] + step["server"]["mean_compute_ms"]
        transport = step["latency_ms"]["mean"] - server_ms
        print(f"   {label}: client mean {step['latency_ms']['mean']:.1f} ms, server "
              f"{server_ms:.1f} ms, transport {transport:.1f} ms = "
              f"{megabytes / (transport / 1e3):.0f} MB/s", flush=True)


if __name__ == "__main__":
    main()
