#!/usr/bin/env python3
"""Writes a small seeded ModernBERT embedder (a sentence-transformers folder over
transformers' ModernBertModel) and what sentence-transformers computes with it, for the
tests of attnserve's ModernBERT family: rotary positions (a theta per layer type),
alternating global and local (sliding-window) attention, a gated GELU feed-forward
(Wi = [input; gate]), pre-LN blocks whose first has no attention norm, a norm after the
embeddings and one after the last block, no biases.

Run with the peers venv (`deploy/install-deps.sh --peers build/peers-venv` makes it):
  build/peers-venv/bin/python tests/tools/make_modernbert_golden.py tests/data

The tokenizer is roberta_tiny's byte-level BPE (its files copied, model_max_length
raised to 8192), so a rerun writes the same folder. The model: 3 layers (global, local,
global: global_attn_every_n_layers 2), hidden 64, 4 heads of 16, intermediate 96,
local_attention 16 (each token of a local layer sees 8 on either side), rope_theta
160000 (global) and 10000 (local), 8192 positions, fp32, every LayerNorm scale drawn in
[0.5, 1.5] (the initializer leaves them 1, which would let a loader that skips one
pass). Texts: short sentences, and three long ones (about 300 and 1000 tokens, and one
cut at 8192) that reach far past the window and into large rotary angles.

Writes modernbert_tiny/ (config.json as save_pretrained writes it, with layer_types and
rope_parameters; model.safetensors; the tokenizer; modules.json with Transformer
(max_seq_length 8192), mean Pooling and Normalize) and modernbert_tiny.golden.json: the
texts (the longest cut at 8192 tokens), their token ids, SentenceTransformer.encode's
embeddings (normalized, batched with padding) and ModernBertModel's last hidden state
mean-pooled, each text alone ("unnormalized"), checked here to agree.
"""
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seeded_folder import long_text, save_pooled, start_folder, write_golden  # noqa: E402

LAYERS, D, HEADS, FFN, POSITIONS = 3, 64, 4, 96, 8192


def main(directory):
    folder, tokenizer, sentences = start_folder(directory, "modernbert_tiny", "roberta_tiny",
                                                POSITIONS)

    torch.manual_seed(49)
    config = transformers.ModernBertConfig(
        vocab_size=len(tokenizer), hidden_size=D, intermediate_size=FFN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        max_position_embeddings=POSITIONS, local_attention=16,
        global_attn_every_n_layers=2, global_rope_theta=160000.0,
        local_rope_theta=10000.0, initializer_range=0.2,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, cls_token_id=tokenizer.bos_token_id,
        sep_token_id=tokenizer.eos_token_id)
    config._attn_implementation = "eager"
    model = transformers.ModernBertModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
    model.save_pretrained(folder)

    encoder = save_pooled(folder, D, POSITIONS)

    texts = [" ".join(s.split()[:14]) for s in sentences[80:86]] + \
        [" ".join(sentences[100:112]), " ".join(sentences[120:160]),
         long_text(sentences, tokenizer, POSITIONS)]
    ids = [tokenizer(t, truncation=True, max_length=POSITIONS)["input_ids"]
           for t in texts]
    lengths = [len(i) for i in ids]
    assert max(lengths) == POSITIONS and sorted(lengths)[-2] > 900, lengths
    embeddings = encoder.encode(texts, batch_size=3, convert_to_tensor=True)
    # The same by hand: each text alone through ModernBertModel, mean over its tokens.
    with torch.inference_mode():
        by_hand = torch.stack([
            model(input_ids=torch.tensor([i])).last_hidden_state[0].mean(dim=0)
            for i in ids])
    write_golden(directory, "modernbert_tiny", texts, ids, embeddings, by_hand,
                 {"hidden_size": D, "num_attention_heads": HEADS,
                  "num_hidden_layers": LAYERS, "intermediate_size": FFN,
                  "local_attention": 16, "vocab_size": len(tokenizer)})


if __name__ == "__main__":
    main(sys.argv[1])
