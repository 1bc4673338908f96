#!/usr/bin/python3
"""Rerank and classify end to end: two BERT cross-encoders made by
tests/tools/make_reranker_golden.py (tests/data/reranker_tiny, a one-label reranker
saved by sentence-transformers' CrossEncoder, and tests/data/classifier_tiny, three
labels with id2label) served from their folders as saved, on one real attnserve on
127.0.0.1:0, against the goldens sentence-transformers and transformers computed
(tests/data/*.golden.json).

- Cohere's own Python client (ClientV2.rerank, POST /v2/rerank), the Jina/Cohere body at
  /v1/rerank, TEI's /rerank and /predict, attnserve.v1 Rerank and Encode with text pairs,
  tritonclient gRPC and HTTP (BYTES "query" and "documents", or "text" and "text_pair"),
  attnctl rerank and classify, attnserve's Python client, and LangChain's CohereRerank
  (its own venv, RAG_PYTHON): scores within 1e-5 of CrossEncoder.predict, the same
  order, top_n and documents.
- The pairs' token ids (return_token_ids) equal tokenizers' encode(query, document),
  truncated longest_first at the model's 64 positions.
- A malformed-input matrix over the new doors: each refused naming the field, the value
  or the limit, in the API's own error shape; the server keeps serving.

usage: rerank_test.py ATTNSERVE ATTNCTL REPO_ROOT RAG_PYTHON
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest
import urllib.request

import cohere
import grpc
import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

SERVER, ATTNCTL, ROOT, RAG_PYTHON = sys.argv[1:5]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import stubs  # noqa: E402
from attnserve.v1 import attention_pb2, attention_pb2_grpc  # noqa: E402

DATA = os.path.abspath(os.path.join(ROOT, "tests", "data"))
TOLERANCE = 1e-5


class RerankTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stub_dir = stubs.generate_stubs(ROOT)
        cls.repository = tempfile.TemporaryDirectory()
        for model in ("reranker_tiny", "classifier_tiny"):
            folder = os.path.join(cls.repository.name, model)
            os.mkdir(folder)
            for name in os.listdir(os.path.join(DATA, model)):
                os.symlink(os.path.join(DATA, model, name), os.path.join(folder, name))
            with open(os.path.join(folder, "config.pbtxt"), "w") as f:
                f.write("encoder {}\n")
        with open(os.path.join(DATA, "reranker_tiny.golden.json"), encoding="utf-8") as f:
            cls.rerank = json.load(f)
        with open(os.path.join(DATA, "classifier_tiny.golden.json"),
                  encoding="utf-8") as f:
            cls.classify = json.load(f)
        cls.server = stubs.Attnserve(SERVER, f"--model_repository={cls.repository.name}",
                                     "--max_queue_delay=2ms",
                                     "--default_model=reranker_tiny", http=True,
                                     metrics=True)
        cls.http = f"http://127.0.0.1:{cls.server.http_port}"
        cls.channel = grpc.insecure_channel(cls.server.target)
        cls.v1 = attention_pb2_grpc.AttentionServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.server.stop() == 0
        cls.repository.cleanup()

    def post(self, path, body):
        """(HTTP status, parsed JSON) of a POST of `body` (bytes or a JSON value)."""
        return stubs.post_json(self.http + path, body)

    def scored(self):
        """attnserve_scored_sequences_total{model="reranker_tiny"} now."""
        url = f"http://127.0.0.1:{self.server.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith('attnserve_scored_sequences_total{model="reranker_tiny"}'):
                    return float(line.rsplit(" ", 1)[1])
        return None

    def golden_order(self):
        scores = np.asarray(self.rerank["scores"])
        return [int(i) for i in np.argsort(-scores, kind="stable")], scores

    def assertRanked(self, indices, scores, who, top_n=None):
        """`indices` best first with `scores`, as the golden ranks and scores them."""
        order, golden = self.golden_order()
        want = order[:top_n] if top_n else order
        self.assertEqual(len(indices), len(want), who)
        np.testing.assert_allclose(scores, golden[indices], atol=TOLERANCE, err_msg=who)
        # Ranks: identical wherever the golden scores differ by more than the tolerance.
        for a, b in zip(indices, want):
            if a != b:
                self.assertLess(abs(golden[a] - golden[b]), TOLERANCE, who)

    def test_cohere_client_ranks_as_cross_encoder(self):
        client = cohere.ClientV2(api_key="not-checked", base_url=self.http)
        before = self.scored()
        self.assertIsNotNone(before)
        reply = client.rerank(model="reranker_tiny", query=self.rerank["query"],
                              documents=self.rerank["documents"])
        self.assertRanked([r.index for r in reply.results],
                          [r.relevance_score for r in reply.results], "cohere v2")
        # Every document is one pair scored (counted before the answer is sent).
        self.assertEqual(self.scored(), before + len(self.rerank["documents"]))
        top = client.rerank(model="reranker_tiny", query=self.rerank["query"],
                            documents=self.rerank["documents"], top_n=3)
        self.assertRanked([r.index for r in top.results],
                          [r.relevance_score for r in top.results], "cohere top_n",
                          top_n=3)

    def test_langchain_cohere_rerank_ranks_as_cross_encoder(self):
        # LangChain's class, as a RAG pipeline calls it: rerank() and compress_documents().
        script = """
