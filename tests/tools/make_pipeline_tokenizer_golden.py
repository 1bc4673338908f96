#!/usr/bin/env python3
"""Trains six small Hugging Face tokenizers offline and writes what Hugging Face's own
`tokenizers` package (PyPI, pinned in deploy/requirements-peers.txt) makes of text with
each of them: goldens for the C++ reader of tokenizer.json files (BPE, Unigram and
WordPiece models with many normalizers, pre-tokenizers, post-processors and added-token
flags). Run with the peers venv (tokenizers, transformers, sentencepiece, protobuf; no
network; about 30 seconds):

  build/peers-venv/bin/python tests/tools/make_pipeline_tokenizer_golden.py tests/data/tokenizers

Texts:
- the corpus: the "text" of every line after the JSON header of
  tests/data/tokenizer/corpus.jsonl, in order (14,439 texts in many scripts). It already
  ends with the lines of tests/data/sentences.en.txt; a line of that file that it lacks
  would be added to the training texts (none is). Every tokenizer is trained on them.
- the adversarial set: the texts of tests/data/tokenizer/adversarial.jsonl, then
  extra_texts() below (whitespace runs, special and added tokens in every position,
  emoji sequences, combining marks, controls, digits, contractions, unspaced scripts,
  long words, text outside the BMP, a text of 3,000 characters), then the 60 pairs of
  pairs() below.

Tokenizers, each in <out>/<name>/tokenizer.json (saved compact):
- bytelevel_bpe: RoBERTa's recipe. BPE (no unk, no prefix or suffix), ByteLevel
  pre-tokenizer and decoder, RobertaProcessing; <s> <pad> </s> <unk> <mask> = 0..4 with
  roberta-base's added-token flags (all normalized, <mask> lstrip). BpeTrainer, vocab
  3000, min_frequency 2, the 256 byte-level characters as initial alphabet.
- unigram_metaspace: Unigram from UnigramTrainer; NFKC + Replace(" {2,}", " ");
  Metaspace (prepend_scheme "always", split) pre-tokenizer and decoder;
  TemplateProcessing in XLM-R's layout. Vocab 6000, not 3000: UnigramTrainer keeps every
  character it sees, and the corpus has about 2,900.
- xlmr_spm: XLM-R's route. A SentencePiece Unigram model from the `sentencepiece`
  trainer (Debian's spm_train code: nmt_nfkc, character_coverage 0.9995, vocab 4000, one
  thread, fixed seed), loaded by transformers' XLMRobertaTokenizerFast.from_pretrained
  from a folder holding only sentencepiece.bpe.model (XLMRobertaTokenizerFast(vocab_file=)
  ignores the file in transformers 5.24 and gives a 5-token vocab). transformers 5 gives
  <mask> no lstrip; it is set, as in XLM-R's published tokenizer.json. Also written:
  the tokenizer_config.json that transformers saves (it saves no
  special_tokens_map.json). The .model file is not kept.
- bpe_mixed: BPE with unk [UNK], fuse_unk, "##" continuing-subword prefix and "</w>"
  end-of-word suffix; NFD, Lowercase, StripAccents, Strip, Replace("``", '"');
  WhitespaceSplit, Punctuation (isolated), Digits (individual), Split on a regex that
  isolates each kana and CJK ideograph; [CLS] $A [SEP] $B:1 [SEP]:1; non-special added
  tokens "bigword" (single_word), "New York" (rstrip, normalized) and "<ent>" (lstrip,
  rstrip, not normalized). Vocab 3000 from an alphabet of 300 characters (every
  character comes in up to four initial symbols: a ##a a</w> ##a</w>).
- bpe_bytefallback: Llama's recipe. BPE with byte_fallback and fuse_unk, <unk> <s> </s>
  = 0..2, the 256 <0xNN> tokens at 3..258; Prepend("▁") + Replace(" ", "▁"), no
  pre-tokenizer; "<s> $A" and "<s> $A <s>:1 $B:1". Trained on Metaspace words (no merge
  crosses a space, as in SentencePiece), alphabet 1000 characters, vocab 3000 in all:
  rarer characters fall back to bytes.
- wordpiece_nfkc: WordPiece from WordPieceTrainer (vocab 3000, "##", alphabet 600
  characters); NFKC + Lowercase; Whitespace pre-tokenizer; BertProcessing.

Determinism (the output is the same on every run):
- BpeTrainer and WordPieceTrainer number the characters of the alphabet in a
  process-random hash order once a prefix or suffix is involved, and break ties between
  equally frequent merges by those numbers; limit_alphabet drops characters of equal
  count in hash order too. So the script computes the alphabet itself (most frequent
  first, ties by code point) and hands the trainer every initial symbol as a trainer
  special token, in a fixed order, which fixes their ids; the trained vocab and merges
  then go into a fresh model that has only the real special tokens.
- UnigramTrainer adds floats in hash order and re-adds dropped characters in hash
  order: canonical_unigram_scores() below.
- SentencePiece with one thread and a fixed seed gives the same model on every run.

Written next to each tokenizer.json; every id is computed from the saved file, read
back with Tokenizer.from_file, with special tokens added:
- corpus.ids: a JSON header line {"source", "texts", "tokenizers", "tokenizer",
  "add_special_tokens": true, "truncation": null}, then one line per corpus text, in
  order: the ids of encode(text), no truncation, separated by single spaces.
  bpe_mixed and bpe_bytefallback: the first 3,000 texts only.
- adversarial.jsonl: a JSON header line {"tokenizer", "tokenizers", "sources", "texts",
  "pairs", "add_special_tokens", "truncation", "components" (what the tokenizer.json
  holds)}, then one object per text {"text", "ids", "truncated": {"max": 16, "ids"},
  "truncated_left": {"max": 16, "ids"}}, then one per pair {"text", "pair", "ids",
  "type_ids", "truncated": {"max": 24, "ids", "type_ids"}, "truncated_left": {"max": 24,
  "ids", "type_ids"}}. "ids": no truncation. "truncated"/"truncated_left":
  enable_truncation(max_length=max, stride=0, strategy="longest_first",
  direction="right"/"left").
Files are UTF-8 with characters written as they are (ensure_ascii=False; JSON escapes
U+0000..U+001F only), so a reader must split lines on "\n" alone: texts hold U+0085,
U+2028 and U+2029 unescaped.
"""
import hashlib
import io
import json
import os
import sys
import tempfile

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # serial training and encoding

