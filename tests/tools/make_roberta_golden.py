#!/usr/bin/env python3
"""Writes small seeded RoBERTa and XLM-RoBERTa checkpoints (two sentence-transformers
embedders and a cross-encoder) and what sentence-transformers computes with them, for
the tests of attnserve's RoBERTa family (config.json model_type "roberta" and
"xlm-roberta": position ids start after padding_idx, one token type, LayerNorm eps
1e-5, a byte-level BPE or a SentencePiece Unigram tokenizer, no token_type_ids).

Run with the peers venv (`deploy/install-deps.sh --peers build/peers-venv` makes it):
  build/peers-venv/bin/python tests/tools/make_roberta_golden.py tests/data

The models are transformers' RobertaModel, XLMRobertaModel and
XLMRobertaForSequenceClassification from seeded configs (2 layers, hidden 32, 4 heads,
intermediate 64, GELU, no dropout, type_vocab_size 1, layer_norm_eps 1e-5,
pad_token_id 1 and max_position_embeddings 66: transformers numbers the real tokens
padding_idx + 1 + i, so 64 positions are usable, as roberta-base's 514 give 512), fp32.
Every LayerNorm's scale and bias and every Linear's bias is drawn at random (the
initializer leaves them 1 and 0, which would let a loader that skips one pass), as
make_distilbert_golden.py does; the cross-encoder's classifier weights are drawn from
N(0, 1), as make_reranker_golden.py does, so that its scores spread. The padding rows
of the word and position embeddings stay zero, as the initializer (and fairseq) leaves
them.

Both tokenizers are trained here on tests/data/sentences.en.txt and the texts of
tests/data/tokenizer/corpus.jsonl (many languages and scripts):
- RoBERTa's: a byte-level BPE trained by `tokenizers` with roberta-base's recipe
  (ByteLevel pre-tokenizer without a prefix space, BPE without an unknown token,
  RobertaProcessing; <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4, <mask> stripping the space
  on its left), 1000 tokens (the 256 byte symbols, the 5 specials, 739 merges), saved
  through transformers' RobertaTokenizerFast.
- XLM-R's: a SentencePiece Unigram model trained by the `sentencepiece` trainer
  (nmt_nfkc normalization, 1000 pieces, one thread and a fixed seed, so that a rerun
  makes the same model; character_coverage 0.98, the trainer's lowest, since this
  corpus needs 2481 characters at its default 0.9995 and a 1000-piece vocabulary cannot
  hold them: most pieces are single characters, and rarer letters and emoji are
  <unk>), converted by transformers' XLMRobertaTokenizerFast the way from_pretrained
  converts a sentencepiece.bpe.model (fairseq's ids: <s>=0 <pad>=1 </s>=2 <unk>=3, the
  pieces after them, <mask> last). tokenizer.json then holds transformers 5's XLM-R
  pipeline: a Precompiled normalizer (SentencePiece's nmt_nfkc charsmap), a Sequence of
  WhitespaceSplit and Metaspace (prepend_scheme "always"), Unigram (unk_id 3), a
  TemplateProcessing of <s> A </s> and <s> A </s> </s> B </s>, all type ids 0. (Files
  converted by transformers 4, as on the Hub, have Precompiled followed by
  Replace(" {2,}", " ") and a lone Metaspace instead.) The .model file is not kept:
  transformers reloads the folder from tokenizer.json alone.
The token ids are checked three ways: sentence-transformers' preprocessing, the
tokenizer transformers reloads from the folder, and tokenizer.json read by `tokenizers`
itself (as attnserve reads it; transformers 5 rebuilds these two pipelines in code and
takes only the vocabulary, merges, charsmap and post-processor from the file).

Writes:
- roberta_tiny/, xlmr_tiny/: the model by save_pretrained (config.json,
  model.safetensors with RoBERTa's own tensor names, no "roberta." prefix, the pooler
  included as AutoModel saves it), the tokenizer by save_pretrained (tokenizer.json,
  tokenizer_config.json with model_max_length 64), and the sentence-transformers files
  in the layout the Hub's models carry, as make_distilbert_golden.py writes them: a
  Transformer (max_seq_length 64), Pooling (mean for roberta_tiny, CLS for xlmr_tiny)
  and Normalize pipeline.
- xlmr_reranker_tiny/: a one-label XLMRobertaForSequenceClassification with xlmr_tiny's
  tokenizer, by save_pretrained only, as the bge-reranker-* folders are laid out (no
  sentence-transformers files: CrossEncoder loads it with its default Sigmoid for one
  label, and reads max_length from the tokenizer's model_max_length 64). Its tensors
  sit behind "roberta."; the head is classifier.dense (32x32), tanh, classifier.out_proj
  (1x32) on the <s> token.
- roberta_tiny.golden.json, xlmr_tiny.golden.json, in make_distilbert_golden.py's
  format: the texts (accents, CJK, emoji, a doubled space and a tab; one long enough to
  be truncated at 64 tokens), their token ids as sentence-transformers makes them (the
  model is fed input_ids and attention_mask only, transformers derives the position
  ids), the pipeline's embeddings (SentenceTransformer.encode, L2-normalized), the
  pooled embeddings before Normalize ("unnormalized"), rounded to 8 significant digits;
  the pooling mode, the versions used and the config fields set.
- xlmr_reranker_tiny.golden.json, in make_reranker_golden.py's format: a query and its
  documents (multilingual; only the last long enough that its pair is truncated at 64
  tokens, longest_first), the pair token ids (the tokenizer gives no token_type_ids,
  and the model is fed none), the model's logits (each pair alone, unpadded) and
  CrossEncoder.predict's scores (their sigmoid, batched with padding), rounded to 8
  significant digits.
"""
import io
import json
import os
import shutil
import sys
import tempfile

