"""Shared by the golden scripts that wrap a seeded checkpoint as a sentence-transformers
folder over another test model's tokenizer and write its golden file
(make_modernbert_golden.py, make_nomic_golden.py)."""
import json
import os
import shutil

import torch
import transformers
from sentence_transformers import SentenceTransformer, models


def start_folder(directory, name, tokenizer_source, max_length):
    """tests/data/NAME emptied, with TOKENIZER_SOURCE's tokenizer.json and
    tokenizer_config.json copied in (model_max_length set to MAX_LENGTH); returns the
    folder, the tokenizer transformers loads from it, and sentences.en.txt's lines."""
    with open(os.path.join(directory, "sentences.en.txt"), encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    folder = os.path.join(directory, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    source = os.path.join(directory, tokenizer_source)
    shutil.copy(os.path.join(source, "tokenizer.json"), folder)
    with open(os.path.join(source, "tokenizer_config.json"), encoding="utf-8") as f:
        tokenizer_config = json.load(f)
    tokenizer_config["model_max_length"] = max_length
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config, f, indent=2)
    return folder, transformers.AutoTokenizer.from_pretrained(folder), sentences


def long_text(sentences, tokenizer, tokens):
    """sentences.en.txt's lines, repeated as needed, joined into one text of more than
    TOKENS tokens (a model of TOKENS positions cuts it there)."""
    text = " ".join(sentences)
    while len(tokenizer(text)["input_ids"]) <= tokens:
        text = text + " " + text
    return text


def save_pooled(folder, width, max_length, mode="mean", prompts=None):
    """The checkpoint saved in FOLDER wrapped as Transformer (MAX_LENGTH tokens), Pooling
    in MODE and Normalize, with PROMPTS (name -> text) when given, saved there without a
    model card; returns the SentenceTransformer reloaded from the folder."""
    transformer = models.Transformer(folder, max_seq_length=max_length)
    pooling = models.Pooling(width, pooling_mode=mode)
    encoder = SentenceTransformer(modules=[transformer, pooling, models.Normalize()],
                                  device="cpu", prompts=prompts)
    encoder.save(folder)
    readme = os.path.join(folder, "README.md")
    if os.path.exists(readme):
        os.remove(readme)
    return SentenceTransformer(folder, device="cpu")


def write_golden(directory, name, texts, ids, embeddings, by_hand, config):
    """tests/data/NAME.golden.json: the texts, their token ids, the encoder's (normalized)
    EMBEDDINGS and the model's mean-pooled last hidden states BY_HAND ("unnormalized"),
    after checking that BY_HAND normalized agrees with EMBEDDINGS (2e-5)."""
    normalized = torch.nn.functional.normalize(by_hand, dim=-1)
    assert torch.allclose(normalized, embeddings, atol=2e-5), \
        (normalized - embeddings).abs().max()
    golden = {
        "texts": texts,
        "token_ids": ids,
        "embeddings": [[float(f"{v:.8g}") for v in row] for row in embeddings.tolist()],
        "unnormalized": [[float(f"{v:.8g}") for v in row] for row in by_hand.tolist()],
        "config": config,
    }
    with open(os.path.join(directory, name + ".golden.json"), "w",
              encoding="utf-8") as f:
        json.dump(golden, f, indent=1)