import sentencepiece  # noqa: E402
import tokenizers  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer  # noqa: E402
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors  # noqa: E402
from tokenizers import trainers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = "tests/data/tokenizer/corpus.jsonl"
ADVERSARIAL = "tests/data/tokenizer/adversarial.jsonl"
SENTENCES = "tests/data/sentences.en.txt"
SEED = 20240611
SHORT_CORPUS = 3000  # corpus texts in corpus.ids of unigram_metaspace and the two mixed BPEs (the
# whole corpus runs through one tokenizer of each model type: byte-level BPE, xlmr_spm, WordPiece)
MAX_SINGLE = 16
MAX_PAIR = 24
UNIGRAM_PENALTY = 0.0001  # UnigramTrainer::finalize's min_score_penalty_delta


def read_lines(path):
    with open(os.path.join(ROOT, path), encoding="utf-8", newline="") as f:
        return [line for line in f.read().split("\n") if line]


def corpus_texts():
    lines = read_lines(CORPUS)
    header = json.loads(lines[0])
    assert "text" not in header, "corpus.jsonl must start with its header"
    return [json.loads(line)["text"] for line in lines[1:]]


def training_texts(corpus):
    present = set(corpus)
    with open(os.path.join(ROOT, SENTENCES), encoding="utf-8") as f:
        extra = [line.rstrip("\n") for line in f if line.strip()]
    return corpus + [t for t in extra if t not in present]


