#!/usr/bin/env python3
"""Writes a small seeded MPNet embedder and cross-encoder and what sentence-transformers
computes with them, for the tests of attnserve's MPNet family (config.json model_type
"mpnet": positions after the padding index 1, no token types, and a bucketed relative
position bias, encoder.relative_attention_bias [32, heads], added to every layer's
attention scores; all-mpnet-base-v2's architecture).

Run with the peers venv (`deploy/install-deps.sh --peers build/peers-venv` makes it):
  build/peers-venv/bin/python tests/tools/make_mpnet_golden.py tests/data

The models are transformers' MPNetModel and MPNetForSequenceClassification from a seeded
MPNetConfig (2 layers, hidden 32, 4 heads, intermediate 64, GELU, no dropout,
layer_norm_eps 1e-5, 32 buckets, max_position_embeddings 130: 128 usable positions,
so that the longest text reaches offsets past 91 tokens, where the buckets stop
growing). LayerNorms and biases are drawn at random as make_roberta_golden.py draws
them; the relative position bias from N(0, 1), so that it moves the attention (the
script checks that zeroing it moves the longest text's pooled values by more than
1e-3); the cross-encoder's classifier
weights from N(0, 1).

The tokenizer is all-mpnet-base-v2's recipe: a WordPiece vocabulary trained by
`tokenizers` (BertNormalizer lowercasing, BertPreTokenizer, 1000 tokens) on
tests/data/sentences.en.txt and the corpus of tests/data/tokenizer, with MPNet's
specials in its order (<s>=0 <pad>=1 </s>=2 <unk>=3, [UNK] the WordPiece unknown,
the other tokens in code point order, <mask> last with lstrip), made into transformers' MPNetTokenizer (RobertaProcessing:
<s> A </s> and <s> A </s></s> B </s>, all type ids 0). The ids are checked three ways, as
make_roberta_golden.py does.

Writes:
- mpnet_tiny/: MPNetModel by save_pretrained, the tokenizer, and sentence-transformers'
  files (Transformer with max_seq_length 128, mean Pooling, Normalize), with a prompt
  {"query": "query: "} in config_sentence_transformers.json.
- mpnet_tiny.golden.json: texts (make_roberta_golden.py's, the long one doubled so that
  it is cut at 128 tokens), their ids, SentenceTransformer.encode's embeddings without a
  prompt and with prompt_name "query" (and those ids), the pooled embeddings before
  Normalize; and MPNet's bucket of every offset in [-200, 200]
  (MPNetEncoder.relative_position_bucket), for the core's unit test.
- mpnet_reranker_tiny/ and mpnet_reranker_tiny.golden.json: a one-label
  MPNetForSequenceClassification (its encoder behind "mpnet.", the head
  classifier.dense + tanh + classifier.out_proj) with the same tokenizer, and
  CrossEncoder.predict's scores and the logits for make_roberta_golden.py's query and
  documents, in its reranker format.
"""
import json
import os
import shutil
import sys

import sentence_transformers
import tokenizers
import torch
import transformers
from sentence_transformers import CrossEncoder, SentenceTransformer
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_roberta_golden import (  # noqa: E402
    DOCUMENTS, LONG_TEXT, QUERY, TEXTS, FedInputs, rounded, seeded, training_texts,
    write_json)

SEEDS = {"mpnet_tiny": 91, "mpnet_reranker_tiny": 92}
LAYERS, D, HEADS, FFN = 2, 32, 4, 64
MAX_SEQ = 128
VOCAB = 1000
PROMPTS = {"query": "query: "}
MPNET_TEXTS = TEXTS[:-1] + [LONG_TEXT + " " + LONG_TEXT]
CONFIG_FIELDS = (
    "model_type", "vocab_size", "num_hidden_layers", "hidden_size",
    "num_attention_heads", "intermediate_size", "hidden_act", "max_position_embeddings",
    "relative_attention_num_buckets", "layer_norm_eps", "hidden_dropout_prob",
    "attention_probs_dropout_prob", "initializer_range", "pad_token_id")


