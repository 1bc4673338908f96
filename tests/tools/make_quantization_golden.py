#!/usr/bin/env python3
"""Writes what sentence-transformers' quantize_embeddings makes of float32 embeddings,
for the tests of Cohere's embedding_types on /v2/embed (int8, uint8 with the fixed
range [-1, 1] of an L2-normalized embedding; binary and ubinary, which need no range).

Run with the peers venv (`deploy/install-deps.sh --peers build/peers-venv` makes it):
  build/peers-venv/bin/python tests/tools/make_quantization_golden.py tests/data

Writes tests/data/quantization.golden.json:
- "values": 8 rows of 384 float32 values (seeded uniform in [-1, 1], plus the exact
  ends -1 and 1, zero, and each level's boundaries k * 2/255 - 1), and each precision's
  rows as quantize_embeddings returns them, for the exact unit test;
- "texts", "embeddings": the first 16 sentences of tests/data/sentences.en.txt with
  all-MiniLM-L6-v2's embeddings from tests/data/minilm_sentences.npz (written by
  sentence-transformers), and each precision's quantized rows, for the end-to-end test
  through Cohere's client.
"""
import json
import os
import sys

import numpy as np
import sentence_transformers
from sentence_transformers.util.quantization import quantize_embeddings

SEED = 93
PRECISIONS = ("int8", "uint8", "binary", "ubinary")


def quantized(embeddings):
    ranges = np.vstack([np.full(embeddings.shape[1], -1.0, np.float32),
                        np.full(embeddings.shape[1], 1.0, np.float32)])
    out = {}
    for precision in PRECISIONS:
        rows = quantize_embeddings(embeddings, precision=precision,
                                   ranges=ranges if precision.endswith("int8") else None)
        out[precision] = rows.astype(np.int64).tolist()
    return out


def main(directory):
    rng = np.random.default_rng(SEED)
    values = rng.uniform(-1.0, 1.0, size=(8, 384)).astype(np.float32)
    edges = (np.arange(256, dtype=np.float32) * np.float32(2 / 255) - 1).astype(np.float32)
    values[0, :256] = edges
    values[1, :5] = [-1.0, 1.0, 0.0, -0.0, np.float32(1e-8)]
    with open(os.path.join(directory, "sentences.en.txt"), encoding="utf-8") as f:
        texts = [line.rstrip("\n") for line in f][:16]
    embeddings = np.load(os.path.join(directory, "minilm_sentences.npz"))["embeddings"]
    embeddings = embeddings[:16].astype(np.float32)
    golden = {
        "values": [[float(v) for v in row] for row in values],
        "values_quantized": quantized(values),
        "texts": texts,
        "embeddings": [[float(v) for v in row] for row in embeddings],
        "embeddings_quantized": quantized(embeddings),
        "ranges": [-1.0, 1.0],
        "sentence_transformers": sentence_transformers.__version__,
        "seed": SEED,
    }
    with open(os.path.join(directory, "quantization.golden.json"), "w",
              encoding="utf-8") as f:
        json.dump(golden, f)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