def digest_int(*parts):
    return int(hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest(), 16)


def hash_letters(count, salt):
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out, block = [], 0
    while len(out) < count:
        for byte in hashlib.sha256(f"{salt}:{block}".encode()).digest():
            out.append(letters[byte % len(letters)])
        block += 1
    return "".join(out[:count])


def text_of_length(corpus, length, salt):
    """Corpus texts picked by hash, joined by spaces, cut at exactly `length` characters."""
    parts, total, i = [], 0, 0
    while total < length:
        text = corpus[digest_int(salt, i) % len(corpus)]
        parts.append(text)
        total += len(text) + 1
        i += 1
    return " ".join(parts)[:length]


def extra_texts(corpus):
    """Edge cases aimed at the pipeline components, after those of adversarial.jsonl."""
    ws = [
        " ", "  ", "\t", "\n", "\n\n", "\r\n", "\u3000", "\u00a0", " \t\n\u3000\u00a0 ",
        " x", "x ", "  leading two", "trailing two  ", "  both sides  ", "a  b   c    d",
        "a\tb\t\tc", "line one\nline two\n\nline four", "\r\nwindows\r\nlines\r\n",
        "\u3000ideographic\u3000space\u3000", "\u00a0nbsp\u00a0word\u00a0",
        "mid \t\n\u3000\u00a0 run", "end run \t\n\u3000\u00a0", "\t\n\u3000\u00a0 start run",
        "\u2002en\u2003em\u2009thin\u200ahair\u205fmath", "word \u3000 word  \u00a0 word",
    ]
    special = []
    for tok in ["<s>", "</s>", "<mask>", "<unk>", "<pad>", "[CLS]", "[SEP]", "[MASK]",
                "[UNK]", "[PAD]"]:
        special += [tok, f"ab{tok}cd", f" {tok} ", f"a {tok} b", f"a  {tok}  b",
                    f"{tok}{tok}", f"{tok} {tok}", f"{tok}start", f"end{tok}",
                    f"{tok} hello world {tok}"]
    special += [
        "<s>hello</s>", "<s> hello </s>", "</s><s>", "hello <mask>.", "hello<mask>",
        "<mask>\thello", "\n<mask>\n", "\u3000<mask>\u3000", "<MASK> <Mask> < mask >",
        "<<mask>>", "<mask", "mask>", "<s<s>>", "[CLS] text [SEP] more [SEP]",
        "[cls] [mask] [Sep]", "x[MASK]y[PAD]z", "<s>[CLS]</s>[SEP]<mask>[MASK]",
    ]
    added = [
        "bigword", "a bigword here", "bigwords", "the bigword.", "xbigword", "bigword!",
        "BIGWORD", "(bigword)", "bigword bigword", "New York", "new york city",
        "NEW YORK  rocks", "in New York.", "NewYork", "New  York", "New York New York",
        "<ent>", "a <ent> b", "a<ent>b", "a   <ent>   b", "<ENT>", "<ent><ent>",
        "Ça New York bigword <ent> done",
    ]
    emoji = [
        "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 family",
        "\U0001F3F3\ufe0f\u200d\U0001F308 flag",
        "\U0001F1EF\U0001F1F5\U0001F1FA\U0001F1F8\U0001F1E9\U0001F1EA",  # JP US DE flags
        "".join("\U0001F44B" + chr(tone) for tone in range(0x1F3FB, 0x1F400)),  # skin tones
        "\U0001F9D1\U0001F3FD\u200d\U0001F4BB coder", "\u2764\ufe0f\u200d\U0001F525",
        "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F scotland",
        "ok\U0001F44Dok", "1\ufe0f\u20e3 #\ufe0f\u20e3",
    ]
    marks = [
        "e\u0301 a\u0300 o\u0308 n\u0303", "A\u030a\u0301", "\u01c5 \ufb03 \u3392 \u210c",
        "\u2126 \u212b \u212a", "\u1e9b\u0323", "q\u0307\u0323", "\u0915\u094d\u0937",
        "\u0627\u064e\u0644\u0652", "\u05d1\u05bc\u05b8", "\u0e01\u0e34\u0e4a",
        "\u00c5ngstr\u00f6m CAF\u00c9 \u00e9l\u00e8ve", "\u1100\u1161\u11a8",
    ]
    controls = [
        "".join(chr(c) for c in range(0x20)), "a\x00b", "tab\x09and\x0bvt\x0cff",
        "del\x7fnel\x85end", "\ufeffBOM at start", "BOM\ufeffinside",
        "zero\u200bwidth\u200bspace",
        "\u200c\u200d\u2060", "soft\u00adhyphen", "\u2028line sep\u2029para sep",
        "\x1b[31mred\x1b[0m", "\u00a0\u200b\u00a0",
    ]
    digits = [
        "12345", "3.14159", "\uff11\uff12\uff13", "1,234,567.89", "0x1F 0b1010 1e-9",
        "\u0660\u0661\u0662\u0663 \u06f0\u06f1\u06f2", "\u0967\u0968\u0969",
        "2024-01-01T12:34:56Z", "+1 (555) 123-4567", "\u2460\u2461\u2462 \u00bd \u00b2\u00b3",
        "x" + "9" * 40, "v1.2.3-rc4",
    ]
    contractions = [
        "don't I'll we've she'd THEY'RE", "it's 'tis y'all rock'n'roll", "I'M HE'S YOU'VE",
        "don\u2019t it\u2019s", "''quoted'' ``backticks``", "'s 't 're 've 'm 'll 'd",
        "the dog's bone", "o'clock", "'", "''",
    ]
    scripts = [
        "ภาษาไทยไม่มีช่องว่าง",
        "日本語の文章には空白がありません。",
        "中文句子没有空格。",
        "東京とBangkokกรุงเทพand北京",
        "Приветworldمرحباשלום",
        "한국어English日本語123",
        "カタカナひらがなｶﾀｶﾅ",
    ]
    long_words = [
        "a" * 300, hash_letters(300, "letters"), "\u00e9" * 300, "\u4e00" * 300,
        "\U0001F600" * 100, "ab" * 150 + " end",
    ]
    astral = [
        "\U0001D518\U0001D52B\U0001D526\U0001D520\U0001D52C\U0001D521\U0001D522 "
        "\U0001D41B\U0001D428\U0001D425\U0001D41D \U0001D7D9\U0001D7DA\U0001D7DB",
        "\U00020000\U00020001\U00020002", "\U00013000\U00013050 hieroglyphs",
        "\U0001F004\U0001F0CF", "\U0010FFFD\U000F0000", "\U0001F600 grin \U0001F601",
    ]
    long_text = [text_of_length(corpus, 3000, "long")]
    return (ws + special + added + emoji + marks + controls + digits + contractions
            + scripts + long_words + astral + long_text)


