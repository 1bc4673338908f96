"""Prune an encoder's heads within a quality budget, measured on a running attnserve.

    python -m attnserve.prune --target=127.0.0.1:50051 --model=minilm \\
        --model_folder=models/minilm --calibration=calib.txt --held_out=held.txt \\
        --budget=0.99 --output=models/minilm-pruned

Quality is the cosine of each text's embedding against the unpruned model's: a set of
heads is kept out only while the calibration texts' mean cosine stays at or above
--budget and their minimum at or above --min_budget. The heads are ranked by the loss
their removal alone causes (each masked in turn with a request's head_mask, which the
server computes without that head), then removed greedily in that order, each step
re-measured on the calibration texts. The held-out texts then report the cosine, and the
Spearman correlation of their pairwise similarities against the unpruned model's (how
well a retrieval ranking survives). Speed: sentences/s of the held-out texts with and
without the final mask, alternating rounds, medians (masked heads cost no compute, as
in the pruned model). Writes --output: the model folder's files (linked) and its
config.pbtxt with encoder.pruned_heads, which the server slices out at load; and
report.json there. Needs only the attnserve client and numpy.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
from google.protobuf import text_format

from attnserve.client import Client
from attnserve.v1 import attention_pb2


def cosines(a, b):
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return np.sum(a * b, axis=1)


def ranks(values):
    """Each value's rank; ties share their mean rank."""
    ordinal = np.empty(len(values))
    ordinal[np.argsort(values, kind="stable")] = np.arange(len(values))
    _, group = np.unique(values, return_inverse=True)
    return (np.bincount(group, ordinal) / np.bincount(group))[group]


def spearman(a, b):
    """Spearman correlation of the texts' pairwise cosine similarities under a and b."""
    upper = np.triu_indices(len(a), k=1)
    sa = (a @ a.T / np.outer(np.linalg.norm(a, axis=1), np.linalg.norm(a, axis=1)))[upper]
    sb = (b @ b.T / np.outer(np.linalg.norm(b, axis=1), np.linalg.norm(b, axis=1)))[upper]
    return float(np.corrcoef(ranks(sa), ranks(sb))[0, 1])


class Pruner:
    def __init__(self, client, model, layers, heads, pruned, batch):
        self.client, self.model = client, model
        self.layers, self.heads, self.batch = layers, heads, batch
        self.pruned = pruned  # (layer, head) the model has removed already

    def mask(self, removed):
        factors = np.ones(self.layers * self.heads, dtype=np.float32)
        for layer, head in removed:
            factors[layer * self.heads + head] = 0.0
        return factors.tolist()

    def embed(self, texts, removed=()):
        mask = self.mask(removed) if removed else None
        parts = [self.client.encode(text=texts[i:i + self.batch], model=self.model,
                                    truncate=True, head_mask=mask)
                 for i in range(0, len(texts), self.batch)]
        return np.concatenate(parts).astype(np.float64)

    def keeps_a_head_per_layer(self, removed):
        for layer in range(self.layers):
            gone = {h for (l, h) in removed if l == layer} | {
                h for (l, h) in self.pruned if l == layer}
            if len(gone) >= self.heads:
                return False
        return True

    def prune(self, texts, budget, min_budget, log):
        full = self.embed(texts)
        candidates = [(l, h) for l in range(self.layers) for h in range(self.heads)
                      if (l, h) not in self.pruned]
        loss = {}
        for head in candidates:
            loss[head] = 1.0 - float(np.mean(cosines(full, self.embed(texts, [head]))))
        ranking = sorted(candidates, key=lambda head: loss[head])
        removed = []
        for head in ranking:
            trial = removed + [head]
            if not self.keeps_a_head_per_layer(trial):
                continue
            quality = cosines(full, self.embed(texts, trial))
            if quality.mean() >= budget and quality.min() >= min_budget:
                removed = trial
                log(f"removed layer {head[0]} head {head[1]}: calibration mean cosine "
                    f"{quality.mean():.5f}, min {quality.min():.5f}")
        return ranking, loss, removed

    def speed(self, texts, removed, rounds):
        """Sentences/s without and with the mask: alternating rounds, medians."""
        timings = {"full": [], "pruned": []}
        for _ in range(rounds):
            for arm, heads in (("full", ()), ("pruned", removed)):
                start = time.perf_counter()
                self.embed(texts, heads)
                timings[arm].append(len(texts) / (time.perf_counter() - start))
        return {arm: statistics.median(values) for arm, values in timings.items()}