def mpnet_tokenizer(texts):
    trained = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    trained.normalizer = normalizers.BertNormalizer(lowercase=True)
    trained.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trained.train_from_iterator(texts, trainers.WordPieceTrainer(
        vocab_size=VOCAB, show_progress=False,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "[UNK]"]))
    # The trainer numbers its alphabet in hash order, differently on every run: the
    # tokens after the specials are renumbered in code point order, so that a rerun
    # writes the same files.
    specials = ["<s>", "<pad>", "</s>", "<unk>", "[UNK]"]
    rest = sorted(t for t in trained.get_vocab() if t not in specials)
    vocab = {t: i for i, t in enumerate(specials + rest)}
    vocab["<mask>"] = len(vocab)
    tokenizer = transformers.MPNetTokenizer(vocab=vocab, model_max_length=MAX_SEQ)
    ids = [tokenizer.convert_tokens_to_ids(t)
           for t in ("<s>", "<pad>", "</s>", "<unk>", "<mask>")]
    assert ids == [0, 1, 2, 3, len(vocab) - 1], ids
    return tokenizer


def config_of(vocab, **extra):
    return transformers.MPNetConfig(
        vocab_size=vocab, hidden_size=D, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=FFN, hidden_act="gelu",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        max_position_embeddings=MAX_SEQ + 2, relative_attention_num_buckets=32,
        layer_norm_eps=1e-5, initializer_range=0.2, pad_token_id=1, **extra)


def seeded_mpnet(cls, config, seed, heads=()):
    model = seeded(cls, config, seed, heads)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("relative_attention_bias.weight"):
                parameter.normal_(0.0, 1.0)
    return model


def check_ids(folder, tokenizer, texts, token_ids, pairs=False):
    """The ids sentence-transformers made equal transformers' reloaded tokenizer's and
    `tokenizers`' own reading of tokenizer.json."""
    reloaded = transformers.AutoTokenizer.from_pretrained(folder)
    assert type(reloaded) is type(tokenizer), type(reloaded)
    raw = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    raw.enable_truncation(MAX_SEQ, strategy="longest_first")
    if pairs:
        assert token_ids == [reloaded(a, b, truncation="longest_first",
                                      max_length=MAX_SEQ)["input_ids"] for a, b in texts]
        encodings = raw.encode_batch(texts)
        assert all(set(e.type_ids) == {0} for e in encodings)
    else:
        assert token_ids == [reloaded(t, truncation=True, max_length=MAX_SEQ)["input_ids"]
                             for t in texts]
        encodings = raw.encode_batch(texts)
    assert token_ids == [e.ids for e in encodings]


def write_sentence_transformers_files(folder, versions):
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
               {"max_seq_length": MAX_SEQ, "do_lower_case": False})
    write_json(os.path.join(folder, "config_sentence_transformers.json"), {
        "__version__": {"sentence_transformers": versions["sentence_transformers"],
                        "transformers": versions["transformers"],
                        "pytorch": versions["torch"]},
        "model_type": "SentenceTransformer", "prompts": PROMPTS,
        "default_prompt_name": None, "similarity_fn_name": "cosine"})


def ids_of(features):
    return [ids[mask.bool()].tolist()
            for ids, mask in zip(features["input_ids"], features["attention_mask"])]