def pairs(singles, corpus):
    """60 (text, pair) inputs: chosen ones, then ones picked by hash."""
    long_a = text_of_length(corpus, 3000, "long")
    long_b = text_of_length(corpus, 2000, "pair-long")
    longest = max(corpus, key=lambda t: (len(t), t))
    chosen = [
        ("Hello world", ""), (corpus[0], ""), ("<mask>", ""), (long_a, ""), ("", ""),
        ("", "Hello world"), ("", corpus[1]), (" ", " "),
        (long_a, "short"), ("a" * 300, "b"), ("[CLS]" * 200, "x"), (longest, "no"),
        (long_b, "yes <mask> no"),
        ("short", long_a), ("q", longest), ("<s>", long_b),
        (long_a, long_b), (longest, long_a), (" ".join(["word"] * 300), long_b),
        ("<s>", "</s>"), ("a <mask>", "<mask> b"), ("[CLS] x", "y [SEP]"),
        ("bigword New York", "<ent> bigword"), ("don't", "won't"),
        ("  padded  ", "\tpadded\t"), ("\U0001F44D\U0001F3FD", "\u6771\u4eac"),
    ]
    out = list(chosen)
    pool = singles + corpus
    i = 0
    while len(out) < 60:
        a = pool[digest_int("pair-a", i) % len(pool)]
        b = pool[digest_int("pair-b", i) % len(pool)]
        out.append((a, b))
        i += 1
    return out


