#!/usr/bin/env python3
"""Rerank rows of `make bench-encoder`: one query with 32 documents per request, scored by
a MiniLM-shaped cross-encoder, on attnserve beside the libraries a user would serve it
with: sentence-transformers' CrossEncoder.predict on PyPI's PyTorch 2.x, and ONNX Runtime
on the same checkpoint exported with graph optimizations on (tokenized by Hugging Face's
`tokenizers`, as its users do). Prints the CPU and versions, one table of medians with
each target beside its figure.

The checkpoint: all-MiniLM-L6-v2's encoder (6 layers, d=384, 12 heads: the shape of
cross-encoder/ms-marco-MiniLM-L-6-v2, which no package ships) loaded by transformers as
BertForSequenceClassification with one label, its head drawn from seed 0, saved with
save_pretrained beside its tokenizer. Queries and documents are the real sentences of
tests/data/sentences.en.txt (a query is a sentence's first 8 words). Before timing, the
server's scores are checked against CrossEncoder.predict on the same pairs.

The peers run in this process on core 0 with one thread, one request (32 pairs) at a
time, tokenizing included; attnserve serves on core 0 with one compute thread, and a
closed-loop load generator on core 1 posts Cohere-shaped bodies to /v1/rerank at
concurrency 1 and 16. When build/servers-venv exists (`make bench-servers` makes it),
infinity-emb serves the same folder with its torch engine on the same core, driven the
same way through its /rerank (its body is Cohere's too), checked against
CrossEncoder.predict first. A server that calls a library peer as its users do could
only be slower than the library alone, so those ratios are against the library's best
case; at concurrency 16 such a server would answer one request at a time, so its p99
there is at least 16 of the library's median request times (printed as its bound).
Rounds alternate the arms.

usage (the Makefile runs it): build/peers-venv/bin/python tests/bench/rerank_bench.py
       BUILD_DIR REPO_ROOT [--rounds 2] [--seconds 6]
"""
import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import host_info  # noqa: E402
from encoder_bench import model_dir  # noqa: E402

ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "268435456",
             "MALLOC_TOP_PAD_": "16777216"}
SERVER_CORE, CLIENT_CORE = 0, 1
DOCUMENTS = 32
TARGET_C16 = 1.5


def make_cross_encoder(root, work):
    """The MiniLM-shaped cross-encoder's folder (made once), as a repository model."""
    import torch
    import transformers
    repository = os.path.join(work, "repository")
    folder = os.path.join(repository, "reranker")
    if not os.path.exists(os.path.join(folder, "model.safetensors")):
        source = model_dir(root)
        torch.manual_seed(0)
        model = transformers.BertForSequenceClassification.from_pretrained(
            source, num_labels=1)
        model.save_pretrained(folder)
        transformers.AutoTokenizer.from_pretrained(source).save_pretrained(folder)
        with open(os.path.join(folder, "config.pbtxt"), "w") as f:
            f.write("encoder {}\n")
    return repository, folder


def requests_from(root):
    with open(os.path.join(root, "tests", "data", "sentences.en.txt"), encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    out = []
    for i in range(0, len(sentences) - DOCUMENTS, DOCUMENTS):
        out.append((" ".join(sentences[i].split()[:8]), sentences[i + 1:i + 1 + DOCUMENTS]))
    return out


def export_onnx(folder, out):
    import torch
    import transformers
    if os.path.exists(out):
        return
    model = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    ids = torch.ones((2, 16), dtype=torch.int64)
    axes = {0: "n", 1: "L"}
    torch.onnx.export(model, (ids, torch.ones_like(ids), torch.zeros_like(ids)), out,
                      input_names=["input_ids", "attention_mask", "token_type_ids"],
                      output_names=["logits"],
                      dynamic_axes={"input_ids": axes, "attention_mask": axes,
                                    "token_type_ids": axes, "logits": {0: "n"}},
                      opset_version=17, dynamo=False)


def peer_latencies(name, folder, onnx_path, requests, seconds):
    """Seconds per request of one peer, one request at a time on one core and thread."""
    os.sched_setaffinity(0, {SERVER_CORE})
    import torch
    torch.set_num_threads(1)
    if name == "torch":
        from sentence_transformers import CrossEncoder
        model = CrossEncoder(folder, device="cpu")

        def score(query, documents):
            return model.predict([(query, d) for d in documents], batch_size=DOCUMENTS)
    else:
        import onnxruntime
        import transformers
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = onnxruntime.InferenceSession(onnx_path, options,
                                               providers=["CPUExecutionProvider"])
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)

        def score(query, documents):
            batch = tokenizer([query] * len(documents), documents, padding=True,
                              truncation=True, return_tensors="np")
            logits = session.run(None, {k: batch[k].astype(np.int64) for k in
                                        ("input_ids", "attention_mask", "token_type_ids")})[0]
            return 1.0 / (1.0 + np.exp(-logits[:, 0]))
    score(*requests[0])  # warm-up
    latencies, end, i = [], time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        start = time.perf_counter()
        score(*requests[i % len(requests)])
        latencies.append(time.perf_counter() - start)
        i += 1
    return latencies