def write_folder(model_folder, output, removed, report):
    os.makedirs(output, exist_ok=True)
    for name in os.listdir(model_folder):
        if name in ("config.pbtxt", "report.json"):
            continue
        target = os.path.join(output, name)
        if not os.path.lexists(target):
            os.symlink(os.path.abspath(os.path.join(model_folder, name)), target)
    config = attention_pb2.ModelConfig()
    source = os.path.join(model_folder, "config.pbtxt")
    if os.path.exists(source):
        with open(source, encoding="utf-8") as f:
            text_format.Parse(f.read(), config)
    config.name = ""  # the folder's name is the model's
    by_layer = {}
    for layer, head in removed:
        by_layer.setdefault(layer, []).append(head)
    for layer in sorted(by_layer):
        entry = config.encoder.pruned_heads.add(layer=layer)
        entry.heads.extend(sorted(by_layer[layer]))
    with open(os.path.join(output, "config.pbtxt"), "w", encoding="utf-8") as f:
        f.write(text_format.MessageToString(config))
    with open(os.path.join(output, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)


def read_texts(path):
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="localhost:50051")
    parser.add_argument("--model", required=True, help="the served encoder to prune")
    parser.add_argument("--model_folder", required=True,
                        help="its folder (files linked into --output)")
    parser.add_argument("--calibration", required=True, help="texts, one per line")
    parser.add_argument("--held_out", required=True, help="texts, one per line")
    parser.add_argument("--budget", type=float, default=0.99,
                        help="least mean cosine to the unpruned embeddings")
    parser.add_argument("--min_budget", type=float, default=0.0,
                        help="least cosine of any one text")
    parser.add_argument("--output", required=True, help="the pruned model's folder")
    parser.add_argument("--batch", type=int, default=32, help="texts per request")
    parser.add_argument("--speed_rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if not 0.0 < args.budget <= 1.0 or not -1.0 <= args.min_budget <= 1.0:
        parser.error("--budget must be in (0, 1] and --min_budget in [-1, 1]")
    calibration, held_out = read_texts(args.calibration), read_texts(args.held_out)
    if len(calibration) < 2 or len(held_out) < 3:
        parser.error("need at least 2 calibration and 3 held-out texts")
    client = Client(args.target, timeout=300)
    try:
        info = next((m for m in client.models() if m.name == args.model), None)
        if info is None or not info.encoder.num_layers:
            parser.error(f"model {args.model!r} is not a served encoder")
        layers, heads = info.encoder.num_layers, info.num_heads
        pruned = {(entry.layer, head) for field in ("checkpoint_pruned_heads",
                                                     "pruned_heads")
                  for entry in getattr(info.encoder, field) for head in entry.heads}
        pruner = Pruner(client, args.model, layers, heads, pruned, args.batch)
        ranking, loss, removed = pruner.prune(
            calibration, args.budget, args.min_budget,
            lambda line: print(line, file=sys.stderr))
        full, kept = pruner.embed(held_out), pruner.embed(held_out, removed)
        quality = cosines(full, kept)
        speed = pruner.speed(held_out, removed, args.speed_rounds)
    finally:
        client.close()
    report = {
        "model": args.model, "layers": layers, "heads_per_layer": heads,
        "budget": args.budget, "min_budget": args.min_budget,
        "heads_removed": len(removed),
        "heads_total": layers * heads - len(pruned),
        "removed_per_layer": {str(layer): sorted(h for (l, h) in removed if l == layer)
                              for layer in range(layers)},
        "ranking": [{"layer": l, "head": h, "loss": loss[(l, h)]} for (l, h) in ranking],
        "held_out": {"texts": len(held_out), "mean_cosine": float(quality.mean()),
                     "min_cosine": float(quality.min()),
                     "spearman_pairwise": spearman(full, kept)},
        "sentences_per_second": speed,
        "speedup": speed["pruned"] / speed["full"],
    }
    write_folder(args.model_folder, args.output, removed, report)
    print(json.dumps({k: report[k] for k in ("heads_removed", "heads_total", "held_out",
                                             "sentences_per_second", "speedup")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
