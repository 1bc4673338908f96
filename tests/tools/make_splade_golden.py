#!/usr/bin/env python3
"""Writes two small SPLADE models (sentence-transformers SparseEncoder folders over seeded
masked-LM checkpoints) and their sparse embeddings, for the SPLADE head's tests.

Run with the peers venv (`deploy/install-deps.sh --peers build/peers-venv` makes it):
  build/peers-venv/bin/python tests/tools/make_splade_golden.py tests/data

Both reuse reranker_tiny's WordPiece tokenizer (its files are copied), so a rerun writes
the same folders. The checkpoints are seeded (2 layers, d=32, 4 heads, 64 positions) with
their norms and biases drawn (seeded_bert.py) and the decoder's bias drawn in [-5, -1],
so that most of a text's weights are zero, as a trained SPLADE model's are:
- splade_tiny/: BertForMaskedLM (cls.predictions.*, the decoder tied to the word
  embeddings), SpladePooling max with relu: log(1 + relu(logit)), the maximum over the
  tokens.
- splade_distilbert_tiny/: DistilBertForMaskedLM (vocab_transform, vocab_layer_norm,
  vocab_projector), SpladePooling sum with log1p_relu: log(1 + log(1 + relu(logit))),
  summed over the tokens.
Each golden file holds the texts (one long enough to be cut at 64 tokens), their token
ids, and each text's weights over the whole vocabulary from SparseEncoder.encode, checked
here against the same computation written out on transformers' logits.
"""
import json
import os
import shutil
import sys

import torch
import transformers
from sentence_transformers import SparseEncoder
from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seeded_bert import draw_norms_and_biases  # noqa: E402

LAYERS, D, HEADS, FFN, POSITIONS = 2, 32, 4, 64, 64
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def seeded_bert(seed, vocab):
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=vocab, hidden_size=D, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=FFN,
        max_position_embeddings=POSITIONS, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, initializer_range=0.3)
    model = draw_norms_and_biases(transformers.BertForMaskedLM(config).eval())
    with torch.no_grad():
        model.cls.predictions.bias.uniform_(-5.0, -1.0)
    return model


def seeded_distilbert(seed, vocab):
    torch.manual_seed(seed)
    config = transformers.DistilBertConfig(
        vocab_size=vocab, dim=D, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FFN,
        max_position_embeddings=POSITIONS, dropout=0.0, attention_dropout=0.0,
        initializer_range=0.3)
    model = draw_norms_and_biases(transformers.DistilBertForMaskedLM(config).eval())
    with torch.no_grad():
        model.vocab_projector.bias.uniform_(-5.0, -1.0)
    return model


def splade_by_hand(model, tokenizer, texts, strategy, twice):
    """log(1 + relu(logits)) (twice: applied again), max or sum over each text's tokens."""
    out = []
    with torch.inference_mode():
        for text in texts:
            encoded = tokenizer(text, return_tensors="pt", truncation=True,
                                max_length=POSITIONS)
            logits = model(**encoded).logits[0].double()
            values = torch.log1p(torch.relu(logits))
            if twice:
                values = torch.log1p(values)
            out.append(values.max(dim=0).values if strategy == "max"
                       else values.sum(dim=0))
    return torch.stack(out)


def write(directory, name, model, source, strategy, activation, texts):
    folder = os.path.join(directory, name)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    for file in TOKENIZER_FILES:
        shutil.copy(os.path.join(source, file), folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    if isinstance(model, transformers.DistilBertForMaskedLM):
        # DistilBERT takes no token types.
        tokenizer.model_input_names = ["input_ids", "attention_mask"]
        tokenizer.save_pretrained(folder)
    transformer = MLMTransformer(folder, max_seq_length=POSITIONS,
                                 tokenizer_args={"model_input_names":
                                                 tokenizer.model_input_names})
    encoder = SparseEncoder(modules=[transformer, SpladePooling(
        pooling_strategy=strategy, activation_function=activation)], device="cpu")
    encoder.save_pretrained(folder)
    os.remove(os.path.join(folder, "README.md"))  # a generated model card
    encoder = SparseEncoder(folder, device="cpu")
    weights = encoder.encode(texts, batch_size=2, convert_to_tensor=True).to_dense()
    by_hand = splade_by_hand(model, tokenizer, texts, strategy,
                             activation == "log1p_relu")
    assert torch.allclose(weights.double(), by_hand, atol=1e-5), \
        (weights.double() - by_hand).abs().max()
    zero = (weights == 0).double().mean().item()
    assert 0.3 < zero < 0.99, f"{name}: {zero:.2f} of the weights are zero"
    ids = [tokenizer(t, truncation=True, max_length=POSITIONS)["input_ids"]
           for t in texts]
    assert max(len(i) for i in ids) == POSITIONS, "one text must be cut"
    with open(os.path.join(directory, name + ".golden.json"), "w") as f:
        json.dump({"texts": texts, "token_ids": ids, "weights": weights.tolist()}, f)


def main(directory):
    with open(os.path.join(directory, "sentences.en.txt"), encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    source = os.path.join(directory, "reranker_tiny")
    vocab = len(transformers.AutoTokenizer.from_pretrained(source))
    texts = [" ".join(s.split()[:12]) for s in sentences[60:64]] + \
        [" ".join(sentences[70:80])]
    write(directory, "splade_tiny", seeded_bert(47, vocab), source, "max", "relu",
          texts)
    write(directory, "splade_distilbert_tiny", seeded_distilbert(48, vocab), source,
          "sum", "log1p_relu", texts)


if __name__ == "__main__":
    main(sys.argv[1])
