#!/usr/bin/env python3
"""Writes a small seeded NomicBERT embedder (a sentence-transformers folder over
transformers' NomicBertModel) and what sentence-transformers computes with it, for the
tests of attnserve's NomicBERT family: rotary positions (no position table), token
types, post-LN blocks, separate Q/K/V/O projections without biases, a SwiGLU
feed-forward (silu(gate_proj x) * up_proj x), LayerNorms with biases.

Run with the peers venv (`deploy/install-deps.sh --peers build/peers-venv` makes it):
  build/peers-venv/bin/python tests/tools/make_nomic_golden.py tests/data

The tokenizer is reranker_tiny's BERT WordPiece (its files copied, model_max_length
raised to 512), so a rerun writes the same folder. The model: 2 layers, hidden 64, 4
heads of 16, intermediate 96, rope_theta 1000 (nomic-embed-text's), 512 positions,
fp32; every LayerNorm scale drawn in [0.5, 1.5] and every bias in [-0.2, 0.2]
(seeded_bert.py) so that a loader skipping one is caught. Texts: short sentences and one
of about 300 tokens.

Writes nomic_tiny/ (config.json and model.safetensors with transformers' own names,
the tokenizer, modules.json with Transformer (max_seq_length 512), mean Pooling and
Normalize) and nomic_tiny.golden.json: the texts, their token ids,
SentenceTransformer.encode's embeddings (normalized) and NomicBertModel's last hidden
state mean-pooled, each text alone ("unnormalized"), checked here to agree.
"""
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seeded_bert import draw_norms_and_biases  # noqa: E402
from seeded_folder import long_text, save_pooled, start_folder, write_golden  # noqa: E402

LAYERS, D, HEADS, FFN, POSITIONS = 2, 64, 4, 96, 8192


def main(directory):
    folder, tokenizer, sentences = start_folder(directory, "nomic_tiny", "reranker_tiny",
                                                POSITIONS)

    torch.manual_seed(50)
    config = transformers.NomicBertConfig(
        vocab_size=len(tokenizer), hidden_size=D, intermediate_size=FFN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, head_dim=D // HEADS,
        max_position_embeddings=POSITIONS, initializer_range=0.2,
        pad_token_id=tokenizer.pad_token_id)
    config._attn_implementation = "eager"
    model = draw_norms_and_biases(transformers.NomicBertModel(config).eval())
    model.save_pretrained(folder)

    encoder = save_pooled(folder, D, POSITIONS)

    texts = [" ".join(s.split()[:14]) for s in sentences[90:95]] + \
        [" ".join(sentences[130:150]), long_text(sentences, tokenizer, POSITIONS)]
    encoded = [tokenizer(t, truncation=True, max_length=POSITIONS) for t in texts]
    ids = [e["input_ids"] for e in encoded]
    assert max(len(i) for i in ids) == POSITIONS, [len(i) for i in ids]
    embeddings = encoder.encode(texts, batch_size=3, convert_to_tensor=True)
    with torch.inference_mode():
        by_hand = torch.stack([
            model(input_ids=torch.tensor([e["input_ids"]]),
                  token_type_ids=torch.tensor([e["token_type_ids"]])
                  ).last_hidden_state[0].mean(dim=0)
            for e in encoded])
    write_golden(directory, "nomic_tiny", texts, ids, embeddings, by_hand,
                 {"hidden_size": D, "num_attention_heads": HEADS,
                  "num_hidden_layers": LAYERS, "intermediate_size": FFN,
                  "vocab_size": len(tokenizer), "rope_theta": 1000.0})


if __name__ == "__main__":
    main(sys.argv[1])