def wait_ready(process, url, log, name):
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            sys.exit(f"{name} exited: {log.read()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    sys.exit(f"{name} did not become ready")


def start_infinity(servers_python, folder, port):
    """infinity-emb's torch engine serving the folder on the server core, one thread."""
    log = tempfile.TemporaryFile("w+")
    infinity = os.path.join(os.path.dirname(servers_python), "infinity_emb")
    threads = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                      "OPENBLAS_NUM_THREADS")}
    process = subprocess.Popen(
        ["taskset", "-c", str(SERVER_CORE), infinity, "v2", "--model-id", folder,
         "--engine", "torch", "--device", "cpu", "--served-model-name", "reranker",
         "--port", str(port), "--host", "127.0.0.1", "--no-bettertransformer"],
        stdout=log, stderr=subprocess.STDOUT,
        env=dict(os.environ, INFINITY_ANONYMOUS_USAGE_STATS="0", **threads, **ALLOCATOR))
    return wait_ready(process, f"http://127.0.0.1:{port}/health", log, "infinity-emb")


def start_server(build, repository, port):
    log = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(
        ["taskset", "-c", str(SERVER_CORE), os.path.join(build, "server", "attnserve"),
         "--host=127.0.0.1", "--port=0", "--metrics_port=-1", f"--http_port={port}",
         f"--model_repository={repository}", "--default_model=reranker", "--instances=1",
         "--intra_op_threads=1"],
        stdout=subprocess.DEVNULL, stderr=log, env=dict(os.environ, OMP_NUM_THREADS="1",
                                                        **ALLOCATOR))
    return wait_ready(process, f"http://127.0.0.1:{port}/v2/health/ready", log, "attnserve")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rerank(port, query, documents, path="/v1/rerank"):
    body = json.dumps({"model": "reranker", "query": query, "documents": documents}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        results = json.loads(reply.read())["results"]
    scores = np.zeros(len(documents))
    for result in results:
        scores[result["index"]] = result["relevance_score"]
    return scores


async def closed_loop(port, path, requests, concurrency, warmup, seconds):
    """The requests answered inside the window after the warm-up, and the latencies (s)
    of those of them that also started inside it."""
    bodies = [json.dumps({"model": "reranker", "query": q, "documents": d}).encode()
              for q, d in requests]
    start = time.monotonic()
    begin, end = start + warmup, start + warmup + seconds
    latencies, answered, counter = [], [0], [0]

    async def worker():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while True:
            body = bodies[counter[0] % len(bodies)]
            counter[0] += 1
            sent = time.monotonic()
            if sent >= end:
                break
            writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                         + body)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
            payload = await reader.readexactly(length)
            if b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
                raise RuntimeError(f"{head[:60]!r} {payload[:200]!r}")
            done = time.monotonic()
            if begin <= done <= end:
                answered[0] += 1
                if sent >= begin:
                    latencies.append(done - sent)
        writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"answered": answered[0], "latencies": latencies}


