#!/usr/bin/env python3
"""Writes two small BERT cross-encoders and their outputs computed by sentence-transformers
and Hugging Face transformers, for tests/e2e/rerank_test.py.

Run with the peers venv (`deploy/install-deps.sh --peers build/peers-venv` makes it):
  build/peers-venv/bin/python tests/tools/make_reranker_golden.py tests/data

The tokenizer is a WordPiece vocabulary trained by `tokenizers` on
tests/data/sentences.en.txt with BERT's normalizer, pre-tokenizer and templates. The
models are seeded BertForSequenceClassification checkpoints (2 layers, d=32, 4 heads,
64 positions), their biases and layer norms drawn at random so that the tests exercise
them:
- reranker_tiny/: one label, saved by sentence-transformers' CrossEncoder (which records
  its Sigmoid activation in config_sentence_transformers.json); goldens from
  CrossEncoder.predict.
- classifier_tiny/: three labels with id2label, saved by save_pretrained; goldens are
  transformers' logits and their softmax.
reranker_tiny.golden.json holds the pairs (one query with documents, one document long
enough to be truncated at 64 tokens), the pair token ids tokenizers makes (truncation
longest_first at 64), and the scores; classifier_tiny.golden.json the texts and pairs
with logits and softmax scores.
"""
import json
import os
import sys

import torch
import transformers
from sentence_transformers import CrossEncoder
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seeded_bert import draw_norms_and_biases  # noqa: E402

LAYERS, D, HEADS, FFN, POSITIONS = 2, 32, 4, 64, 64
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_tokenizer(sentences):
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=600, special_tokens=SPECIALS)
    tokenizer.train_from_iterator(sentences, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    # token_type_ids among the model inputs, as BERT's own tokenizers list them: without
    # it transformers 5's generic tokenizer gives none, and the model reads every token
    # as type 0, so the pair's second text would not be marked as it is for a real
    # cross-encoder (ms-marco-MiniLM-L-6-v2 ships BertTokenizer, which gives them).
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", cls_token="[CLS]",
        sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]",
        model_max_length=POSITIONS,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def seeded_model(seed, labels, vocab):
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=vocab, hidden_size=D, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=FFN,
        max_position_embeddings=POSITIONS, num_labels=len(labels),
        id2label=dict(enumerate(labels)), label2id={l: i for i, l in enumerate(labels)},
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        initializer_range=0.3)
    return draw_norms_and_biases(transformers.BertForSequenceClassification(config).eval(),
                                 heads=("classifier.", "bert.pooler."))


def main(directory):
    with open(os.path.join(directory, "sentences.en.txt"), encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    tokenizer = train_tokenizer(sentences)
    vocab = len(tokenizer)

    folder = os.path.join(directory, "reranker_tiny")
    seeded_model(45, ["LABEL_0"], vocab).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    reranker = CrossEncoder(folder, device="cpu")
    reranker.save_pretrained(folder)
    os.remove(os.path.join(folder, "README.md"))  # a generated model card
    query = " ".join(sentences[3].split()[:10])
    documents = [" ".join(s.split()[:12]) for s in sentences[10:17]] + \
        [" ".join(sentences[20:30])]
    pairs = [[query, document] for document in documents]
    scores = reranker.predict(pairs, batch_size=4, convert_to_numpy=True).tolist()
    encoded = [tokenizer(query, document, truncation=True, max_length=POSITIONS)
               for document in documents]
    assert all(1 in e["token_type_ids"] for e in encoded), "pairs need token types"
    ids = [e["input_ids"] for e in encoded]
    with open(os.path.join(directory, "reranker_tiny.golden.json"), "w") as f:
        json.dump({"query": query, "documents": documents, "token_ids": ids,
                   "scores": scores}, f, indent=1)

    folder = os.path.join(directory, "classifier_tiny")
    labels = ["negative", "neutral", "positive"]
    classifier = seeded_model(46, labels, vocab)
    classifier.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    texts = [" ".join(s.split()[:12]) for s in sentences[40:44]]
    pairs = [[sentences[50], sentences[51]], [sentences[52], sentences[53]]]
    golden = {"labels": labels}
    with torch.inference_mode():
        for key, batch in (("texts", texts), ("pairs", pairs)):
            logits = []
            for item in batch:
                encoded = tokenizer(*item, return_tensors="pt", truncation=True) \
                    if isinstance(item, list) else \
                    tokenizer(item, return_tensors="pt", truncation=True)
                logits.append(classifier(**encoded).logits[0])
            logits = torch.stack(logits)
            golden[key] = batch
            golden[key + "_logits"] = logits.tolist()
            golden[key + "_scores"] = torch.softmax(logits, dim=-1).tolist()
    with open(os.path.join(directory, "classifier_tiny.golden.json"), "w") as f:
        json.dump(golden, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