# ---------------------------------------------------------------------------------------
# Training


def words_of(tokenizer, texts):
    """The words the trainer sees: normalized, pre-tokenized, with their counts."""
    counts = {}
    for text in texts:
        normalized = tokenizer.normalizer.normalize_str(text) if tokenizer.normalizer else text
        for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(normalized):
            counts[word] = counts.get(word, 0) + 1
    return counts


def initial_symbols(words, size, prefix, suffix):
    """The `size` most frequent characters (ties by code point) and every initial
    symbol the BPE trainer makes of them, in a fixed order."""
    chars = {}
    for word, count in words.items():
        for c in word:
            chars[c] = chars.get(c, 0) + count
    alphabet = sorted(sorted(chars, key=ord), key=lambda c: -chars[c])[:size]
    kept = set(alphabet)
    seen = set()
    for word in words:
        n = len(word)
        for i, c in enumerate(word):
            if c not in kept:
                continue
            s = c
            if i > 0 and prefix:
                s = prefix + s
            if i == n - 1 and suffix:
                s = s + suffix
            seen.add(s)
    alphabet.sort(key=ord)
    symbols = list(alphabet)
    for c in alphabet:
        for s in ([prefix + c] if prefix else []) + ([c + suffix] if suffix else []) + (
                [prefix + c + suffix] if prefix and suffix else []):
            if s in seen:
                symbols.append(s)
    return alphabet, symbols


def trained_vocab_merges(tokenizer):
    model = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" "))
              for m in model.get("merges", [])]
    return model["vocab"], merges


def special(content, **flags):
    return AddedToken(content, special=True, normalized=flags.pop("normalized", False), **flags)


def build_bytelevel_bpe(texts):
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                                 use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=specials)
    tok.train_from_iterator(texts, trainer, length=len(texts))
    vocab, merges = trained_vocab_merges(tok)
    out = Tokenizer(models.BPE(vocab, merges, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False))
    out.normalizer = None
    out.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                                 use_regex=True)
    out.decoder = decoders.ByteLevel()
    # roberta-base's tokenizer.json: all five normalized, <mask> lstrip.
    out.add_special_tokens([special(t, normalized=True, lstrip=(t == "<mask>")) for t in specials])
    out.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True,
                                                      add_prefix_space=False)
    return out


def canonical_unigram_scores(pieces):
    """UnigramTrainer's pieces made independent of its hash order. The characters that
    the last EM step dropped come back with the scores min, min + 1e-4, min + 2e-4, ...
    handed out in hash order, beside characters that have the minimum score themselves:
    all characters on that grid get its scores again, lowest first by code point. The EM
    sums differ by up to ~4e-11 between runs: scores are rounded to 5 decimals (a
    difference across a rounding boundary has a chance of about 0.1% per run; running
    the script twice shows it). Equal scores are ordered by piece."""
    base = min(score for _, score in pieces)

    def on_grid(piece, score):
        steps = (score - base) / UNIGRAM_PENALTY
        return len(piece) == 1 and abs(steps - round(steps)) < 1e-6

    members = sorted((p for p, s in pieces if on_grid(p, s)), key=ord)
    grid = sorted(s for p, s in pieces if on_grid(p, s))
    scores = dict(pieces)
    scores.update(zip(members, grid))
    return sorted(((p, round(s, 5)) for p, s in scores.items()), key=lambda kv: (-kv[1], kv[0]))


