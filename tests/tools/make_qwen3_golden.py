#!/usr/bin/env python3
"""Writes a small seeded Qwen3 decoder embedder (a sentence-transformers folder over
transformers' Qwen3Model, as Qwen3-Embedding is) and what sentence-transformers computes
with it, for the tests of attnserve's Qwen family: causal attention, grouped-query
attention (2 key/value heads for 4 query heads), heads wider than hidden_size / heads
(head_dim 32 in a model of 64, as Qwen3-0.6B's 128 in 1024), per-head RMS norms of Q
and K, rotary positions, RMSNorm pre-norm blocks and a final norm, a SwiGLU feed-forward
(down(silu(gate x) * up x)), no biases; last-token pooling, Normalize, and an
instruction prompt on the query side.

Run with the peers venv (`deploy/install-deps.sh --peers build/peers-venv` makes it):
  build/peers-venv/bin/python tests/tools/make_qwen3_golden.py tests/data

The tokenizer is roberta_tiny's byte-level BPE (its tokenizer.json copied) with Qwen3-
Embedding's post-processor: every text ends with the end-of-text token (here </s>),
which the last-token pooling reads. The model: 2 layers, hidden 64, 4 heads of 32, 2
key/value heads, intermediate 96, rope_theta 1e6, 8192 positions, fp32; every RMSNorm
scale drawn in [0.5, 1.5] so that a loader skipping one is caught. Texts: short
sentences (three with the query prompt), one of about 1,500 tokens and one cut at
8,192 (its end-of-text token kept).

Writes qwen3_tiny/ (config.json and model.safetensors with transformers' own names, the
tokenizer, modules.json with Transformer (max_seq_length 8192), last-token Pooling and
Normalize, config_sentence_transformers.json with the "query" prompt) and
qwen3_tiny.golden.json: the texts (prompt included), their token ids,
SentenceTransformer.encode's embeddings (normalized) and Qwen3Model's last hidden state
at the last token, each text alone ("unnormalized"), checked here to agree. The same for
qwen2_tiny/: a Qwen2Model (seed 71) with Q, K and V biases, no query/key norms and heads
of 16, its tokenizer as sentence-transformers saves it for a Qwen2 model (transformers'
Qwen2Tokenizer: Qwen's pre-tokenizer regex, which splits digits one by one).
"""
import json
import os
import shutil
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seeded_folder import long_text, save_pooled, write_golden  # noqa: E402

LAYERS, D, HEADS, KV_HEADS, HEAD_DIM, FFN, POSITIONS = 2, 64, 4, 2, 32, 96, 8192
PROMPT = "Instruct: Given a web search query, retrieve relevant passages\nQuery:"


def write_tokenizer(directory, folder):
    """roberta_tiny's byte-level BPE, its post-processor Qwen3-Embedding's."""
    with open(os.path.join(directory, "roberta_tiny", "tokenizer.json"),
              encoding="utf-8") as f:
        tokenizer = json.load(f)
    eos = "</s>"
    eos_id = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == eos)
    tokenizer["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"Sequence": {"id": "A", "type_id": 0}},
                        {"SpecialToken": {"id": eos, "type_id": 0}}],
             "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": eos, "type_id": 0}},
                      {"Sequence": {"id": "B", "type_id": 1}},
                      {"SpecialToken": {"id": eos, "type_id": 1}}],
             "special_tokens": {eos: {"id": eos, "ids": [eos_id], "tokens": [eos]}}},
        ],
    }
    tokenizer["truncation"] = None
    tokenizer["padding"] = None
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos,
                   "pad_token": "<pad>", "model_max_length": POSITIONS}, f, indent=2)
    return transformers.AutoTokenizer.from_pretrained(folder)


def main(directory):
    write_model(directory, "qwen3_tiny", 70)
    write_model(directory, "qwen2_tiny", 71)


def write_model(directory, name, seed):
    """qwen3_tiny (Qwen3Model as above) or qwen2_tiny: Qwen2Model over the same tokenizer
    and texts, its Q, K and V with biases (drawn in [-0.2, 0.2]), no query/key norms,
    heads of hidden_size / heads (16), 2 key/value heads."""
    with open(os.path.join(directory, "sentences.en.txt"), encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    folder = os.path.join(directory, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    tokenizer = write_tokenizer(directory, folder)

    torch.manual_seed(seed)
    qwen3 = name == "qwen3_tiny"
    # Qwen2's folder gets transformers' Qwen2Tokenizer when sentence-transformers loads
    # and saves it (Qwen's own pre-tokenizer, digits one by one, and <|endoftext|> added
    # after the vocabulary): its table has room, as Qwen's padded vocabularies do.
    common = dict(
        vocab_size=len(tokenizer) + (0 if qwen3 else 24), hidden_size=D, intermediate_size=FFN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=POSITIONS, initializer_range=0.2, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False)
    if qwen3:
        config = transformers.Qwen3Config(head_dim=HEAD_DIM, **common)
    else:
        config = transformers.Qwen2Config(**common)
    config._attn_implementation = "eager"
    model = (transformers.Qwen3Model if qwen3 else transformers.Qwen2Model)(config).eval()
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("norm.weight"):  # every RMSNorm
                parameter.uniform_(0.5, 1.5)
            elif parameter_name.endswith(".bias"):  # Qwen2's Q, K and V
                parameter.uniform_(-0.2, 0.2)
    model.save_pretrained(folder)

    encoder = save_pooled(folder, D, POSITIONS, mode="lasttoken", prompts={"query": PROMPT})
    assert encoder.prompts.get("query") == PROMPT, encoder.prompts
    tokenizer = encoder.tokenizer  # as saved beside the model, which the server reads

    queries = [" ".join(s.split()[:10]) for s in sentences[60:63]]
    documents = [" ".join(s.split()[:14]) for s in sentences[63:66]] + \
        [" ".join(sentences[130:150])]
    documents.append(long_text(sentences, tokenizer, POSITIONS))
    texts = [PROMPT + q for q in queries] + documents
    ids = [tokenizer(t, truncation=True, max_length=POSITIONS)["input_ids"] for t in texts]
    assert all(i[-1] == tokenizer.eos_token_id for i in ids)
    assert max(len(i) for i in ids) == POSITIONS, [len(i) for i in ids]
    embeddings = torch.cat([
        encoder.encode(queries, prompt_name="query", batch_size=2,
                       convert_to_tensor=True),
        encoder.encode(documents, batch_size=2, convert_to_tensor=True)])
    with torch.inference_mode():
        by_hand = torch.stack([
            model(input_ids=torch.tensor([i])).last_hidden_state[0, -1] for i in ids])
    write_golden(directory, name, texts, ids, embeddings, by_hand,
                 {"hidden_size": D, "num_attention_heads": HEADS,
                  "num_key_value_heads": KV_HEADS,
                  "head_dim": HEAD_DIM if qwen3 else D // HEADS,
                  "num_hidden_layers": LAYERS, "intermediate_size": FFN,
                  "vocab_size": config.vocab_size, "rope_theta": 1e6,
                  "query_prompt": PROMPT})


if __name__ == "__main__":
    main(sys.argv[1])
