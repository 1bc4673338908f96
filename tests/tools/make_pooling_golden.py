#!/usr/bin/env python3
"""Writes what sentence-transformers' Pooling makes of the seeded RoBERTa model of
tests/data/roberta_tiny (tests/tools/make_roberta_golden.py) in each of its modes, for
the tests of attnserve's pooling modes; and what a folder sentence-transformers 6 saves
itself looks like and embeds.

Run with the peers venv (`deploy/install-deps.sh --peers build/peers-venv` makes it):
  build/peers-venv/bin/python tests/tools/make_pooling_golden.py tests/data

Writes tests/data/pooling_modes.golden.json:
- "texts": roberta_tiny.golden.json's texts;
- "modes": for each mode sentence-transformers 6 knows (cls, max, mean,
  mean_sqrt_len_tokens, weightedmean, lasttoken), the embeddings of
  SentenceTransformer([Transformer(roberta_tiny, max_seq_length=64), Pooling(mode)])
  .encode(texts) (no Normalize), rounded to 8 significant digits;
- "st6": the model saved by sentence-transformers 6 itself with max_seq_length 16 and
  weightedmean pooling, then loaded back: the text of each small file it wrote
  (modules.json, sentence_bert_config.json, 1_Pooling/config.json, tokenizer_config.json,
  config_sentence_transformers.json) and the embeddings of that load (normalized, as
  its Normalize module makes them), with the token ids it fed the model;
- "prompts": roberta_tiny as it is (mean pooling, Normalize) with the prompts
  {"query": "query: ", "passage": "passage: "} and default_prompt_name "query", saved by
  sentence-transformers 6 and loaded back: its config_sentence_transformers.json, the
  token ids and embeddings of encode(texts) (the default prompt) and of
  encode(texts, prompt_name="passage");
- "dense": roberta_tiny with two sentence-transformers Dense modules after its mean
  pooling (32 -> 24 with Tanh and a bias, 24 -> 16 with no activation and no bias) and
  Normalize, seeded, saved by sentence-transformers 6: its modules.json, and the
  embeddings of that load; the Dense modules' folders (config.json, model.safetensors)
  go to tests/data/roberta_dense_tiny/.
- the versions used.
"""
import json
import os
import sys
import tempfile

import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer, models

OUT = sys.argv[1]
SOURCE = os.path.join(OUT, "roberta_tiny")
MODES = ["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]
ST6_FILES = ["modules.json", "sentence_bert_config.json", "1_Pooling/config.json",
             "tokenizer_config.json", "config_sentence_transformers.json"]


def rounded(array):
    return [[float(f"{v:.8g}") for v in row] for row in array.tolist()]


def main():
    torch.manual_seed(0)
    with open(os.path.join(OUT, "roberta_tiny.golden.json"), encoding="utf-8") as f:
        texts = json.load(f)["texts"]
    golden = {"source": "tests/data/roberta_tiny", "texts": texts, "modes": {}}
    for mode in MODES:
        transformer = models.Transformer(SOURCE, max_seq_length=64)
        pooling = models.Pooling(transformer.get_embedding_dimension(),
                                 pooling_mode=mode)
        model = SentenceTransformer(modules=[transformer, pooling], device="cpu")
        embeddings = model.encode(texts, batch_size=4, convert_to_numpy=True)
        golden["modes"][mode] = rounded(embeddings)

    transformer = models.Transformer(SOURCE, max_seq_length=16)
    pooling = models.Pooling(transformer.get_embedding_dimension(),
                             pooling_mode="weightedmean")
    model = SentenceTransformer(modules=[transformer, pooling, models.Normalize()],
                                device="cpu")
    with tempfile.TemporaryDirectory() as folder:
        model.save(folder)
        loaded = SentenceTransformer(folder, device="cpu")
        assert loaded.max_seq_length == 16, loaded.max_seq_length
        files = {}
        for name in ST6_FILES:
            path = os.path.join(folder, name)
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    files[name] = f.read()
        ids = [loaded.tokenize([text])["input_ids"][0].tolist() for text in texts]
        embeddings = loaded.encode(texts, batch_size=4, convert_to_numpy=True)
    golden["st6"] = {"files": files, "max_seq_length": 16, "token_ids": ids,
                     "embeddings": rounded(embeddings)}
    model = SentenceTransformer(SOURCE, device="cpu")
    model.prompts = {"query": "query: ", "passage": "passage: "}
    model.default_prompt_name = "query"
    with tempfile.TemporaryDirectory() as folder:
        model.save(folder)
        loaded = SentenceTransformer(folder, device="cpu")
        with open(os.path.join(folder, "config_sentence_transformers.json"),
                  encoding="utf-8") as f:
            config = f.read()
        prompts = {"config_sentence_transformers.json": config,
                   "max_seq_length": loaded.max_seq_length}
        for name, prompt_name in (("default", None), ("passage", "passage")):
            prompt = loaded.prompts[prompt_name or loaded.default_prompt_name]
            ids = [loaded.tokenize([prompt + text])["input_ids"][0].tolist()
                   for text in texts]
            embeddings = loaded.encode(texts, prompt_name=prompt_name, batch_size=4,
                                       convert_to_numpy=True)
            prompts[name] = {"token_ids": ids, "embeddings": rounded(embeddings)}
    golden["prompts"] = prompts

    torch.manual_seed(5)
    transformer = models.Transformer(SOURCE, max_seq_length=64)
    pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    first = models.Dense(32, 24, bias=True, activation_function=torch.nn.Tanh())
    second = models.Dense(24, 16, bias=False, activation_function=torch.nn.Identity())
    with torch.no_grad():
        first.linear.bias.uniform_(-0.5, 0.5)
    model = SentenceTransformer(
        modules=[transformer, pooling, first, second, models.Normalize()], device="cpu")
    dense_out = os.path.join(OUT, "roberta_dense_tiny")
    with tempfile.TemporaryDirectory() as folder:
        model.save(folder)
        loaded = SentenceTransformer(folder, device="cpu")
        with open(os.path.join(folder, "modules.json"), encoding="utf-8") as f:
            modules = f.read()
        embeddings = loaded.encode(texts, batch_size=4, convert_to_numpy=True)
        for entry in json.loads(modules):
            if entry["type"].endswith("Dense"):
                target = os.path.join(dense_out, entry["path"])
                os.makedirs(target, exist_ok=True)
                for name in ("config.json", "model.safetensors"):
                    with open(os.path.join(folder, entry["path"], name), "rb") as src, \
                            open(os.path.join(target, name), "wb") as dst:
                        dst.write(src.read())
    golden["dense"] = {"modules.json": modules, "embeddings": rounded(embeddings)}
    golden["versions"] = {"sentence-transformers": sentence_transformers.__version__,
                          "transformers": transformers.__version__,
                          "torch": torch.__version__}
    with open(os.path.join(OUT, "pooling_modes.golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
