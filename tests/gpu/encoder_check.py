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
    (target: >= 1.0 each); fp32 (TF32 off on both sides) printed beside.
usage: encoder_check.py BIN_DIR OUT_DIR  (prints its rows; writes encoder_check.json)
ENCODER_CHECK_DEVICE=cpu runs the same steps on the CPU encoder and PyTorch's CPU, on
fewer sentences: a dry run of this script where there is no GPU.
"""
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

BIN, OUT = sys.argv[1], sys.argv[2]
SHAPES = {"minilm-l6": (6, 384, 12, 1536), "bert-base": (12, 768, 12, 3072)}
VOCAB, POSITIONS, EPS = 30522, 512, 1e-12
DEVICE = os.environ.get("ENCODER_CHECK_DEVICE", "cuda")
DRY = DEVICE == "cpu"
results = {}


def log(*parts):
    print(*parts, flush=True)


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for blob in blobs:
            out.write(blob)


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
    write_safetensors(os.path.join(folder, "model.safetensors"), t)
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


def torch_rate(model, ids, lengths, batch, rounds=1 if DRY else 5):
    batches = []
    for first in range(0, len(ids), batch):
        group = ids[first:first + batch]
        L = max(len(s) for s in group)
        padded = np.zeros((len(group), L), np.int64)
        mask = np.zeros((len(group), L), np.int64)
        for i, s in enumerate(group):
            padded[i, :len(s)], mask[i, :len(s)] = s, 1
        batches.append((torch.tensor(padded), torch.tensor(mask)))
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
    folder = os.path.join(OUT, name)
    tensors = make_checkpoint(folder, layers, d, heads, ffn, seed=layers * d)
    row = results.setdefault(name, {})
    for kind in ("mixed", "long"):
        ids, lengths, batch = corpus(kind, seed=len(name))
        figures = row.setdefault(kind, {})
        # The float64 reference on the same sentences, one batch at a time.
        ref_model = TorchBert(tensors, layers, heads).to_device(torch.float64)
        with torch.inference_mode():
            reference = []
            for first in range(0, len(ids), batch):
                group = ids[first:first + batch]
                L = max(len(s) for s in group)
                padded = torch.zeros((len(group), L), dtype=torch.long)
                mask = torch.zeros((len(group), L), dtype=torch.long)
                for i, s in enumerate(group):
                    padded[i, :len(s)], mask[i, :len(s)] = torch.tensor(s), 1
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


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    log(f"  torch {torch.__version__} on "
        f"{'the CPU (dry run)' if DRY else torch.cuda.get_device_name(0)}")
    failed = False
    for name, shape in list(SHAPES.items())[:1 if DRY else None]:
        try:
            check(name, *shape)
        except Exception as failure:
            log(f"  {name}: failed: {failure!r}"[:600])
            failed = True
    with open(os.path.join(OUT, "encoder_check.json"), "w") as out:
        json.dump(results, out, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
