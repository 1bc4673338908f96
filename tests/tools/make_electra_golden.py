#!/usr/bin/env python3
"""Writes a small seeded ELECTRA cross-encoder and the scores sentence-transformers'
CrossEncoder computes with it, for the tests of attnserve's ELECTRA loader (config.json
model_type "electra": BERT's blocks under `electra.`, no pooler, a classification head
of classifier.dense + GELU + classifier.out_proj on the first token, as
cross-encoder/ms-marco-electra-base ships).

Run with the peers venv (`deploy/install-deps.sh --peers build/peers-venv` makes it):
  build/peers-venv/bin/python tests/tools/make_electra_golden.py tests/data

The model is transformers' ElectraForSequenceClassification from a seeded ElectraConfig
(2 layers, hidden and embedding_size 32, 4 heads, intermediate 64, 64 positions, one
label, no dropout), every LayerNorm and bias drawn at random and the head from N(0, 1)
(tests/tools/seeded_bert.py), with the WordPiece tokenizer of tests/data/reranker_tiny
(its tokenizer.json and tokenizer_config.json: pairs with token types, as ELECTRA's
tokenizers give them). Saved by save_pretrained (every tensor of the encoder behind
`electra.`); sentence-transformers' files are not needed (CrossEncoder's Sigmoid for one
label is the default).

Writes electra_reranker_tiny/ and electra_reranker_tiny.golden.json: the query, the
documents (one long enough to be truncated at 64 tokens, longest_first), the pairs'
token ids and token types, the raw logits (transformers, one pair at a time) and
CrossEncoder.predict's scores, rounded to 8 significant digits; the versions and the
ElectraConfig fields set.
"""
import json
import os
import shutil
import sys

import sentence_transformers
import torch
import transformers
from sentence_transformers import CrossEncoder

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seeded_bert import draw_norms_and_biases  # noqa: E402

SEED = 83
FIELDS = dict(hidden_size=32, embedding_size=32, num_hidden_layers=2,
              num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
              type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
              initializer_range=0.3, num_labels=1)


def rounded(values):
    return [float(f"{v:.8g}") for v in values]


def main(directory):
    source = os.path.join(directory, "reranker_tiny")
    folder = os.path.join(directory, "electra_reranker_tiny")
    shutil.rmtree(folder, ignore_errors=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    torch.manual_seed(SEED)
    config = transformers.ElectraConfig(vocab_size=len(tokenizer), **FIELDS)
    model = draw_norms_and_biases(
        transformers.ElectraForSequenceClassification(config).eval(),
        heads=("classifier.",))
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(source, name), os.path.join(folder, name))
    with open(os.path.join(directory, "reranker_tiny.golden.json"), encoding="utf-8") as f:
        reranker = json.load(f)
    query, documents = reranker["query"], reranker["documents"]
    cross = CrossEncoder(folder, device="cpu", max_length=64)
    scores = cross.predict([[query, d] for d in documents], batch_size=4,
                           convert_to_numpy=True).tolist()
    ids, types, logits = [], [], []
    loaded = transformers.ElectraForSequenceClassification.from_pretrained(folder).eval()
    with torch.inference_mode():
        for document in documents:
            encoded = tokenizer(query, document, truncation=True, max_length=64,
                                return_tensors="pt")
            ids.append(encoded["input_ids"][0].tolist())
            types.append(encoded["token_type_ids"][0].tolist())
            logits.append(loaded(**encoded).logits[0, 0].item())
    assert all(1 in t for t in types), "pairs need token types"
    golden = {"query": query, "documents": documents, "max_length": 64, "token_ids": ids,
              "token_type_ids": types, "logits": rounded(logits), "scores": rounded(scores),
              "versions": {"transformers": transformers.__version__,
                           "sentence-transformers": sentence_transformers.__version__,
                           "torch": torch.__version__},
              "config": FIELDS, "seed": SEED}
    with open(os.path.join(directory, "electra_reranker_tiny.golden.json"), "w",
              encoding="utf-8") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
