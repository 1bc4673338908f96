#!/usr/bin/env python3
"""The device check's encoder step (device_check.py runs it on a GPU machine that has
PyTorch but not transformers): attnserve's CUDA encoder beside PyTorch on the same
seeded checkpoints, MiniLM-L6's shape and BERT-base's.

For each shape it writes a Hugging Face BERT folder (seeded weights, BERT's tensor
names, mean pooling), a corpus of seeded token ids, and then:
  - numerics: encoder_bench --device=cuda:0 --dump against the same model written
    here in plain torch, in float64 (target: fp32 max abs <= 1e-4; bf16 min cosine
    >= 0.999);
  - speed, sentences/s, medians: 32 sentences of mixed lengths (8..128) per call, and
    one 512-token input per call; attnserve bf16 against torch bf16 (SDPA, padded
    batches with a key mask, as transformers runs BERT) with torch.compile off and on
    (target: >= 1.0 each); fp32 (TF32 off on both sides) printed beside;
  - the servers (BERT-base shape, bf16): attnserve --device=cuda:0 (two instances)
    against a Python HTTP server around the torch model (a batching thread: up to 64
    requests at a time, padded), both over KServe v2 JSON, one sentence of 8..128
    token ids per request from 64 closed-loop clients in 8 processes, with the GPU's
    utilization sampled by nvidia-smi during attnserve's run (targets: attnserve >=
    x1.5 the Python server; GPU busy >= 50%).
usage: encoder_check.py BIN_DIR OUT_DIR  (prints its rows; writes encoder_check.json)
ENCODER_CHECK_DEVICE=cpu runs the same steps on the CPU encoder and PyTorch's CPU, on
fewer sentences: a dry run of this script where there is no GPU.
ENCODER_CHECK_PARTS=numerics,servers (the default) chooses the parts.
"""
import http.client
import http.server
import json
import math
import multiprocessing
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "client", "python"))
from attnserve_export import write_safetensors  # noqa: E402

BIN, OUT = sys.argv[1], sys.argv[2]
SHAPES = {"minilm-l6": (6, 384, 12, 1536), "bert-base": (12, 768, 12, 3072)}
VOCAB, POSITIONS, EPS = 30522, 512, 1e-12
DEVICE = os.environ.get("ENCODER_CHECK_DEVICE", "cuda")
DRY = DEVICE == "cpu"
PARTS = os.environ.get("ENCODER_CHECK_PARTS", "numerics,servers").split(",")
results = {}


def log(*parts):
    print(*parts, flush=True)


CHECKPOINTS = {}


def checkpoint(name, layers, d, heads, ffn):
    """(folder, tensors) of the seeded checkpoint of this shape, written once."""
    if name not in CHECKPOINTS:
        folder = os.path.join(OUT, name)
        CHECKPOINTS[name] = folder, make_checkpoint(folder, layers, d, heads, ffn,
                                                    seed=layers * d)
    return CHECKPOINTS[name]


def make_checkpoint(folder, layers, d, heads, ffn, seed):
    rng = np.random.default_rng(seed)
    def normal(*shape):
        return rng.normal(0.0, 0.02, shape).astype(np.float32)
    def norm(prefix, t):
        t[prefix + ".weight"] = (1.0 + rng.normal(0.0, 0.05, d)).astype(np.float32)
        t[prefix + ".bias"] = normal(d)
    t = {"embeddings.word_embeddings.weight": normal(VOCAB, d),
         "embeddings.position_embeddings.weight": normal(POSITIONS, d),
         "embeddings.token_type_embeddings.weight": normal(2, d)}
    norm("embeddings.LayerNorm", t)
    for n in range(layers):
        p = f"encoder.layer.{n}."
        for part in ("query", "key", "value"):
            t[p + f"attention.self.{part}.weight"] = normal(d, d)
            t[p + f"attention.self.{part}.bias"] = normal(d)
        t[p + "attention.output.dense.weight"] = normal(d, d)
        t[p + "attention.output.dense.bias"] = normal(d)
        norm(p + "attention.output.LayerNorm", t)
        t[p + "intermediate.dense.weight"] = normal(ffn, d)
        t[p + "intermediate.dense.bias"] = normal(ffn)
        t[p + "output.dense.weight"] = normal(d, ffn)
        t[p + "output.dense.bias"] = normal(d)
        norm(p + "output.LayerNorm", t)
    os.makedirs(os.path.join(folder, "1_Pooling"), exist_ok=True)
    write_safetensors(os.path.join(folder, "model.safetensors"),
                      {name: torch.from_numpy(value) for name, value in t.items()})
    config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": d,
              "num_hidden_layers": layers, "num_attention_heads": heads,
              "intermediate_size": ffn, "hidden_act": "gelu", "layer_norm_eps": EPS,
              "max_position_embeddings": POSITIONS, "type_vocab_size": 2,
              "vocab_size": VOCAB, "pad_token_id": 0}
    with open(os.path.join(folder, "config.json"), "w") as out:
        json.dump(config, out)
    with open(os.path.join(folder, "modules.json"), "w") as out:
        json.dump([{"idx": 0, "name": "0", "path": "",
                    "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling"}], out)
    with open(os.path.join(folder, "1_Pooling", "config.json"), "w") as out:
        json.dump({"word_embedding_dimension": d, "pooling_mode_mean_tokens": True}, out)
    return t