def build_unigram_metaspace(texts):
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                                 split=True)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    trainer = trainers.UnigramTrainer(vocab_size=6000, show_progress=False, unk_token="<unk>",
                                      special_tokens=specials)
    tok.train_from_iterator(texts, trainer, length=len(texts))
    model = json.loads(tok.to_str())["model"]
    vocab = [tuple(v) for v in model["vocab"]]
    head, rest = vocab[:len(specials)], vocab[len(specials):]
    assert [v[0] for v in head] == specials and model["unk_id"] == 3
    out = Tokenizer(models.Unigram(head + canonical_unigram_scores(rest), unk_id=3,
                                   byte_fallback=False))
    out.normalizer = tok.normalizer
    out.pre_tokenizer = tok.pre_tokenizer
    out.decoder = tok.decoder
    out.add_special_tokens([special(t) for t in specials])
    out.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)])
    return out


def build_xlmr_spm(texts, workdir):
    from transformers import XLMRobertaTokenizerFast

    sentencepiece.set_random_generator_seed(SEED)
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([t for t in texts if t.strip()]), model_writer=model,
        model_type="unigram", vocab_size=4000, character_coverage=0.9995,
        normalization_rule_name="nmt_nfkc", byte_fallback=False, num_threads=1,
        minloglevel=2)
    src = os.path.join(workdir, "spm")
    os.makedirs(src)
    with open(os.path.join(src, "sentencepiece.bpe.model"), "wb") as f:
        f.write(model.getvalue())
    hf = XLMRobertaTokenizerFast.from_pretrained(src)
    saved = os.path.join(workdir, "hf")
    hf.save_pretrained(saved)
    with open(os.path.join(saved, "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    for token in spec["added_tokens"]:
        if token["content"] == "<mask>":
            token["lstrip"] = True  # XLM-R's tokenizer.json; transformers 5 drops it
    extra = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = os.path.join(saved, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                extra[name] = f.read()
    spm = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    return Tokenizer.from_str(json.dumps(spec, ensure_ascii=False)), extra, spm


def train_with_fixed_symbols(tok, trainer_class, specials, texts, alphabet_size, prefix, suffix,
                              **kwargs):
    """Trains with the alphabet and initial symbols fixed (see the docstring)."""
    words = words_of(tok, texts)
    alphabet, symbols = initial_symbols(words, alphabet_size, prefix, suffix)
    trainer = trainer_class(show_progress=False, special_tokens=specials + symbols,
                            initial_alphabet=alphabet, limit_alphabet=len(alphabet), **kwargs)
    tok.train_from_iterator(texts, trainer, length=len(texts))
    return trained_vocab_merges(tok)


def build_bpe_mixed(texts):
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##",
                               end_of_word_suffix="</w>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([
        normalizers.NFD(), normalizers.Lowercase(), normalizers.StripAccents(),
        normalizers.Strip(left=True, right=True), normalizers.Replace("``", '"')])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(Regex("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]"),
                             behavior="isolated")])
    vocab, merges = train_with_fixed_symbols(
        tok, trainers.BpeTrainer, specials, texts, 300, "##", "</w>", vocab_size=3000,
        min_frequency=2, continuing_subword_prefix="##", end_of_word_suffix="</w>")
    out = Tokenizer(models.BPE(vocab, merges, unk_token="[UNK]", continuing_subword_prefix="##",
                               end_of_word_suffix="</w>", fuse_unk=True))
    out.normalizer = tok.normalizer
    out.pre_tokenizer = tok.pre_tokenizer
    out.decoder = decoders.BPEDecoder(suffix="</w>")
    out.add_special_tokens([special(t) for t in specials])
    out.add_tokens([
        AddedToken("bigword", single_word=True, normalized=True),
        AddedToken("New York", rstrip=True, normalized=True),
        AddedToken("<ent>", lstrip=True, rstrip=True, normalized=False),
    ])
    out.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return out


