#!/usr/bin/env python3
"""Writes a small pre-LN encoder and its outputs computed by Hugging Face transformers, for
tests/core/transformer_encoder_test and tests/server/encoder_config_test.

Run with the peers venv (`make bench-encoder` or `deploy/install-deps.sh --peers
build/peers-venv` makes it):
  build/peers-venv/bin/python tests/tools/make_pre_ln_golden.py tests/data

The model is transformers' MegatronBertModel (model_type "megatron-bert": BERT with each
LayerNorm moved before its sublayer, a final LayerNorm after the last block and none after
the embeddings), seeded, with its layer norms and biases drawn at random so that the test
exercises them, saved by save_pretrained as a user would serve it: megatron_tiny/config.json
and megatron_tiny/model.safetensors (the pooler included: the loader ignores it).

Outputs: transformers' own forward pass, one sequence at a time (no padding), in fp32.
megatron_tiny.io.safetensors holds token_ids, token_types and lengths (as float32), the
last hidden state packed [sum(L), d] and the mean-pooled, L2-normalized embeddings [n, d].
"""
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "client", "python"))
from attnserve_export import write_safetensors  # noqa: E402

LAYERS, D, HEADS, FFN = 2, 64, 4, 128
VOCAB, POSITIONS, TYPES, EPS = 100, 64, 2, 1e-12
LENGTHS = [5, 1, 17, 9, 40]


def main(directory):
    torch.manual_seed(261)
    config = transformers.MegatronBertConfig(
        vocab_size=VOCAB, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=FFN, hidden_act="gelu", max_position_embeddings=POSITIONS,
        type_vocab_size=TYPES, layer_norm_eps=EPS, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)
    model = transformers.MegatronBertModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("ln.weight"):
                parameter.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                parameter.uniform_(-0.2, 0.2)
    folder = os.path.join(directory, "megatron_tiny")
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    ids = [torch.randint(0, VOCAB, (length,)) for length in LENGTHS]
    token_types = [torch.randint(0, TYPES, (length,)) for length in LENGTHS]
    hidden, pooled = [], []
    with torch.inference_mode():
        for sequence, kinds in zip(ids, token_types):
            out = model(input_ids=sequence.unsqueeze(0),
                        token_type_ids=kinds.unsqueeze(0)).last_hidden_state[0]
            hidden.append(out)
            mean = out.mean(dim=0)
            pooled.append(mean / mean.norm())
    write_safetensors(
        os.path.join(directory, "megatron_tiny.io.safetensors"),
        {"token_ids": torch.cat(ids).float(), "token_types": torch.cat(token_types).float(),
         "lengths": torch.tensor(LENGTHS, dtype=torch.float32),
         "hidden": torch.cat(hidden), "pooled": torch.stack(pooled)},
        metadata={"layers": LAYERS, "d_model": D, "heads": HEADS, "ffn_dim": FFN,
                  "vocab_size": VOCAB, "max_positions": POSITIONS, "type_vocab_size": TYPES,
                  "layer_norm_eps": EPS, "torch": torch.__version__,
                  "transformers": transformers.__version__})


if __name__ == "__main__":
    main(sys.argv[1])