def embedder(directory, tokenizer, versions):
    name = "mpnet_tiny"
    config = config_of(len(tokenizer))
    folder = os.path.join(directory, name)
    shutil.rmtree(folder, ignore_errors=True)
    seeded_mpnet(transformers.MPNetModel, config, SEEDS[name]).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_sentence_transformers_files(folder, versions)

    pipeline = SentenceTransformer(folder, device="cpu")
    assert pipeline.max_seq_length == MAX_SEQ, pipeline.max_seq_length
    assert type(pipeline[0].auto_model) is transformers.MPNetModel
    features = pipeline.preprocess(MPNET_TEXTS)
    assert "token_type_ids" not in features, features.keys()
    token_ids = ids_of(features)
    check_ids(folder, tokenizer, MPNET_TEXTS, token_ids)
    assert [len(ids) == MAX_SEQ for ids in token_ids] == [
        t is MPNET_TEXTS[-1] for t in MPNET_TEXTS], "only the last text is cut"
    prompted = [PROMPTS["query"] + t for t in MPNET_TEXTS]
    prompt_ids = ids_of(pipeline.preprocess(prompted))
    check_ids(folder, tokenizer, prompted, prompt_ids)
    fed = FedInputs(pipeline[0].auto_model)
    embeddings = pipeline.encode(MPNET_TEXTS, convert_to_numpy=True)
    with_prompt = pipeline.encode(MPNET_TEXTS, prompt_name="query", convert_to_numpy=True)
    assert fed.keys == {"input_ids", "attention_mask"}, fed.keys
    pooled = SentenceTransformer(modules=list(pipeline)[:2], device="cpu").encode(
        MPNET_TEXTS, convert_to_numpy=True)
    model = pipeline[0].auto_model
    with torch.inference_mode():
        # One text at a time (no padding) agrees with the batch.
        for ids, row in zip(token_ids, pooled):
            alone = model(input_ids=torch.tensor([ids])).last_hidden_state[0].mean(0)
            assert torch.allclose(alone, torch.from_numpy(row), atol=1e-5)
        # The bias matters: without it the longest text's embedding moves.
        ids = torch.tensor([token_ids[-1]])
        with_bias = model(input_ids=ids).last_hidden_state[0].mean(0)
        saved = model.encoder.relative_attention_bias.weight.clone()
        model.encoder.relative_attention_bias.weight.zero_()
        without = model(input_ids=ids).last_hidden_state[0].mean(0)
        model.encoder.relative_attention_bias.weight.copy_(saved)
        moved = (with_bias - without).abs().max()
        assert moved > 1e-3, float(moved)  # 100 times the tests' tolerance
    offsets = list(range(-200, 201))
    buckets = MPNetEncoder.relative_position_bucket(torch.tensor(offsets)).tolist()
    golden = {
        "texts": MPNET_TEXTS,
        "max_seq_length": MAX_SEQ,
        "token_ids": token_ids,
        "embeddings": rounded(embeddings.tolist()),
        "unnormalized": rounded(pooled.tolist()),
        "prompt_name": "query",
        "prompt_token_ids": prompt_ids,
        "prompt_embeddings": rounded(with_prompt.tolist()),
        "pooling": "mean",
        "bucket_offsets": offsets,
        "buckets": buckets,
        "versions": versions,
        "config": {key: getattr(config, key) for key in CONFIG_FIELDS},
        "seed": SEEDS[name],
    }
    write_json(os.path.join(directory, name + ".golden.json"), golden, indent=1)


def reranker(directory, tokenizer, versions):
    name = "mpnet_reranker_tiny"
    cls = transformers.MPNetForSequenceClassification
    config = config_of(len(tokenizer), num_labels=1)
    folder = os.path.join(directory, name)
    shutil.rmtree(folder, ignore_errors=True)
    seeded_mpnet(cls, config, SEEDS[name], heads=("classifier.",)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)

    cross = CrossEncoder(folder, device="cpu")
    assert type(cross.model) is cls, type(cross.model)
    assert cross.max_seq_length == MAX_SEQ, cross.max_seq_length
    pairs = [[QUERY, document + " " + LONG_TEXT if document is LONG_TEXT else document]
             for document in DOCUMENTS]
    fed = FedInputs(cross.model)
    scores = cross.predict(pairs, batch_size=4, convert_to_numpy=True).tolist()
    assert fed.keys == {"input_ids", "attention_mask"}, fed.keys
    reloaded = transformers.AutoTokenizer.from_pretrained(folder)
    ids = [reloaded(a, b, truncation="longest_first", max_length=MAX_SEQ)["input_ids"]
           for a, b in pairs]
    check_ids(folder, tokenizer, pairs, ids, pairs=True)
    assert [len(i) == MAX_SEQ for i in ids] == [d is LONG_TEXT for d in DOCUMENTS]
    saved = cls.from_pretrained(folder).eval()
    with torch.inference_mode():
        logits = [saved(input_ids=torch.tensor([i])).logits[0, 0].item() for i in ids]
    assert torch.allclose(torch.sigmoid(torch.tensor(logits)), torch.tensor(scores),
                          atol=1e-6), (logits, scores)
    golden = {
        "query": QUERY,
        "documents": [b for _, b in pairs],
        "max_length": MAX_SEQ,
        "token_ids": ids,
        "logits": rounded(logits),
        "scores": rounded(scores),
        "versions": versions,
        "config": {key: getattr(config, key) for key in CONFIG_FIELDS + ("num_labels",)},
        "seed": SEEDS[name],
    }
    write_json(os.path.join(directory, name + ".golden.json"), golden, indent=1)


def main(directory):
    versions = {"transformers": transformers.__version__,
                "sentence_transformers": sentence_transformers.__version__,
                "torch": torch.__version__,
                "tokenizers": tokenizers.__version__}
    tokenizer = mpnet_tokenizer(training_texts(directory))
    embedder(directory, tokenizer, versions)
    reranker(directory, tokenizer, versions)


if __name__ == "__main__":
    main(sys.argv[1])