def build_bpe_bytefallback(texts):
    specials = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # Training words: what SentencePiece's BPE trainer sees (split before each space).
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                 split=True)
    vocab, merges = train_with_fixed_symbols(tok, trainers.BpeTrainer, specials, texts, 1000,
                                             None, None, vocab_size=3000 - 256, min_frequency=2)
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    ordered = specials + byte_tokens + [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])
                                        if t not in specials and t not in byte_tokens]
    out = Tokenizer(models.BPE({t: i for i, t in enumerate(ordered)}, merges, unk_token="<unk>",
                               fuse_unk=True, byte_fallback=True))
    out.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    out.pre_tokenizer = None
    out.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0)])
    out.add_special_tokens([special(t) for t in specials])
    out.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s>:1 $B:1", special_tokens=[("<s>", 1)])
    return out


def build_wordpiece_nfkc(texts):
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    vocab, _ = train_with_fixed_symbols(tok, trainers.WordPieceTrainer, specials, texts, 600,
                                        "##", None, vocab_size=3000,
                                        continuing_subword_prefix="##")
    out = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##",
                                     max_input_chars_per_word=100))
    out.normalizer = tok.normalizer
    out.pre_tokenizer = tok.pre_tokenizer
    out.decoder = decoders.WordPiece(prefix="##")
    out.add_special_tokens([special(t) for t in specials])
    out.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    return out


# ---------------------------------------------------------------------------------------
# Goldens


def describe(node):
    """A compact string of a component's type, nested for Sequence."""
    if node is None:
        return None
    kind = node["type"]
    for key in ("normalizers", "pretokenizers", "processors", "decoders"):
        if key in node:
            return f"{kind}[{', '.join(describe(n) for n in node[key])}]"
    return kind


def components(spec):
    model = spec["model"]
    info = {"type": model["type"], "vocab": len(model["vocab"])}
    for key in ("merges", ):
        if key in model:
            info[key] = len(model[key])
    for key in ("unk_token", "unk_id", "continuing_subword_prefix", "end_of_word_suffix",
                "fuse_unk", "byte_fallback", "ignore_merges", "max_input_chars_per_word"):
        if key in model:
            info[key] = model[key]
    return {
        "normalizer": describe(spec["normalizer"]),
        "pre_tokenizer": describe(spec["pre_tokenizer"]),
        "model": info,
        "post_processor": describe(spec["post_processor"]),
        "decoder": describe(spec["decoder"]),
        "added_tokens": [{k: t[k] for k in ("id", "content", "special", "single_word", "lstrip",
                                             "rstrip", "normalized")}
                         for t in spec["added_tokens"]],
    }


def dumps(obj):
    return json.dumps(obj, ensure_ascii=False)