import sentence_transformers
import sentencepiece
import tokenizers
import torch
import transformers
from sentence_transformers import CrossEncoder, SentenceTransformer
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from tokenizers import processors, trainers

SEEDS = {"roberta_tiny": 81, "xlmr_tiny": 82, "xlmr_reranker_tiny": 83}
SPM_SEED = 84
LAYERS, D, HEADS, FFN = 2, 32, 4, 64
MAX_SEQ = 64  # tokens a text may have, <s> and </s> included
PAD = 1  # pad_token_id, RoBERTa's padding_idx
POSITIONS = MAX_SEQ + PAD + 1  # max_position_embeddings: positions 0..PAD are never used
VOCAB = 1000
INIT_STD = 0.2  # initializer_range: the std of every weight matrix and embedding
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
# <mask> takes the space on its left, as in roberta-base's and xlm-roberta-base's files
MASK = AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True)

LONG_TEXT = (
    "A long text: the license grants each person who receives a copy of the program "
    "the right to run it for any purpose, to study how it works and adapt it to their "
    "needs, to redistribute copies so they can help their neighbours, and to improve "
    "the program and release those improvements to the public, so that the whole "
    "community benefits; access to the source code is a precondition for all of this, "
    "and nobody may take these freedoms away from the people who come after them.")
TEXTS = [
    "Hello!",
    "The quick brown fox jumps over the lazy dog.",
    "She ordered a café au lait and paid 3.50 euros, didn't she?",
    "Wait -- what (exactly) do you mean by \"soon\"?",
    "The temperature reached 40°C in Zürich; nobody expected it.",
    "Crème brûlée, naïve façade, Ångström and señor — très élégant.",
    "東京は日本の首都です。中文文件已保存。",
    "Привет, как дела? Γειά σου κόσμε!",
    "Launch day 🚀🙂 went well 👍🏽 for everyone.",
    "Two  spaces, then\ta tab.",
    LONG_TEXT,
]
QUERY = "Où est le code source ?"
DOCUMENTS = [
    "Le code source est sur le site.",
    "The source code is on the website.",
    "Der Quellcode ist online.",
    "源代码在网站上。",
    "We baked a cake 🎂 today.",
    "Копия программы бесплатна.",
    LONG_TEXT,
]


