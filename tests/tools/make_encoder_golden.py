#!/usr/bin/python3
"""Writes golden outputs of a small BERT-shaped encoder computed by PyTorch, for
tests/core/transformer_encoder_test.

Run with Debian's python3-torch: /usr/bin/python3 tests/tools/make_encoder_golden.py tests/data

The encoder is PyTorch's own modules, seeded: nn.Embedding (words, positions, token
types) and nn.LayerNorm, then nn.TransformerEncoderLayer with norm_first=False,
activation="gelu" (erf) and layer_norm_eps=1e-12, which is BERT's post-LN block. Its
weights are written under Hugging Face's BERT names (embeddings.word_embeddings.weight,
encoder.layer.N.attention.self.query.weight, ...), the file a user would serve, so that
the test also checks the loader's name mapping. Written with the exporter's safetensors
writer, so no package beyond torch is needed.

Files: encoder_tiny.weights.safetensors (the model) and encoder_tiny.io.safetensors
(token ids, token types and lengths as float32, the last hidden state packed
[sum(L), d], the mean-pooled and L2-normalized embeddings [n, d], and the settings as
metadata).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "client", "python"))
from attnserve_export import write_safetensors  # noqa: E402

LAYERS, D, HEADS, FFN = 2, 64, 4, 128
VOCAB, POSITIONS, TYPES, EPS = 100, 64, 2, 1e-12
LENGTHS = [5, 1, 17, 9]


def main(directory):
    torch.manual_seed(26)
    words = torch.nn.Embedding(VOCAB, D)
    positions = torch.nn.Embedding(POSITIONS, D)
    types = torch.nn.Embedding(TYPES, D)
    norm = torch.nn.LayerNorm(D, eps=EPS)
    blocks = [torch.nn.TransformerEncoderLayer(
        D, HEADS, FFN, dropout=0.0, activation="gelu", layer_norm_eps=EPS,
        batch_first=True, norm_first=False).eval() for _ in range(LAYERS)]
    with torch.no_grad():
        # PyTorch starts LayerNorm at 1/0 and attention biases at 0: random values make
        # the test exercise them.
        for module in [norm] + [b.norm1 for b in blocks] + [b.norm2 for b in blocks]:
            module.weight.uniform_(0.5, 1.5)
            module.bias.uniform_(-0.2, 0.2)
        for block in blocks:
            block.self_attn.in_proj_bias.uniform_(-0.2, 0.2)
            block.self_attn.out_proj.bias.uniform_(-0.2, 0.2)
    ids = [torch.randint(0, VOCAB, (length,)) for length in LENGTHS]
    token_types = [torch.randint(0, TYPES, (length,)) for length in LENGTHS]
    hidden, pooled = [], []
    with torch.inference_mode():
        for sequence, kinds in zip(ids, token_types):
            x = words(sequence) + positions(torch.arange(len(sequence))) + types(kinds)
            x = norm(x).unsqueeze(0)
            for block in blocks:
                # The math path (no fused fast path), as a reference.
                x = block.norm1(x + block._sa_block(x, None, None))
                x = block.norm2(x + block._ff_block(x))
            x = x.squeeze(0)
            hidden.append(x)
            mean = x.mean(dim=0)
            pooled.append(mean / mean.norm())
    state = {
        "embeddings.word_embeddings.weight": words.weight,
        "embeddings.position_embeddings.weight": positions.weight,
        "embeddings.token_type_embeddings.weight": types.weight,
        "embeddings.LayerNorm.weight": norm.weight,
        "embeddings.LayerNorm.bias": norm.bias,
    }
    for n, block in enumerate(blocks):
        prefix = f"encoder.layer.{n}."
        w, b = block.self_attn.in_proj_weight, block.self_attn.in_proj_bias
        for i, name in enumerate(("query", "key", "value")):
            state[prefix + f"attention.self.{name}.weight"] = w[i * D:(i + 1) * D]
            state[prefix + f"attention.self.{name}.bias"] = b[i * D:(i + 1) * D]
        state[prefix + "attention.output.dense.weight"] = block.self_attn.out_proj.weight
        state[prefix + "attention.output.dense.bias"] = block.self_attn.out_proj.bias
        state[prefix + "attention.output.LayerNorm.weight"] = block.norm1.weight
        state[prefix + "attention.output.LayerNorm.bias"] = block.norm1.bias
        state[prefix + "intermediate.dense.weight"] = block.linear1.weight
        state[prefix + "intermediate.dense.bias"] = block.linear1.bias
        state[prefix + "output.dense.weight"] = block.linear2.weight
        state[prefix + "output.dense.bias"] = block.linear2.bias
        state[prefix + "output.LayerNorm.weight"] = block.norm2.weight
        state[prefix + "output.LayerNorm.bias"] = block.norm2.bias
    write_safetensors(os.path.join(directory, "encoder_tiny.weights.safetensors"), state)
    write_safetensors(
        os.path.join(directory, "encoder_tiny.io.safetensors"),
        {"token_ids": torch.cat(ids).float(), "token_types": torch.cat(token_types).float(),
         "lengths": torch.tensor(LENGTHS, dtype=torch.float32),
         "hidden": torch.cat(hidden), "pooled": torch.stack(pooled)},
        metadata={"layers": LAYERS, "d_model": D, "heads": HEADS, "ffn_dim": FFN,
                  "vocab_size": VOCAB, "max_positions": POSITIONS, "type_vocab_size": TYPES,
                  "layer_norm_eps": EPS, "torch": torch.__version__})


if __name__ == "__main__":
    main(sys.argv[1])