def attention(q, k, v, keys):
    if hasattr(F, "scaled_dot_product_attention"):  # torch 2.x: the fused kernels
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keys)
    # Debian's torch 1.13, for the dry run: the same product, written out.
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~keys, float("-inf")), -1) @ v


class TorchBert(torch.nn.Module):
    """BERT as transformers computes it (post-LN, GELU, SDPA with a key mask), mean
    pooling over each sentence's own tokens."""

    def __init__(self, tensors, layers, heads):
        super().__init__()
        self.w = {k: torch.tensor(v) for k, v in tensors.items()}
        self.layers, self.heads = layers, heads

    def to_device(self, dtype):
        self.w = {k: v.to(DEVICE, dtype) for k, v in self.w.items()}
        return self

    def forward(self, ids, mask):
        w, B, L = self.w, ids.shape[0], ids.shape[1]
        d = w["embeddings.word_embeddings.weight"].shape[1]
        positions = torch.arange(L, device=ids.device)
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][positions][None]
             + w["embeddings.token_type_embeddings.weight"][0])
        ln = lambda x, p: F.layer_norm(x, (d,), w[p + ".weight"], w[p + ".bias"], EPS)
        lin = lambda x, p: F.linear(x, w[p + ".weight"], w[p + ".bias"])
        x = ln(x, "embeddings.LayerNorm")
        keys = mask[:, None, None, :].bool()
        for n in range(self.layers):
            p = f"encoder.layer.{n}."
            split = lambda t: t.view(B, L, self.heads, d // self.heads).transpose(1, 2)
            q, k, v = (split(lin(x, p + f"attention.self.{part}"))
                       for part in ("query", "key", "value"))
            a = attention(q, k, v, keys)
            a = a.transpose(1, 2).reshape(B, L, d)
            x = ln(x + lin(a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            h = F.gelu(lin(x, p + "intermediate.dense"))
            x = ln(x + lin(h, p + "output.dense"), p + "output.LayerNorm")
        m = mask[:, :, None].to(x.dtype)
        return (x * m).sum(1) / m.sum(1)


def corpus(kind, seed):
    rng = np.random.default_rng(seed)
    count = (2 if DRY else 8) if kind == "mixed" else (2 if DRY else 16)
    lengths = rng.integers(8, 129, 32 * count) if kind == "mixed" else np.full(count, 512)
    ids = [np.concatenate([[101], rng.integers(1000, VOCAB, n - 2), [102]]) for n in lengths]
    return ids, lengths, (32 if kind == "mixed" else 1)


def attnserve(folder, ids, lengths, batch, precision, dump):
    base = os.path.join(OUT, "corpus")
    np.concatenate(ids).astype("<i4").tofile(base + ".ids")
    np.asarray(lengths).astype("<i4").tofile(base + ".lengths")
    process = subprocess.run(
        [os.path.join(BIN, "encoder_bench"), f"--model_dir={folder}", f"--ids={base}.ids",
         f"--lengths={base}.lengths", f"--batch={batch}", f"--precision={precision}",
         f"--device={'cpu' if DRY else 'cuda:0'}", f"--rounds={1 if DRY else 5}",
         f"--dump={dump}"],
        capture_output=True, text=True, timeout=300)
    if process.returncode != 0:
        raise RuntimeError(process.stderr.strip())
    row = json.loads(process.stdout.strip().splitlines()[-1])
    return row, np.fromfile(dump, dtype=np.float32).reshape(len(lengths), -1)


def synchronize():
    if not DRY:
        torch.cuda.synchronize()


def pad(group):
    """Sentences of ids as transformers takes them: [n, L] ids right-padded with 0,
    and the mask."""
    L = max(len(s) for s in group)
    padded = torch.zeros((len(group), L), dtype=torch.long)
    mask = torch.zeros((len(group), L), dtype=torch.long)
    for i, s in enumerate(group):
        padded[i, :len(s)], mask[i, :len(s)] = torch.as_tensor(s), 1
    return padded, mask


def torch_rate(model, ids, lengths, batch, rounds=1 if DRY else 5):
    batches = [pad(ids[first:first + batch]) for first in range(0, len(ids), batch)]
    def one_pass():
        out = []
        for padded, mask in batches:  # ids in and embeddings out, as a server does
            out.append(model(padded.to(DEVICE, non_blocking=True),
                             mask.to(DEVICE, non_blocking=True)).float().cpu())
        return out
    with torch.inference_mode():
        one_pass()
        synchronize()
        rates = []
        for _ in range(rounds):
            start = time.perf_counter()
            one_pass()
            synchronize()
            rates.append(len(ids) / (time.perf_counter() - start))
    return statistics.median(rates)


def check(name, layers, d, heads, ffn):
    folder, tensors = checkpoint(name, layers, d, heads, ffn)
    row = results.setdefault(name, {})
    for kind in ("mixed", "long"):
        ids, lengths, batch = corpus(kind, seed=len(name))
        figures = row.setdefault(kind, {})
        # The float64 reference on the same sentences, one batch at a time.
        ref_model = TorchBert(tensors, layers, heads).to_device(torch.float64)
        with torch.inference_mode():
            reference = []
            for first in range(0, len(ids), batch):
                padded, mask = pad(ids[first:first + batch])
                reference.append(
                    ref_model(padded.to(DEVICE), mask.to(DEVICE)).cpu().numpy())
            reference = np.concatenate(reference)
        del ref_model
        for precision in ("fp32",) if DRY else ("fp32", "bf16"):
            ours, pooled = attnserve(folder, ids, lengths, batch, precision,
                                     os.path.join(OUT, f"{name}.{kind}.{precision}.f32"))
            error = float(np.abs(pooled - reference).max())
            cosine = float(np.min(np.sum(pooled * reference, 1) / (
                np.linalg.norm(pooled, axis=1) * np.linalg.norm(reference, axis=1))))
            dtype = torch.float32 if precision == "fp32" else torch.bfloat16
            model = TorchBert(tensors, layers, heads).to_device(dtype)
            eager = torch_rate(model, ids, lengths, batch)
            try:
                compiled = (float("nan") if DRY else
                            torch_rate(torch.compile(model, dynamic=True), ids, lengths, batch))
            except Exception as failure:  # report, do not stop the check
                compiled = float("nan")
                log(f"  torch.compile failed: {failure!r}"[:300])
            figures[precision] = {"ours": ours["sentences_per_s"], "compute": ours["compute"],
                                  "max_abs": error, "min_cosine": cosine,
                                  "torch_eager": eager, "torch_compile": compiled}
            passed = error <= 1e-4 if precision == "fp32" else cosine >= 0.999
            log(f"  {name} {kind:5s} {precision}: ours {ours['sentences_per_s']:9.1f}/s  "
                f"torch eager {eager:9.1f}/s (x{ours['sentences_per_s'] / eager:.2f})  "
                f"compiled {compiled:9.1f}/s (x{ours['sentences_per_s'] / compiled:.2f})"
                + ("  [target >= 1.0 each: "
                   + ("PASS" if min(ours["sentences_per_s"] / eager,
                                    ours["sentences_per_s"] / compiled) >= 1.0
                      and not math.isnan(compiled) else "FAIL") + "]"
                   if precision == "bf16" else "")
                + f"  max abs {error:.2e} min cosine {cosine:.6f} "
                f"[{'fp32 <= 1e-4' if precision == 'fp32' else 'bf16 cosine >= 0.999'}: "
                f"{'PASS' if passed else 'FAIL'}]")
            del model
            if not DRY:
                torch.cuda.empty_cache()


def client_process(port, model, seed, seconds, threads, counts):
    """`threads` closed-loop clients on one port for `seconds`; adds its count."""
    rng = np.random.default_rng(seed)
    bodies = []
    for _ in range(64):
        n = int(rng.integers(8, 129))
        ids = [101] + rng.integers(1000, VOCAB, n - 2).tolist() + [102]
        bodies.append(json.dumps({"inputs": [
            {"name": "input_ids", "shape": [1, n], "datatype": "INT64", "data": ids},
            {"name": "attention_mask", "shape": [1, n], "datatype": "INT64",
             "data": [1] * n}], "outputs": [{"name": "embedding"}]}).encode())
    done = [0] * threads
    end = time.time() + seconds
    def loop(i):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        while time.time() < end:
            connection.request("POST", f"/v2/models/{model}/infer", bodies[(i * 7 + done[i]) % 64],
                               {"Content-Type": "application/json"})
            reply = connection.getresponse()
            reply.read()
            if reply.status != 200:
                raise RuntimeError(f"HTTP {reply.status}")
            done[i] += 1
    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    counts.put(sum(done))


def load(port, model, seconds, processes=2 if DRY else 8, threads=4 if DRY else 8):
    counts = multiprocessing.Queue()
    workers = [multiprocessing.Process(target=client_process,
                                       args=(port, model, seed, seconds, threads, counts))
               for seed in range(processes)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    total = sum(counts.get() for _ in workers)
    return total / seconds


class TorchServer(http.server.ThreadingHTTPServer):
    """The peer: KServe v2 JSON over HTTP around TorchBert, with a batching thread."""
    daemon_threads = True
    request_queue_size = 256  # 64 clients connect at once; the default backlog is 5

    def __init__(self, port, model):
        self.model, self.jobs = model, queue.Queue()
        super().__init__(("127.0.0.1", port), TorchHandler)
        threading.Thread(target=self.batch_loop, daemon=True).start()

    def batch_loop(self):
        while True:
            jobs = [self.jobs.get()]
            while len(jobs) < 64:
                try:
                    jobs.append(self.jobs.get(timeout=0.001))
                except queue.Empty:
                    break
            padded, mask = pad([ids for ids, _ in jobs])
            with torch.inference_mode():
                out = self.model(padded.to(DEVICE), mask.to(DEVICE)).float().cpu().numpy()
            for i, (_, answer) in enumerate(jobs):
                answer.put(out[i])


class TorchHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ids = next(i["data"] for i in body["inputs"] if i["name"] == "input_ids")
        answer = queue.Queue()
        self.server.jobs.put((ids, answer))
        embedding = answer.get()
        data = json.dumps({"outputs": [{"name": "embedding", "datatype": "FP32",
                                        "shape": [1, len(embedding)],
                                        "data": embedding.tolist()}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def smi_utilization(samples, stop):
    while not stop.is_set():
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=10).stdout.split()
            if out:
                samples.append(float(out[0]))
        except (OSError, subprocess.TimeoutExpired):
            return
        time.sleep(0.2)


def servers(name, layers, d, heads, ffn, seconds=4 if DRY else 10):
    folder, tensors = checkpoint(name, layers, d, heads, ffn)
    repository = tempfile.mkdtemp()
    os.symlink(folder, os.path.join(repository, name))
    precision = "fp32" if DRY else "bf16"
    with open(os.path.join(folder, "config.pbtxt"), "w") as out:
        out.write(f"precision: PRECISION_{precision.upper()}\nencoder {{}}\n")
    server = subprocess.Popen(
        [os.path.join(BIN, "attnserve"), f"--model_repository={repository}",
         "--builtin_model=false", f"--device={'cpu' if DRY else 'cuda:0'}",
         "--host=127.0.0.1", "--port=0", "--http_port=18091", "--metrics_port=-1",
         "--instances=2", "--max_batch_size=64", "--max_queue_delay=1ms"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    row = results.setdefault("servers", {})
    try:
        for line in server.stdout:
            if "attnserve http on" in line:
                break
            if "startup_failed" in line:
                raise RuntimeError(line.strip())
        threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()
        load(18091, name, 1)  # warm-up
        samples, stop = [], threading.Event()
        sampler = threading.Thread(target=smi_utilization, args=(samples, stop))
        sampler.start()
        ours = load(18091, name, seconds)
        stop.set()
        sampler.join()
    finally:
        server.terminate()
        server.wait(timeout=60)
    busy = statistics.median(samples) if samples else float("nan")
    model = TorchBert(tensors, layers, heads).to_device(
        torch.float32 if DRY else torch.bfloat16)
    peer = TorchServer(18092, model)
    threading.Thread(target=peer.serve_forever, daemon=True).start()
    try:
        load(18092, name, 1)
        theirs = load(18092, name, seconds)
    finally:
        peer.shutdown()
        peer.server_close()
    row[name] = {"precision": precision, "attnserve": ours, "python_torch": theirs,
                 "gpu_busy_percent": busy}
    ratio = ours / theirs
    log(f"  servers {name} {precision} c{64 if not DRY else 8}: attnserve {ours:8.1f} sentences/s, Python + torch "
        f"{theirs:8.1f} (x{ratio:.2f}) [target >= x1.5: {'PASS' if ratio >= 1.5 else 'FAIL'}]; "
        f"GPU busy {busy:.0f}% (median of {len(samples)} samples) "
        f"[target >= 50%: {'PASS' if busy >= 50 else 'FAIL'}]")


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    log(f"  torch {torch.__version__} on "
        f"{'the CPU (dry run)' if DRY else torch.cuda.get_device_name(0)}")
    failed = False
    for name, shape in list(SHAPES.items())[:0 if "numerics" not in PARTS else
                                            1 if DRY else None]:
        try:
            check(name, *shape)
        except Exception as failure:
            log(f"  {name}: failed: {failure!r}"[:600])
            failed = True
    try:
        if "servers" in PARTS:
            name = "minilm-l6" if DRY else "bert-base"
            servers(name, *SHAPES[name])
    except Exception as failure:
        log(f"  servers: failed: {failure!r}"[:600])
        failed = True
    with open(os.path.join(OUT, "encoder_check.json"), "w") as out:
        json.dump(results, out, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