def training_texts(directory):
    with open(os.path.join(directory, "sentences.en.txt"), encoding="utf-8") as f:
        texts = [line.strip() for line in f if line.strip()]
    corpus = os.path.join(directory, "tokenizer", "corpus.jsonl")
    with open(corpus, encoding="utf-8") as f:
        next(f)  # a header: the tokenizers version and the sources
        texts += [json.loads(line)["text"] for line in f if line.strip()]
    return texts


def roberta_tokenizer(texts):
    """A byte-level BPE as roberta-base's tokenizer.json describes it."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, show_progress=False,
        special_tokens=[AddedToken(t, normalized=False, special=True)
                        for t in SPECIALS[:-1]] + [MASK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    assert [tokenizer.token_to_id(t) for t in SPECIALS] == list(range(len(SPECIALS)))
    tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", tokenizer.token_to_id("</s>")), ("<s>", tokenizer.token_to_id("<s>")),
        trim_offsets=True, add_prefix_space=False)
    return transformers.RobertaTokenizerFast(
        tokenizer_object=tokenizer, mask_token=MASK, model_max_length=MAX_SEQ)


def xlmr_tokenizer(texts, scratch):
    """A SentencePiece Unigram model converted as XLM-R's sentencepiece.bpe.model is."""
    sentencepiece.set_random_generator_seed(SPM_SEED)
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, model_type="unigram",
        vocab_size=VOCAB, character_coverage=0.98, num_threads=1,
        minloglevel=2)  # normalization_rule_name: the default nmt_nfkc
    path = os.path.join(scratch, "sentencepiece.bpe.model")
    with open(path, "wb") as f:
        f.write(model.getvalue())
    # XLMRobertaTokenizerFast(vocab_file=...) alone keeps only the five special tokens in
    # transformers 5: from_pretrained converts the .model first, with this class method.
    cls = transformers.XLMRobertaTokenizerFast
    kwargs = cls.convert_to_native_format(
        vocab_file=path, mask_token=MASK, model_max_length=MAX_SEQ)
    # Left over from the .model's own ids (<unk>=0, <s> and </s> as control pieces),
    # which the XLM-R conversion renumbers: kept, they would show in
    # tokenizer_config.json as "unk_id": 0 and "extra_special_tokens", which XLM-R's
    # files on the Hub do not have.
    assert kwargs.pop("unk_id") == 0
    assert [str(t) for t in kwargs.pop("additional_special_tokens")] == ["<s>", "</s>"]
    tokenizer = cls(**kwargs)
    assert len(tokenizer) == VOCAB + 2, len(tokenizer)  # fairseq's <pad>, <mask> added
    ids = [tokenizer.convert_tokens_to_ids(t) for t in SPECIALS]
    assert ids == [0, 1, 2, 3, VOCAB + 1], ids
    return tokenizer


def config_of(cls, vocab, **extra):
    return cls(
        vocab_size=vocab, hidden_size=D, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=FFN, hidden_act="gelu",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        max_position_embeddings=POSITIONS, type_vocab_size=1, layer_norm_eps=1e-5,
        initializer_range=INIT_STD, pad_token_id=PAD, bos_token_id=0, eos_token_id=2,
        **extra)


def seeded(model_cls, config, seed, heads=()):
    """The model with its LayerNorms and biases drawn, and the weights of the parameters
    named under `heads` from N(0, 1)."""
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
            elif isinstance(module, torch.nn.Linear):
                module.bias.uniform_(-0.2, 0.2)
        for name, parameter in model.named_parameters():
            if name.startswith(tuple(heads)) and heads and name.endswith(".weight"):
                parameter.normal_(0.0, 1.0)
    return model


