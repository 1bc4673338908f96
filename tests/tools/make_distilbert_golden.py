#!/usr/bin/env python3
"""Writes a small seeded DistilBERT sentence-transformers model and the embeddings
sentence-transformers computes with it, for the tests of attnserve's DistilBERT loader
(config.json model_type "distilbert": its own tensor names, no token types, LayerNorm
eps 1e-12 fixed in the code rather than in config.json).

Run with the peers venv (`deploy/install-deps.sh --peers build/peers-venv` makes it):
  build/peers-venv/bin/python tests/tools/make_distilbert_golden.py tests/data

The model is transformers' DistilBertModel from a seeded DistilBertConfig (2 layers,
dim 32, 4 heads, hidden_dim 64, 64 learned positions, GELU, no dropout), fp32, with the
WordPiece tokenizer of tests/data/reranker_tiny (its tokenizer.json; the inputs are
input_ids and attention_mask, as DistilBERT's tokenizers give them). Every LayerNorm's
scale and bias and every Linear's bias is drawn at random (the initializer leaves them
1 and 0, which would let a loader that skips one pass); seeded_bert.py's helper is not
used because it finds norms by the name "LayerNorm", and DistilBERT's blocks call theirs
sa_layer_norm and output_layer_norm.

Writes:
- distilbert_tiny/: the model by save_pretrained (config.json, model.safetensors with
  DistilBERT's own tensor names, no "distilbert." prefix), the tokenizer, and the
  sentence-transformers files of a Transformer, mean Pooling, Normalize pipeline in the
  layout the Hub's models carry and attnserve reads (modules.json with
  sentence_transformers.models.* types, 1_Pooling/config.json with pooling_mode_* flags,
  sentence_bert_config.json with max_seq_length 64). sentence-transformers 6 saves a
  newer layout (module paths under sentence_transformers.base, "pooling_mode": "mean",
  max_seq_length in tokenizer_config.json only), so these files are written here; it
  still loads this one, and the golden comes from that load.
- distilbert_tiny.golden.json: the texts (one long enough to be truncated at 64 tokens),
  their token ids as sentence-transformers makes them, the pipeline's embeddings
  (SentenceTransformer.encode, L2-normalized), the mean-pooled embeddings before
  Normalize ("unnormalized"), all rounded to 8 significant digits; the versions used and
  the DistilBertConfig fields set.
"""
import json
import os
import shutil
import sys

import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer

SEED = 71
LAYERS, D, HEADS, FFN, POSITIONS = 2, 32, 4, 64, 64
INIT_STD = 0.2  # initializer_range: the std of every weight matrix and embedding
TEXTS = [
    "Hello!",
    "The quick brown fox jumps over the lazy dog.",
    "She ordered a café au lait and paid 3.50 euros, didn't she?",
    "In 1969, about 600 million people watched the Moon landing on television.",
    "Wait -- what (exactly) do you mean by \"soon\"?",
    "The temperature reached 40°C in Zürich; nobody expected it.",
    "Free software gives every user the freedom to run, study, share and change it.",
    "A long text: the license grants each person who receives a copy of the program the "
    "right to run it for any purpose, to study how it works and adapt it to their needs, "
    "to redistribute copies so they can help their neighbours, and to improve the program "
    "and release those improvements to the public, so that the whole community benefits; "
    "access to the source code is a precondition for all of this, and nobody may take "
    "these freedoms away from the people who come after them.",
]


def seeded_model(vocab):
    torch.manual_seed(SEED)
    config = transformers.DistilBertConfig(
        vocab_size=vocab, n_layers=LAYERS, dim=D, n_heads=HEADS, hidden_dim=FFN,
        max_position_embeddings=POSITIONS, activation="gelu", sinusoidal_pos_embds=False,
        dropout=0.0, attention_dropout=0.0, initializer_range=INIT_STD)
    model = transformers.DistilBertModel(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
            elif isinstance(module, torch.nn.Linear):
                module.bias.uniform_(-0.2, 0.2)
    return model, config


def write_json(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def write_sentence_transformers_files(folder, versions):
    """modules.json, 1_Pooling/config.json, sentence_bert_config.json and
    config_sentence_transformers.json as sentence-transformers 2 to 5 save them."""
    write_json(os.path.join(folder, "modules.json"), [
        {"idx": 0, "name": "0", "path": "",
         "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}])
    write_json(os.path.join(folder, "1_Pooling", "config.json"), {
        "word_embedding_dimension": D, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": False,
        "include_prompt": True})
    write_json(os.path.join(folder, "sentence_bert_config.json"),
               {"max_seq_length": POSITIONS, "do_lower_case": False})
    write_json(os.path.join(folder, "config_sentence_transformers.json"), {
        "__version__": {"sentence_transformers": versions["sentence_transformers"],
                        "transformers": versions["transformers"],
                        "pytorch": versions["torch"]},
        "model_type": "SentenceTransformer", "prompts": {}, "default_prompt_name": None,
        "similarity_fn_name": "cosine"})


def rounded(rows):
    return [[float(f"{float(x):.8g}") for x in row] for row in rows]


def main(directory):
    versions = {"transformers": transformers.__version__,
                "sentence_transformers": sentence_transformers.__version__,
                "torch": torch.__version__}
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        os.path.join(directory, "reranker_tiny"),
        model_input_names=["input_ids", "attention_mask"])
    model, config = seeded_model(len(tokenizer))
    folder = os.path.join(directory, "distilbert_tiny")
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_sentence_transformers_files(folder, versions)

    pipeline = SentenceTransformer(folder, device="cpu")
    assert pipeline.max_seq_length == POSITIONS, pipeline.max_seq_length
    assert [type(m).__name__ for m in pipeline] == ["Transformer", "Pooling", "Normalize"]
    features = pipeline.preprocess(TEXTS)
    token_ids = [ids[mask.bool()].tolist()
                 for ids, mask in zip(features["input_ids"], features["attention_mask"])]
    reloaded = transformers.AutoTokenizer.from_pretrained(folder)
    assert token_ids == [reloaded(t, truncation=True, max_length=POSITIONS)["input_ids"]
                         for t in TEXTS]
    assert max(len(ids) for ids in token_ids) == POSITIONS, "no text is truncated"
    embeddings = pipeline.encode(TEXTS, convert_to_numpy=True)
    pooled = SentenceTransformer(modules=list(pipeline)[:2], device="cpu").encode(
        TEXTS, convert_to_numpy=True)
    golden = {
        "texts": TEXTS,
        "max_seq_length": POSITIONS,
        "token_ids": token_ids,
        "embeddings": rounded(embeddings.tolist()),
        "unnormalized": rounded(pooled.tolist()),
        "versions": versions,
        "config": {key: getattr(config, key) for key in (
            "vocab_size", "n_layers", "dim", "n_heads", "hidden_dim",
            "max_position_embeddings", "activation", "sinusoidal_pos_embds", "dropout",
            "attention_dropout", "initializer_range", "pad_token_id")},
        "seed": SEED,
    }
    write_json(os.path.join(directory, "distilbert_tiny.golden.json"), golden)


if __name__ == "__main__":
    main(sys.argv[1])