def write_goldens(name, folder, corpus, singles, pair_list, corpus_count):
    path = os.path.join(folder, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    full = Tokenizer.from_file(path)
    full.no_truncation()
    full.no_padding()
    cut = {}
    for direction in ("right", "left"):
        for max_length in (MAX_SINGLE, MAX_PAIR):
            t = Tokenizer.from_file(path)
            t.no_padding()
            t.enable_truncation(max_length=max_length, stride=0, strategy="longest_first",
                                direction=direction)
            cut[direction, max_length] = t
    version = tokenizers.__version__

    texts = corpus[:corpus_count]
    header = {"source": CORPUS, "texts": len(texts), "tokenizers": version, "tokenizer": name,
              "add_special_tokens": True, "truncation": None}
    with open(os.path.join(folder, "corpus.ids"), "w", encoding="utf-8", newline="\n") as f:
        f.write(dumps(header) + "\n")
        for text in texts:
            f.write(" ".join(map(str, full.encode(text).ids)) + "\n")

    header = {"tokenizer": name, "tokenizers": version,
              "sources": [ADVERSARIAL, "tests/tools/make_pipeline_tokenizer_golden.py"],
              "texts": len(singles), "pairs": len(pair_list),
              "add_special_tokens": True,
              "truncation": {"strategy": "longest_first", "stride": 0,
                             "truncated": {"direction": "right", "single": MAX_SINGLE,
                                           "pair": MAX_PAIR},
                             "truncated_left": {"direction": "left", "single": MAX_SINGLE,
                                                "pair": MAX_PAIR}},
              "components": components(spec)}
    lines = [dumps(header)]
    for text in singles:
        lines.append(dumps({
            "text": text, "ids": full.encode(text).ids,
            "truncated": {"max": MAX_SINGLE, "ids": cut["right", MAX_SINGLE].encode(text).ids},
            "truncated_left": {"max": MAX_SINGLE, "ids": cut["left", MAX_SINGLE].encode(text).ids},
        }))
    for a, b in pair_list:
        e = full.encode(a, b)
        r = cut["right", MAX_PAIR].encode(a, b)
        left = cut["left", MAX_PAIR].encode(a, b)
        lines.append(dumps({
            "text": a, "pair": b, "ids": e.ids, "type_ids": e.type_ids,
            "truncated": {"max": MAX_PAIR, "ids": r.ids, "type_ids": r.type_ids},
            "truncated_left": {"max": MAX_PAIR, "ids": left.ids, "type_ids": left.type_ids},
        }))
    with open(os.path.join(folder, "adversarial.jsonl"), "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    return full


def save(tok, folder):
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"), pretty=False)


def main(out):
    corpus = corpus_texts()
    train = training_texts(corpus)
    adversarial = [json.loads(line)["text"] for line in read_lines(ADVERSARIAL)]
    adversarial = [t for t in adversarial if isinstance(t, str)]
    singles = adversarial + extra_texts(corpus)
    pair_list = pairs(singles, corpus)
    os.makedirs(out, exist_ok=True)

    builders = [
        ("bytelevel_bpe", build_bytelevel_bpe, len(corpus)),
        ("unigram_metaspace", build_unigram_metaspace, SHORT_CORPUS),
        ("xlmr_spm", None, len(corpus)),
        ("bpe_mixed", build_bpe_mixed, SHORT_CORPUS),
        ("bpe_bytefallback", build_bpe_bytefallback, SHORT_CORPUS),
        ("wordpiece_nfkc", build_wordpiece_nfkc, len(corpus)),
    ]
    for name, build, count in builders:
        folder = os.path.join(out, name)
        if build is None:
            with tempfile.TemporaryDirectory() as workdir:
                tok, extra, spm = build_xlmr_spm(train, workdir)
            save(tok, folder)
            for filename, content in extra.items():
                with open(os.path.join(folder, filename), "w", encoding="utf-8") as f:
                    f.write(content)
        else:
            tok = build(train)
            save(tok, folder)
        full = write_goldens(name, folder, corpus, singles, pair_list, count)
        print(f"{name}: vocab {full.get_vocab_size(with_added_tokens=True)}")
        if name == "xlmr_spm":
            # How often the converted tokenizer agrees with SentencePiece itself (XLM-R's
            # fairseq ids: <s>=0 <pad>=1 </s>=2 <unk>=3, pieces at their spm id + 1).
            same = 0
            for text in corpus:
                ids = [{0: 3, 1: 0, 2: 2}.get(i, i + 1) for i in spm.encode(text)]
                same += full.encode(text, add_special_tokens=False).ids == ids
            print(f"xlmr_spm: {same} of {len(corpus)} corpus texts as SentencePiece encodes them")
    print(f"{len(corpus)} corpus texts, {len(singles)} adversarial texts, {len(pair_list)} pairs")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "tokenizers"))