CONFIG_FIELDS = (
    "model_type", "vocab_size", "num_hidden_layers", "hidden_size",
    "num_attention_heads", "intermediate_size", "hidden_act", "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps", "hidden_dropout_prob", "attention_probs_dropout_prob",
    "initializer_range", "pad_token_id", "bos_token_id", "eos_token_id")


def write_json(path, value, indent=2):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=indent)
        f.write("\n")


def write_sentence_transformers_files(folder, pooling, versions):
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
        "word_embedding_dimension": D, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": False,
        "include_prompt": True})
    write_json(os.path.join(folder, "sentence_bert_config.json"),
               {"max_seq_length": MAX_SEQ, "do_lower_case": False})
    write_json(os.path.join(folder, "config_sentence_transformers.json"), {
        "__version__": {"sentence_transformers": versions["sentence_transformers"],
                        "transformers": versions["transformers"],
                        "pytorch": versions["torch"]},
        "model_type": "SentenceTransformer", "prompts": {}, "default_prompt_name": None,
        "similarity_fn_name": "cosine"})


def rounded(values):
    if isinstance(values, (list, tuple)):
        return [rounded(v) for v in values]
    return float(f"{float(values):.8g}")


class FedInputs:
    """Records the keyword arguments given to a model's forward (sentence-transformers
    calls model.forward itself, past the module hooks)."""

    def __init__(self, model):
        self.keys = set()
        forward = model.forward

        def recorded(*args, **kwargs):
            assert not args, "inputs passed by position"
            self.keys |= {k for k, v in kwargs.items()
                          if v is not None and k != "return_dict"}
            return forward(**kwargs)
        model.forward = recorded


def embedder(directory, name, model_cls, tokenizer, pooling, versions):
    config = config_of(model_cls.config_class, len(tokenizer))
    folder = os.path.join(directory, name)
    shutil.rmtree(folder, ignore_errors=True)
    seeded(model_cls, config, SEEDS[name]).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_sentence_transformers_files(folder, pooling, versions)

    pipeline = SentenceTransformer(folder, device="cpu")
    assert pipeline.max_seq_length == MAX_SEQ, pipeline.max_seq_length
    modules = [type(m).__name__ for m in pipeline]
    assert modules == ["Transformer", "Pooling", "Normalize"], modules
    assert type(pipeline[0].auto_model) is model_cls, type(pipeline[0].auto_model)
    assert pipeline[1].get_config_dict()["pooling_mode"] == pooling
    features = pipeline.preprocess(TEXTS)
    assert "token_type_ids" not in features, features.keys()
    token_ids = [ids[mask.bool()].tolist()
                 for ids, mask in zip(features["input_ids"], features["attention_mask"])]
    reloaded = transformers.AutoTokenizer.from_pretrained(folder)
    assert type(reloaded) is type(tokenizer), type(reloaded)
    assert token_ids == [reloaded(t, truncation=True, max_length=MAX_SEQ)["input_ids"]
                         for t in TEXTS]
    # tokenizer.json read by `tokenizers` itself, as attnserve reads it: transformers 5
    # rebuilds the XLM-R and RoBERTa pipelines in code and takes only the vocabulary,
    # merges, charsmap and post-processor from the file.
    raw = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    raw.enable_truncation(MAX_SEQ)
    assert token_ids == [e.ids for e in raw.encode_batch(TEXTS)]
    assert max(len(ids) for ids in token_ids) == MAX_SEQ, "no text is truncated"
    assert sum(len(ids) == MAX_SEQ for ids in token_ids) == 1, "more than one truncated"
    fed = FedInputs(pipeline[0].auto_model)
    embeddings = pipeline.encode(TEXTS, convert_to_numpy=True)
    assert fed.keys == {"input_ids", "attention_mask"}, fed.keys
    pooled = SentenceTransformer(modules=list(pipeline)[:2], device="cpu").encode(
        TEXTS, convert_to_numpy=True)
    # The model alone, one text at a time (no padding), agrees with the batched pipeline.
    with torch.inference_mode():
        for ids, row in zip(token_ids, pooled):
            states = pipeline[0].auto_model(input_ids=torch.tensor([ids]))
            states = states.last_hidden_state
            alone = states[0, 0] if pooling == "cls" else states[0].mean(0)
            assert torch.allclose(alone, torch.from_numpy(row), atol=1e-5)
    golden = {
        "texts": TEXTS,
        "max_seq_length": MAX_SEQ,
        "token_ids": token_ids,
        "embeddings": rounded(embeddings.tolist()),
        "unnormalized": rounded(pooled.tolist()),
        "pooling": pooling,
        "versions": versions,
        "config": {key: getattr(config, key) for key in CONFIG_FIELDS},
        "seed": SEEDS[name],
    }
    write_json(os.path.join(directory, name + ".golden.json"), golden)