def load_main(port, path, concurrency, seconds, root):
    """The load generator's own process (pinned to the client core). At concurrency c a
    caller waits for about c answers, so the warm-up and the window grow with c."""
    os.sched_setaffinity(0, {CLIENT_CORE})
    scale = max(1, concurrency // 4)
    result = asyncio.run(closed_loop(port, path, requests_from(root), concurrency,
                                     2.0 * scale, seconds * scale))
    result["seconds"] = seconds * scale
    print(json.dumps(result))


def summary(latencies, answered=None, seconds=None):
    if not latencies:
        sys.exit("no request started and finished inside the measured window: raise "
                 "--seconds")
    ordered = sorted(latencies)
    pairs_per_s = (DOCUMENTS * answered / seconds if seconds
                   else DOCUMENTS / statistics.mean(ordered))
    return {"pairs_per_s": pairs_per_s, "p50_ms": 1e3 * ordered[len(ordered) // 2],
            "p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("root")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--servers-python", default="",
                        help="the servers venv's python (default: build/servers-venv's, "
                        "when it exists): adds infinity-emb's /rerank")
    parser.add_argument("--load", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        return load_main(int(args.load[0]), args.load[1], int(args.load[2]), args.seconds,
                         args.root)
    servers_python = args.servers_python or os.path.join(
        os.path.abspath(args.build), "servers-venv", "bin", "python")
    with_infinity = os.path.exists(servers_python)

    import onnxruntime
    import sentence_transformers
    import torch
    work = os.path.join(os.path.abspath(args.build), "bench-rerank")
    repository, folder = make_cross_encoder(args.root, work)
    onnx_path = os.path.join(work, "reranker.onnx")
    export_onnx(folder, onnx_path)
    requests = requests_from(args.root)
    commit = subprocess.run(["git", "-C", args.root, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"\nRerank: CPU: {host_info.cpu_description()}")
    print(f"attnserve at {commit}; torch {torch.__version__}, sentence-transformers "
          f"{sentence_transformers.__version__}, onnxruntime {onnxruntime.__version__}")
    print(f"{len(requests)} requests of 1 query x {DOCUMENTS} documents (real sentences); "
          f"core {SERVER_CORE} one thread for every arm, load generator on core "
          f"{CLIENT_CORE}; {args.seconds:g} s per cell, {args.rounds} rounds alternating")

    from sentence_transformers import CrossEncoder
    golden = CrossEncoder(folder, device="cpu").predict(
        [(requests[0][0], d) for d in requests[0][1]])
    servers = {"attnserve": lambda port: start_server(args.build, repository, port)}
    paths = {"attnserve": "/v1/rerank", "infinity": "/rerank"}
    if with_infinity:
        servers["infinity"] = lambda port: start_infinity(servers_python, folder, port)
    else:
        print(f"({servers_python} is missing: no infinity-emb row; `make bench-servers` "
              "makes it)")
    cells = {}

    def serve(arm):
        """One server's cells: checked against CrossEncoder.predict, then loaded."""
        port = free_port()
        server = servers[arm](port)
        try:
            error = float(np.max(np.abs(rerank(port, *requests[0], paths[arm]) - golden)))
            print(f"{arm} vs CrossEncoder.predict on {DOCUMENTS} pairs: max abs {error:.2e}")
            if error > 1e-4:
                sys.exit(f"{arm}'s scores differ from CrossEncoder.predict: not timing it")
            for concurrency in (1, 16):
                out = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), args.build, args.root,
                     f"--seconds={args.seconds}", "--load", str(port), paths[arm],
                     str(concurrency)],
                    check=True, capture_output=True, text=True)
                result = json.loads(out.stdout)
                cells.setdefault((arm, concurrency), []).append(summary(
                    result["latencies"], result["answered"], result["seconds"]))
        finally:
            server.terminate()
            server.wait(timeout=60)

    arms = ["torch", "onnxruntime", *servers]
    for round_index in range(args.rounds):
        for arm in arms if round_index % 2 == 0 else arms[::-1]:
            if arm in servers:
                serve(arm)
            else:
                cells.setdefault((arm, 1), []).append(summary(peer_latencies(
                    arm, folder, onnx_path, requests, args.seconds)))

    def median(arm, concurrency, key):
        return statistics.median(cell[key] for cell in cells[(arm, concurrency)])

    print("\n| arm | pairs/s | p50 ms | p99 ms |\n| --- | --- | --- | --- |")
    names = {"torch": "CrossEncoder.predict (PyTorch), one request at a time",
             "onnxruntime": "ONNX Runtime + tokenizers, one request at a time",
             "attnserve": "attnserve /v1/rerank", "infinity": "infinity-emb /rerank (torch)"}
    for (arm, concurrency) in sorted(cells):
        name = names[arm] + (f", concurrency {concurrency}" if arm in servers else "")
        print(f"| {name} | {median(arm, concurrency, 'pairs_per_s'):.1f} | "
              f"{median(arm, concurrency, 'p50_ms'):.1f} | "
              f"{median(arm, concurrency, 'p99_ms'):.1f} |")
    fastest = max(("torch", "onnxruntime"), key=lambda a: median(a, 1, "pairs_per_s"))
    print(f"\nfastest library: {names[fastest]}")

    def ratios(against, label):
        """attnserve's pairs/s over `against`'s at c1 (no target) and c16 (a target);
        a library ran one request at a time, so its c1 figure stands for both."""
        for concurrency, target in ((1, None), (16, TARGET_C16)):
            theirs = median(against, concurrency if against in servers else 1,
                            "pairs_per_s")
            ratio = median("attnserve", concurrency, "pairs_per_s") / theirs
            verdict = "" if target is None else (" PASS" if ratio >= target else " FAIL")
            goal = f" (target >= x{target})" if target else ""
            print(f"c{concurrency} pairs/s vs {label}: x{ratio:.2f}{goal}{verdict}")

    def p99_row(theirs, label):
        ours = median("attnserve", 16, "p99_ms")
        print(f"c16 p99 {ours:.1f} ms vs {label}: {theirs:.1f} ms (target: below)"
              f"{' PASS' if ours < theirs else ' FAIL'}")

    ratios(fastest, "the fastest library alone")
    p99_row(16 * median(fastest, 1, "p50_ms"),
            "a server calling that library one request at a time, at least")
    if "infinity" in servers:
        ratios("infinity", "infinity-emb")
        p99_row(median("infinity", 16, "p99_ms"), "infinity-emb's")

if __name__ == "__main__":
    main()
