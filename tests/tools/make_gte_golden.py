#!/usr/bin/env python3
"""Writes a small seeded GTE embedder (gte-base-en-v1.5 / gte-multilingual-base's
architecture) in both the layouts it ships in, and what it computes, for the tests of
attnserve's GTE family: rotary positions, token types, post-LN blocks of fused or
separate Q/K/V projections with biases, a gated GELU feed-forward (act(gate) * up)
without the first product's bias, LayerNorms with biases.

Run with the peers venv (`deploy/install-deps.sh --peers build/peers-venv` makes it):
  build/peers-venv/bin/python tests/tools/make_gte_golden.py tests/data

gte_tiny/: transformers' GteModel (model_type "gte") as save_pretrained writes it, in the
Hub's tensor names (encoder.layer.N.attention.qkv_proj [3d, d], attention.o_proj,
attn_ln, mlp.up_gate_proj [up; gate], mlp.down_proj, mlp_ln: transformers converts them
on load and back on save), wrapped as a sentence-transformers folder (CLS Pooling,
Normalize; gte's own pooling), with reranker_tiny's BERT WordPiece tokenizer;
rope_theta 160000 (GteConfig's default), 2 layers, hidden 64, 4 heads of 16,
intermediate 96, 8192 positions, 2 token types; texts up to 8192 tokens (the longest cut
there).

The same weights under the Hub's own config.json (model_type "new", Alibaba's code:
position_embedding_type "rope", rope_theta, rope_scaling {"type": "ntk", "factor":
2.0}; "hub_config" in the golden, which the tests write beside the weights) compute
GteModel's forward with the rotary inverse frequencies of that code's fixed NTK
scaling (its NTKScalingRotaryEmbedding without mixed_b), which always applies since
that code builds its cache for max_position_embeddings * factor positions: base theta
* factor, then each inverse frequency divided by factor^(2 / head_dim), in float32 as
that code computes them.

gte_tiny.golden.json: the texts, their token ids (with token types), the
sentence-transformers embeddings (normalized), GteModel's CLS states ("unnormalized"),
"ntk_embeddings" / "ntk_unnormalized" under the Hub's config, and "hub_config"; checked
here to agree.
"""
import json
import math
import os
import sys

import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seeded_bert import draw_norms_and_biases  # noqa: E402
from seeded_folder import long_text, save_pooled, start_folder  # noqa: E402

LAYERS, D, HEADS, FFN, POSITIONS = 2, 64, 4, 96, 8192
THETA, NTK_FACTOR = 160000.0, 2.0


def ntk_inv_freq(dim):
    """The Hub code's fixed NTK inverse frequencies (mixed_b None)."""
    base = THETA * NTK_FACTOR
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
    return inv_freq / NTK_FACTOR ** (2 / dim)


def hub_config(config):
    """gte_tiny's config.json as the Hub's checkpoints write it (model_type "new", Alibaba's
    own code's keys), with fixed NTK scaling."""
    return {
        "architectures": ["NewModel"], "model_type": "new",
        "auto_map": {"AutoConfig": "Alibaba-NLP/new-impl--configuration.NewConfig",
                     "AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"},
        "hidden_size": D, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
        "intermediate_size": FFN, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.0, "max_position_embeddings": POSITIONS,
        "type_vocab_size": config.type_vocab_size, "vocab_size": config.vocab_size,
        "layer_norm_eps": config.layer_norm_eps, "layer_norm_type": "layer_norm",
        "position_embedding_type": "rope", "rope_theta": THETA,
        "rope_scaling": {"type": "ntk", "factor": NTK_FACTOR}, "pack_qkv": True,
        "logn_attention_scale": False, "logn_attention_clip1": False,
        "unpad_inputs": False, "use_memory_efficient_attention": False,
        "pad_token_id": config.pad_token_id, "initializer_range": 0.02,
        "classifier_dropout": None, "torch_dtype": "float32"}


def main(directory):
    folder, tokenizer, sentences = start_folder(directory, "gte_tiny", "reranker_tiny",
                                                POSITIONS)
    torch.manual_seed(80)
    config = transformers.GteConfig(
        vocab_size=len(tokenizer), hidden_size=D, intermediate_size=FFN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, type_vocab_size=2,
        max_position_embeddings=POSITIONS, initializer_range=0.2,
        pad_token_id=tokenizer.pad_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": THETA})
    config._attn_implementation = "eager"
    model = draw_norms_and_biases(transformers.GteModel(config).eval())
    model.save_pretrained(folder)

    encoder = save_pooled(folder, D, POSITIONS, mode="cls")
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    assert "encoder.layer.0.attention.qkv_proj.weight" in tensors, sorted(tensors)
    assert "encoder.layer.0.mlp.up_gate_proj.weight" in tensors, sorted(tensors)

    texts = [" ".join(s.split()[:14]) for s in sentences[20:25]] + \
        [" ".join(sentences[160:180]), long_text(sentences, tokenizer, POSITIONS)]
    encoded = [tokenizer(t, truncation=True, max_length=POSITIONS) for t in texts]
    ids = [e["input_ids"] for e in encoded]
    assert max(len(i) for i in ids) == POSITIONS, [len(i) for i in ids]
    embeddings = encoder.encode(texts, batch_size=3, convert_to_tensor=True)

    def cls_states():
        with torch.inference_mode():
            return torch.stack([
                model(input_ids=torch.tensor([e["input_ids"]]),
                      token_type_ids=torch.tensor([e["token_type_ids"]])
                      ).last_hidden_state[0, 0]
                for e in encoded])

    by_hand = cls_states()
    rotary = model.rotary_emb
    assert torch.equal(rotary.inv_freq, 1.0 / (THETA ** (
        torch.arange(0, D // HEADS, 2).float() / (D // HEADS))))
    rotary.inv_freq = ntk_inv_freq(D // HEADS)
    ntk = cls_states()
    assert (ntk - by_hand).abs().max() > 1e-3, "the NTK frequencies must move the answer"
    normalized = torch.nn.functional.normalize(by_hand, dim=-1)
    assert torch.allclose(normalized, embeddings, atol=2e-5), \
        (normalized - embeddings).abs().max()

    def rows(t):
        return [[float(f"{v:.8g}") for v in row] for row in t.tolist()]
    golden = {
        "texts": texts, "token_ids": ids,
        "embeddings": rows(embeddings), "unnormalized": rows(by_hand),
        "ntk_embeddings": rows(torch.nn.functional.normalize(ntk, dim=-1)),
        "ntk_unnormalized": rows(ntk),
        "hub_config": hub_config(config),
        "config": {"hidden_size": D, "num_attention_heads": HEADS,
                   "num_hidden_layers": LAYERS, "intermediate_size": FFN,
                   "vocab_size": len(tokenizer), "rope_theta": THETA,
                   "ntk_factor": NTK_FACTOR,
                   "ntk_inv_freq": [float(v) for v in ntk_inv_freq(D // HEADS)]},
    }
    with open(os.path.join(directory, "gte_tiny.golden.json"), "w",
              encoding="utf-8") as f:
        json.dump(golden, f, indent=1)
    assert not math.isnan(float(ntk.sum()))


if __name__ == "__main__":
    main(sys.argv[1])
