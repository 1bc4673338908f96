#!/usr/bin/env python3
"""Writes a small BERT embedder before and after Hugging Face's prune_heads(), and the
embeddings transformers computes with each (and with a head mask), for
tests/e2e/heads_test.py.

transformers 5 removed prune_heads() and head_mask, so this runs with transformers 4.57,
the last release that has them, beside the peers venv's torch:
  deploy/install-deps.sh --peers build/peers-venv --transformers4 build/transformers4
  PYTHONPATH=build/transformers4 build/peers-venv/bin/python \\
      tests/tools/make_heads_golden.py tests/data

The model is a seeded BertModel (3 layers, d=32, 4 heads, 64 positions; biases and
layer norms drawn at random so that the tests exercise them) with the WordPiece
tokenizer of tests/data/reranker_tiny. Folders:
- heads_tiny/full: the model as made, save_pretrained;
- heads_tiny/pruned: the same model after prune_heads({0: [0, 2], 2: [1, 2, 3]})
  (uneven heads per layer; layer 1 keeps all four), save_pretrained: config.json
  records pruned_heads, and the checkpoint's attention matrices lack those heads.
heads_tiny.golden.json: the texts, their token ids, and the mean-pooled embeddings
(sentence-transformers' default pooling: the mean over each text's tokens) of the full
model, the pruned model, and the full model under HEAD_MASK (transformers' head_mask:
each head's attention weights times its factor); and each layer's and head's statistics
over all the texts' tokens, from transformers' attentions (output_attentions), for the
full and the pruned model.
"""
import json
import os
import shutil
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seeded_bert import draw_norms_and_biases  # noqa: E402

LAYERS, D, HEADS, FFN, POSITIONS = 3, 32, 4, 64, 64
PRUNED = {0: [0, 2], 2: [1, 2, 3]}
HEAD_MASK = [[1.0, 0.0, 1.0, 0.5], [0.0, 1.0, 1.0, 1.0], [1.0, 0.25, 0.0, 1.0]]


def seeded_model(vocab):
    torch.manual_seed(61)
    config = transformers.BertConfig(
        vocab_size=vocab, hidden_size=D, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=FFN,
        max_position_embeddings=POSITIONS, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, initializer_range=0.3)
    return draw_norms_and_biases(
        transformers.BertModel(config, add_pooling_layer=False).eval())


def mean_pooled(model, encoded, head_mask=None):
    with torch.inference_mode():
        hidden = model(**encoded, head_mask=head_mask).last_hidden_state[0]
    return hidden.mean(dim=0).tolist()


def head_statistics(model, encoded, pruned=None):
    """Each layer's and head's figures over every query token of `encoded` (attnserve's
    definitions, in float64 from transformers' attentions): entropy, largest weight,
    distance, and the weight on the first token, the last, the token itself and the one
    before it. A pruned head's are zero."""
    names = ["mean_entropy", "mean_max_weight", "mean_distance", "share_first",
             "share_last", "share_self", "share_previous"]
    sums = torch.zeros(LAYERS, HEADS, len(names), dtype=torch.float64)
    tokens = 0
    for e in encoded:
        with torch.inference_mode():
            attentions = model(**e, output_attentions=True).attentions
        length = e["input_ids"].shape[1]
        tokens += length
        rows = torch.arange(length)
        distance = (rows[:, None] - rows[None, :]).abs().double()
        for layer, weights in enumerate(attentions):
            kept = [h for h in range(HEADS) if h not in (pruned or {}).get(layer, [])]
            for position, head in enumerate(kept):
                p = weights[0, position].double()  # [L, L]
                logs = torch.where(p > 0, p.log(), torch.zeros_like(p))
                previous = torch.zeros(length, dtype=torch.float64)
                previous[1:] = p[rows[1:], rows[1:] - 1]
                figures = [-(p * logs).sum(1), p.max(1).values, (p * distance).sum(1),
                           p[:, 0], p[:, -1], p.diagonal(), previous]
                sums[layer, head] += torch.stack([f.sum() for f in figures])
    means = sums / tokens
    return [[dict(zip(names, means[layer, head].tolist())) for head in range(HEADS)]
            for layer in range(LAYERS)]


def main(directory):
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(
        os.path.join(directory, "reranker_tiny"))
    with open(os.path.join(directory, "sentences.en.txt"), encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    texts = [" ".join(s.split()[:n]) for s, n in zip(sentences[60:66],
                                                     (3, 9, 14, 1, 20, 6))]
    model = seeded_model(len(tokenizer))
    root = os.path.join(directory, "heads_tiny")
    shutil.rmtree(root, ignore_errors=True)
    encoded = [tokenizer(text, return_tensors="pt", truncation=True) for text in texts]
    mask = torch.tensor(HEAD_MASK)
    golden = {"texts": texts, "pruned_heads": PRUNED, "head_mask": HEAD_MASK,
              "token_ids": [e["input_ids"][0].tolist() for e in encoded],
              "full": [mean_pooled(model, e) for e in encoded],
              "masked": [mean_pooled(model, e, mask) for e in encoded],
              "full_statistics": head_statistics(model, encoded)}
    model.save_pretrained(os.path.join(root, "full"))
    model.prune_heads(PRUNED)
    golden["pruned"] = [mean_pooled(model, e) for e in encoded]
    golden["pruned_statistics"] = head_statistics(model, encoded, PRUNED)
    model.save_pretrained(os.path.join(root, "pruned"))
    for folder in ("full", "pruned"):
        tokenizer.save_pretrained(os.path.join(root, folder))
    with open(os.path.join(directory, "heads_tiny.golden.json"), "w",
              encoding="utf-8") as f:
        json.dump(golden, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