import json, sys
from langchain_cohere import CohereRerank
from langchain_core.documents import Document
base_url, query, documents = json.loads(sys.stdin.read())
reranker = CohereRerank(base_url=base_url, cohere_api_key="not-checked",
                        model="reranker_tiny", top_n=3)
ranked = reranker.rerank(documents, query)
kept = reranker.compress_documents([Document(page_content=d) for d in documents], query)
print(json.dumps({"ranked": ranked, "kept": [[d.page_content, d.metadata["relevance_score"]]
                                             for d in kept]}))
"""
        self.assertTrue(os.path.exists(RAG_PYTHON),
                        f"{RAG_PYTHON} is missing: `make deps` makes it")
        run = subprocess.run(
            [RAG_PYTHON, "-c", script], capture_output=True, text=True, timeout=120,
            input=json.dumps([self.http, self.rerank["query"], self.rerank["documents"]]))
        self.assertEqual(run.returncode, 0, run.stderr[-2000:])
        reply = json.loads(run.stdout.strip().splitlines()[-1])
        self.assertRanked([r["index"] for r in reply["ranked"]],
                          [r["relevance_score"] for r in reply["ranked"]], "langchain",
                          top_n=3)
        documents = self.rerank["documents"]
        self.assertRanked([documents.index(text) for text, _ in reply["kept"]],
                          [score for _, score in reply["kept"]], "langchain documents",
                          top_n=3)

    def test_jina_shape_with_documents_and_usage(self):
        documents = [{"text": d} for d in self.rerank["documents"]]
        status, body = self.post("/v1/rerank", {
            "model": "reranker_tiny", "query": self.rerank["query"],
            "documents": documents, "top_n": 2, "return_documents": True})
        self.assertEqual(status, 200, body)
        results = body["results"]
        self.assertRanked([r["index"] for r in results],
                          [r["relevance_score"] for r in results], "jina", top_n=2)
        for result in results:
            self.assertEqual(result["document"]["text"],
                             self.rerank["documents"][result["index"]])
        self.assertEqual(body["usage"]["total_tokens"],
                         sum(len(ids) for ids in self.rerank["token_ids"]))
        # Optional fields sent as null are absent; a document limit the model's own
        # limit already meets is accepted.
        status, body = self.post("/v1/rerank", {
            "model": "reranker_tiny", "query": self.rerank["query"],
            "documents": self.rerank["documents"], "top_n": None, "return_documents": None,
            "max_tokens_per_doc": 4096})
        self.assertEqual(status, 200, body)
        self.assertEqual(len(body["results"]), len(self.rerank["documents"]))
        # top_n over the documents: all of them, as Cohere and Jina answer.
        status, body = self.post("/v1/rerank", {
            "query": self.rerank["query"], "documents": self.rerank["documents"],
            "top_n": 100})
        self.assertEqual(status, 200, body)
        self.assertEqual(len(body["results"]), len(self.rerank["documents"]))

    def test_tei_rerank_and_raw_scores(self):
        status, body = self.post("/rerank", {
            "query": self.rerank["query"], "texts": self.rerank["documents"],
            "truncate": True, "return_text": True})
        self.assertEqual(status, 200, body)
        self.assertRanked([r["index"] for r in body], [r["score"] for r in body], "tei")
        self.assertEqual(body[0]["text"], self.rerank["documents"][body[0]["index"]])
        status, raw = self.post("/rerank", {
            "query": self.rerank["query"], "texts": self.rerank["documents"],
            "truncate": True, "raw_scores": True})
        self.assertEqual(status, 200, raw)
        golden = np.asarray(self.rerank["scores"])
        logits = np.log(golden / (1.0 - golden))  # the sigmoid's inverse
        for result in raw:
            self.assertAlmostEqual(result["score"], logits[result["index"]], delta=1e-4)
        # TEI refuses a pair over the limit unless truncate.
        status, body = self.post("/rerank", {
            "query": self.rerank["query"], "texts": self.rerank["documents"]})
        self.assertEqual(status, 422, body)
        self.assertIn("over the model's limit of 64", body["error"])

    def test_a_head_mask_reaches_the_reranker_at_every_rerank_door(self):
        """2 layers x 4 heads. Ones are the model itself; zeros change the scores; a
        wrong count is refused naming the field and the limit (the numerics of a mask
        are checked against transformers in heads_test)."""
        query, documents = self.rerank["query"], self.rerank["documents"]
        ones, cut = [[1.0] * 4] * 2, [[0.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.5, 1.0]]

        def scores(path, mask):
            body = ({"query": query, "texts": documents, "truncate": True}
                    if path == "/rerank" else
                    {"model": "reranker_tiny", "query": query, "documents": documents})
            if mask is not None:
                body["head_mask"] = mask
            status, reply = self.post(path, body)
            self.assertEqual(status, 200, reply)
            results = reply if path == "/rerank" else reply["results"]
            key = "score" if path == "/rerank" else "relevance_score"
            return np.array([r[key] for r in sorted(results, key=lambda r: r["index"])])

        for path in ("/rerank", "/v1/rerank"):
            with self.subTest(path=path):
                plain = scores(path, None)
                np.testing.assert_allclose(scores(path, ones), plain, atol=1e-6)
                self.assertGreater(np.abs(scores(path, cut) - plain).max(), 1e-4)
                status, reply = self.post(path, {
                    "query": query, "texts": documents, "head_mask": [1.0] * 5}
                    if path == "/rerank" else {
                    "query": query, "documents": documents, "head_mask": [1.0] * 5})
                self.assertNotEqual(status, 200, reply)
                self.assertIn("num_layers * num_heads", json.dumps(reply))
        status, reply = self.post("/predict", {"inputs": [[query, documents[0]]],
                                               "head_mask": cut})
        self.assertEqual(status, 200, reply)

    def test_encode_pairs_token_ids_equal_tokenizers(self):
        count = len(self.rerank["documents"])
        reply = self.v1.Encode(attention_pb2.EncodeRequest(
            model="reranker_tiny", text=[self.rerank["query"]] * count,
            text_pair=self.rerank["documents"], truncate=True, return_token_ids=True),
            timeout=60)
        self.assertEqual(list(reply.scores.shape), [count, 1])
        self.assertFalse(reply.HasField("embedding"))
        scores = np.frombuffer(reply.scores.raw, dtype=np.float32)
        np.testing.assert_allclose(scores, self.rerank["scores"], atol=TOLERANCE)
        offsets = np.concatenate([[0], np.cumsum(reply.lengths)])
        ids = [list(reply.token_ids[offsets[i]:offsets[i + 1]]) for i in range(count)]
        self.assertEqual(ids, self.rerank["token_ids"])
        self.assertEqual(reply.truncated, 1)

    def test_tritonclient_ranks_query_and_documents(self):
        documents = np.array([d.encode() for d in self.rerank["documents"]],
                             dtype=np.object_)
        query = np.array([self.rerank["query"].encode()], dtype=np.object_)
        grpc_client = triton_grpc.InferenceServerClient(self.server.target)
        http_client = triton_http.InferenceServerClient(
            f"127.0.0.1:{self.server.http_port}")
        try:
            metadata = grpc_client.get_model_metadata("reranker_tiny")
            names = [(i.name, i.datatype) for i in metadata.inputs]
            for name in ("query", "documents", "text_pair"):
                self.assertIn((name, "BYTES"), names)
            self.assertEqual([(o.name, list(o.shape)) for o in metadata.outputs][0],
                             ("scores", [-1, 1]))
            inputs = []
            for name, data in (("query", query), ("documents", documents)):
                entry = triton_grpc.InferInput(name, list(data.shape), "BYTES")
                entry.set_data_from_numpy(data)
                inputs.append(entry)
            truncate = {"truncate": True}
            result = grpc_client.infer("reranker_tiny", inputs, parameters=truncate)
            scores = result.as_numpy("scores")
            self.assertEqual(scores.shape, (len(documents),))
            np.testing.assert_allclose(scores, self.rerank["scores"], atol=TOLERANCE)
            # HTTP, JSON data: the classifier's logits of pairs as text and text_pair.
            golden = self.classify
            inputs = []
            for name, column in (("text", 0), ("text_pair", 1)):
                data = np.array([p[column].encode() for p in golden["pairs"]],
                                dtype=np.object_)
                entry = triton_http.InferInput(name, [len(data)], "BYTES")
                entry.set_data_from_numpy(data, binary_data=False)
                inputs.append(entry)
            result = http_client.infer("classifier_tiny", inputs,
                                       parameters={"raw_scores": True, "truncate": True})
            np.testing.assert_allclose(result.as_numpy("scores"), golden["pairs_logits"],
                                       atol=TOLERANCE)
            # Ranking by a three-label classifier is refused, naming the labels.
            entries = []
            for name, data in (("query", query), ("documents", documents[:2])):
                entry = triton_grpc.InferInput(name, list(data.shape), "BYTES")
                entry.set_data_from_numpy(data)
                entries.append(entry)
            with self.assertRaises(Exception) as refused:
                grpc_client.infer("classifier_tiny", entries)
            self.assertIn("has 3 labels", str(refused.exception))
            with self.assertRaises(Exception) as refused:
                grpc_client.infer("reranker_tiny", entries[:1])
            self.assertIn("needs input \"documents\"", str(refused.exception))
        finally:
            grpc_client.close()
            http_client.close()

    def test_attnctl_and_python_client_rerank(self):
        from attnserve.client import Client
        order, golden = self.golden_order()
        run = subprocess.run(
            [ATTNCTL, f"--target={self.server.target}", "--model=reranker_tiny",
             "--truncate", "--top_n=3", "rerank", self.rerank["query"]] +
            self.rerank["documents"], capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        lines = [line for line in run.stdout.splitlines() if line[:1].isdigit()]
        self.assertEqual(len(lines), 3, run.stdout)
        for rank, line in enumerate(lines):
            index = int(line.split("document[")[1].split("]")[0])
            score = float(line.split("score=")[1].split()[0])
            self.assertAlmostEqual(score, golden[order[rank]], delta=TOLERANCE)
        run = subprocess.run(
            [ATTNCTL, f"--target={self.server.target}", "--model=classifier_tiny",
             "--pairs", "--truncate", "classify"] + [t for pair in self.classify["pairs"] for t in pair],
            capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("scores_shape=[2, 3]", run.stdout)
        with Client(self.server.target, timeout=60) as client:
            ranked = client.rerank(self.rerank["query"], self.rerank["documents"],
                                   model="reranker_tiny", top_n=4)
            self.assertRanked([i for i, _ in ranked], [s for _, s in ranked],
                              "python client", top_n=4)
            scores = client.classify(self.classify["texts"], model="classifier_tiny")
            np.testing.assert_allclose(scores, self.classify["texts_scores"],
                                       atol=TOLERANCE)

    def test_grpc_rerank(self):
        request = attention_pb2.RerankRequest(
            model="reranker_tiny", query=self.rerank["query"],
            documents=self.rerank["documents"], truncate=True, return_documents=True,
            request_id="r-1")
        reply = self.v1.Rerank(request, timeout=60)
        self.assertRanked([r.index for r in reply.results],
                          [r.score for r in reply.results], "grpc Rerank")
        for result in reply.results:
            self.assertEqual(result.document, self.rerank["documents"][result.index])
        self.assertEqual(reply.tokens, sum(len(ids) for ids in self.rerank["token_ids"]))
        self.assertEqual(reply.truncated, 1)
        self.assertEqual((reply.model, reply.request_id), ("reranker_tiny", "r-1"))
        request.top_n, request.return_documents = 2, False
        reply = self.v1.Rerank(request, timeout=60)
        self.assertRanked([r.index for r in reply.results],
                          [r.score for r in reply.results], "grpc top_n", top_n=2)
        self.assertEqual(reply.results[0].document, "")
        # Refusals, each naming what is wrong, the server still serving after them.
        documents = self.rerank["documents"]
        cases = [
            (dict(model="classifier_tiny", query="q", documents=["d"]), "has 3 labels"),
            (dict(model="reranker_tiny", query="q", documents=[]),
             "documents must not be empty"),
            (dict(model="reranker_tiny", query="q", documents=["d"] * 1001),
             "documents holds 1001 entries, over the limit of 1000"),
            (dict(model="reranker_tiny", query="q", documents=["d"], top_n=-1),
             "top_n must be 0 (every document) or positive, got -1"),
            (dict(model="reranker_tiny", query=self.rerank["query"], documents=documents),
             "over the model's limit of 64"),
            (dict(model="nope", query="q", documents=["d"]), "nope"),
        ]
        for fields, words in cases:
            with self.subTest(words=words):
                with self.assertRaises(grpc.RpcError) as caught:
                    self.v1.Rerank(attention_pb2.RerankRequest(**fields), timeout=60)
                self.assertIn(caught.exception.code(), (grpc.StatusCode.INVALID_ARGUMENT,
                                                        grpc.StatusCode.NOT_FOUND))
                self.assertIn(words, caught.exception.details())
        self.assertEqual(len(self.v1.Rerank(attention_pb2.RerankRequest(
            model="reranker_tiny", query="q", documents=["d", "e"]), timeout=60).results), 2)

    def test_tei_predict_matches_transformers(self):
        golden = self.classify
        labels = golden["labels"]

        def check(answer, scores, who):
            # TEI's answer: every label, best first.
            self.assertEqual(sorted(a["label"] for a in answer), sorted(labels), who)
            got = {a["label"]: a["score"] for a in answer}
            for label, score in zip(labels, scores):
                self.assertAlmostEqual(got[label], score, delta=TOLERANCE, msg=who)
            self.assertEqual([a["score"] for a in answer],
                             sorted((a["score"] for a in answer), reverse=True), who)

        status, body = self.post("/predict", {"model": "x", "inputs": "a"})
        self.assertEqual(status, 422, body)  # unknown field "model"
        # TEI's /predict serves the default model; ask KServe-free through a server
        # whose default is the classifier: attnserve.v1 Encode instead for the texts.
        reply = self.v1.Encode(attention_pb2.EncodeRequest(
            model="classifier_tiny", text=golden["texts"]), timeout=60)
        scores = np.frombuffer(reply.scores.raw, dtype=np.float32).reshape(-1, 3)
        np.testing.assert_allclose(scores, golden["texts_scores"], atol=TOLERANCE)
        reply = self.v1.Encode(attention_pb2.EncodeRequest(
            model="classifier_tiny", text=[p[0] for p in golden["pairs"]],
            text_pair=[p[1] for p in golden["pairs"]], raw_scores=True, truncate=True),
            timeout=60)
        logits = np.frombuffer(reply.scores.raw, dtype=np.float32).reshape(-1, 3)
        np.testing.assert_allclose(logits, golden["pairs_logits"], atol=TOLERANCE)
        # /predict on the default model, a one-label reranker: one label each.
        status, body = self.post("/predict", {
            "inputs": [[self.rerank["query"], d] for d in self.rerank["documents"][:3]]})
        self.assertEqual(status, 200, body)
        self.assertEqual(len(body), 3)
        for answer, score in zip(body, self.rerank["scores"][:3]):
            self.assertEqual(answer[0]["label"], "LABEL_0")
            self.assertAlmostEqual(answer[0]["score"], score, delta=TOLERANCE)
        check_server = stubs.Attnserve(
            SERVER, f"--model_repository={self.repository.name}",
            "--default_model=classifier_tiny", http=True)
        try:
            self.http, saved = f"http://127.0.0.1:{check_server.http_port}", self.http
            status, body = self.post("/predict", {"inputs": golden["texts"][0]})
            self.assertEqual(status, 200, body)
            check(body, golden["texts_scores"][0], "predict text")
            status, body = self.post("/predict", {"inputs": golden["pairs"],
                                                  "truncate": True})
            self.assertEqual(status, 200, body)
            for answer, scores in zip(body, golden["pairs_scores"]):
                check(answer, scores, "predict pairs")
            # A three-label classifier does not rerank.
            status, body = self.post("/rerank", {"query": "a", "texts": ["b"]})
            self.assertEqual(status, 422, body)
            self.assertIn("has 3 labels", body["error"])
        finally:
            self.http = saved
            self.assertEqual(check_server.stop(), 0)

    def test_malformed_inputs_are_refused_naming_the_field(self):
        query, documents = self.rerank["query"], self.rerank["documents"]
        cases = [
            ("/v1/rerank", {"query": query, "documents": []}, 400, "documents must not be"),
            ("/v1/rerank", {"query": query, "documents": documents, "top_n": 0}, 400,
             "top_n must be a positive integer"),
            ("/v1/rerank", {"query": query, "documents": documents, "top_n": -3}, 400,
             "top_n must be a positive integer"),
            ("/v1/rerank", {"documents": documents}, 400, "query is required"),
            ("/v1/rerank", {"query": query}, 400, "documents is required"),
            ("/v1/rerank", {"query": query, "documents": ["x"] * 10000}, 400,
             "holds 10000 entries, over the limit of 1000"),
            ("/v1/rerank", {"query": query, "documents": [1, 2]}, 400,
             "documents[0] must be a string"),
            ("/v1/rerank", {"query": query, "documents": [{"title": "x"}]}, 400,
             "documents[0] must be a string or {\"text\": string}"),
            ("/v1/rerank", {"query": query, "documents": documents,
                            "max_tokens_per_doc": 8}, 400,
             "max_tokens_per_doc below the model's max_text_tokens (64)"),
            ("/v1/rerank", {"query": query, "documents": documents,
                            "max_tokens_per_doc": 0}, 400,
             "max_tokens_per_doc must be a positive integer, got 0"),
            ("/v1/rerank", {"query": None, "documents": documents}, 400,
             "query must be a string, got null"),
            ("/v1/rerank", {"query": 7, "documents": documents}, 400,
             "query must be a string"),
            ("/v1/rerank", {"query": query, "documents": documents, "model": "nope"}, 404,
             "nope"),
            ("/v1/rerank", b"{not json", 400, ""),
            ("/rerank", {"query": query, "texts": []}, 422, "texts must not be"),
            ("/rerank", {"query": query, "texts": "one"}, 422, "texts must be a list"),
            ("/rerank", {"query": query, "texts": documents, "truncate": "yes"}, 422,
             "truncate must be true or false"),
            ("/rerank", {"query": query, "texts": documents, "top_n": 2}, 422,
             "unknown field \"top_n\""),
            ("/rerank", {"query": query, "texts": ["\udcff"]}, 422, ""),
            ("/predict", {"inputs": []}, 422, "inputs must not be"),
            ("/predict", {"inputs": [["a", "b"], "c"]}, 422, "not a mix"),
            ("/predict", {"inputs": [["a", "b", "c"]]}, 422,
             "inputs[0] must be a text or a pair"),
            ("/predict", {}, 422, "inputs is required"),
            ("/embed", {"inputs": "a text"}, 422, "classifies"),
        ]
        infer = "/v2/models/reranker_tiny/infer"

        def tensor(name, data):
            return {"name": name, "datatype": "BYTES", "shape": [len(data)], "data": data}
        cases += [
            (infer, {"inputs": [tensor("query", ["a", "b"]), tensor("documents", ["c"])]},
             400, "input \"query\" must hold 1 text, got 2"),
            (infer, {"inputs": [tensor("documents", ["c"])]}, 400,
             "input \"documents\" needs input \"query\""),
            (infer, {"inputs": [tensor("query", ["a"]), tensor("documents", ["c"]),
                                tensor("text", ["d"])]}, 400,
             "send them without \"text\""),
            (infer, {"inputs": [tensor("query", ["a"]), tensor("documents", ["x"] * 1001)]},
             400, "holds 1001 texts, over the limit of 1000"),
            (infer, {"inputs": [tensor("text", ["a", "b"]), tensor("text_pair", ["c"])]},
             400, "text_pair has 1 texts and text 2"),
            (infer, {"inputs": [tensor("query", ["a"]), tensor("documents", ["c"])],
                     "parameters": {"raw_scores": "yes"}}, 400,
             "parameters[\"raw_scores\"] must be a bool_param"),
            (infer, {"inputs": [tensor("query", ["a"]), tensor("documents", documents)]},
             400, "over the model's limit of 64"),
        ]
        for path, body, code, words in cases:
            with self.subTest(path=path, body=str(body)[:80]):
                if isinstance(body, dict) and body.get("texts") == ["\udcff"]:
                    body = b'{"query": "q", "texts": ["\\udcff"]}'
                status, answer = self.post(path, body)
                self.assertEqual(status, code, answer)
                message = answer.get("message") if path == "/v1/rerank" else \
                    answer.get("error")
                self.assertIsInstance(message, str, answer)
                self.assertIn(words, message)
        # The server still serves.
        status, body = self.post("/rerank", {"query": query, "texts": documents[:2]})
        self.assertEqual(status, 200, body)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
