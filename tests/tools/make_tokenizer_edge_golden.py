#!/usr/bin/env python3
"""Writes tests/data/tokenizers/edge_cases.jsonl: small handmade tokenizer.json files on
the paths the trained tokenizers' corpus seldom reaches, each with texts and the ids
Hugging Face's `tokenizers` gives them (or "error" where it refuses the text), for
tests/core/pipeline_tokenizer_test.cc.

  build/peers-venv/bin/python tests/tools/make_tokenizer_edge_golden.py tests/data/tokenizers

Cases: added tokens numbered by tokenizers itself (the file's ids are not used; a
content the vocabulary has takes its id, the rest follow the vocabulary's size), an added
token whose lstrip/rstrip leave it empty, StripAccents' Unicode 9.0 mark table, a
Unigram without an unknown token where no unknown is needed (and where one is), a BPE
whose unk_token is not in its vocabulary, Replace on a text that normalization emptied,
each Split behavior with invert, and Metaspace's prepend schemes between added tokens.
One JSON object per line: {"name", "tokenizer", "cases": [{"text", "pair"?, "ids" |
"error": true}]}.
"""
import json
import os
import sys

import tokenizers
from tokenizers import Tokenizer


def document(model, normalizer=None, pre=None, post=None, added=None):
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": added or [], "normalizer": normalizer, "pre_tokenizer": pre,
            "model": model, "post_processor": post, "decoder": None}


def added(content, id_, special=True, lstrip=False, rstrip=False, normalized=False,
          single_word=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": normalized, "special": special}


def wordlevel(tokens):
    return {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(tokens)},
            "unk_token": "[UNK]"}


WHITESPACE = {"type": "WhitespaceSplit"}
CASES = [
    ("added ids numbered by tokenizers",
     document(wordlevel(["a", "b", "[UNK]"]), pre=WHITESPACE,
              added=[added("<x>", 500), added("a", 7), added("<y>", 9)]),
     ["a <x> b", "<y> <x> a", "a<x>b"]),
    ("added token stripped to nothing",
     document(wordlevel(["a", "b", "[UNK]", " "]), pre=None,
              added=[added(" ", 3, lstrip=True, rstrip=True)]),
     ["a  b", "a b", " ", "a   b  "]),
    ("StripAccents, Unicode 9.0's marks",
     document(wordlevel(["e", "x", "[UNK]"]),
              normalizer={"type": "StripAccents"}, pre=WHITESPACE),
     ["e\u1abf x", "e\u0301 x", "e\u1cf2 x", "e\u07fd x", "e\u0d00"]),
    ("Unigram without an unknown token",
     document({"type": "Unigram", "unk_id": None, "byte_fallback": False,
               "vocab": [["a", -1.0], ["ab", -1.0], ["c", -2.0]]}),
     ["ab", "abc", "b", "cab"]),
    ("BPE whose unk_token is not in the vocabulary",
     document({"type": "BPE", "dropout": None, "unk_token": "<unk>",
               "continuing_subword_prefix": None, "end_of_word_suffix": None,
               "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
               "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}),
     ["ab", "abab", "axb"]),
    ("Replace on a text normalization emptied",
     document(wordlevel(["x", "[UNK]"]),
              normalizer={"type": "Sequence", "normalizers": [
                  {"type": "Strip", "strip_left": True, "strip_right": True},
                  {"type": "Replace", "pattern": {"Regex": "^"}, "content": "x"}]},
              pre=WHITESPACE),
     ["   ", "a", ""]),
] + [
    (f"Split {behavior}{' inverted' if invert else ''}",
     document(wordlevel(["[UNK]", "a", "b", "c", "-", "--", "a-", "b--", "-a", "-b",
                         "--c", "-a-", "a-b", "b--c", "abc"]),
              pre={"type": "Split", "pattern": {"Regex": "-+"}, "behavior": behavior,
                   "invert": invert}),
     ["a-b--c", "-a-", "--", "abc"])
    for behavior in ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                     "Contiguous")
    for invert in (False, True)
] + [
    (f"Metaspace prepend {scheme} between added tokens",
     document({"type": "Unigram", "unk_id": 0, "byte_fallback": False,
               "vocab": [["<unk>", 0.0], ["\u2581", -1.0], ["a", -2.0], ["\u2581a", -1.5],
                         ["b", -2.0], ["<s>", 0.0]]},
              pre={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme,
                   "split": True},
              added=[added("<s>", 5)]),
     ["a b", "<s>a b", "a<s>b", " <s> "])
    for scheme in ("always", "first", "never")
]


def main(out):
    lines = []
    for name, spec, texts in CASES:
        tokenizer = Tokenizer.from_str(json.dumps(spec))
        cases = []
        for text in texts:
            try:
                cases.append({"text": text, "ids": tokenizer.encode(text).ids})
            except Exception:  # noqa: BLE001 (tokenizers raises its own exception types)
                cases.append({"text": text, "error": True})
        lines.append(json.dumps({"name": name, "tokenizer": spec, "cases": cases},
                                ensure_ascii=False))
    with open(os.path.join(out, "edge_cases.jsonl"), "w", encoding="utf-8") as f:
        f.write(json.dumps({"tokenizers": tokenizers.__version__}) + "\n")
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