def reranker(directory, tokenizer, versions):
    name = "xlmr_reranker_tiny"
    cls = transformers.XLMRobertaForSequenceClassification
    config = config_of(transformers.XLMRobertaConfig, len(tokenizer), num_labels=1)
    folder = os.path.join(directory, name)
    shutil.rmtree(folder, ignore_errors=True)
    model = seeded(cls, config, SEEDS[name], heads=("classifier.",))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)

    cross = CrossEncoder(folder, device="cpu")
    assert type(cross.model) is cls, type(cross.model)
    assert cross.max_seq_length == MAX_SEQ, cross.max_seq_length
    assert isinstance(cross.activation_fn, torch.nn.Sigmoid), cross.activation_fn
    pairs = [[QUERY, document] for document in DOCUMENTS]
    fed = FedInputs(cross.model)
    scores = cross.predict(pairs, batch_size=4, convert_to_numpy=True).tolist()
    assert fed.keys == {"input_ids", "attention_mask"}, fed.keys
    reloaded = transformers.AutoTokenizer.from_pretrained(folder)
    encoded = [reloaded(QUERY, document, truncation="longest_first", max_length=MAX_SEQ)
               for document in DOCUMENTS]
    assert all("token_type_ids" not in e for e in encoded)
    ids = [e["input_ids"] for e in encoded]
    raw = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    assert len(raw.encode(QUERY, LONG_TEXT).ids) > MAX_SEQ
    raw.enable_truncation(MAX_SEQ, strategy="longest_first")
    encodings = raw.encode_batch(pairs)
    assert ids == [e.ids for e in encodings]
    assert all(set(e.type_ids) == {0} for e in encodings)
    assert [len(i) == MAX_SEQ for i in ids] == [d is LONG_TEXT for d in DOCUMENTS]
    saved = cls.from_pretrained(folder).eval()
    with torch.inference_mode():
        logits = [saved(input_ids=torch.tensor([i])).logits[0, 0].item() for i in ids]
    assert torch.allclose(torch.sigmoid(torch.tensor(logits)), torch.tensor(scores),
                          atol=1e-6), (logits, scores)
    golden = {
        "query": QUERY,
        "documents": DOCUMENTS,
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
                "tokenizers": tokenizers.__version__,
                "sentencepiece": sentencepiece.__version__}
    texts = training_texts(directory)
    embedder(directory, "roberta_tiny", transformers.RobertaModel,
             roberta_tokenizer(texts), "mean",
             {k: v for k, v in versions.items() if k != "sentencepiece"})
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = xlmr_tokenizer(texts, scratch)
    embedder(directory, "xlmr_tiny", transformers.XLMRobertaModel, tokenizer, "cls",
             versions)
    reranker(directory, tokenizer, versions)


if __name__ == "__main__":
    main(sys.argv[1])
