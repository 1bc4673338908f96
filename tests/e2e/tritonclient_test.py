#!/usr/bin/python3
"""Triton's own Python client (PyPI tritonclient[grpc], pinned in
deploy/requirements-client.txt) against a real attnserve on 127.0.0.1:0, through the
KServe v2 / Open Inference Protocol gRPC service on attnserve's port: health, metadata,
and inference whose answers equal attnserve's own API.

Then the same over HTTP/REST (--http_port) with tritonclient.http, JSON and binary
tensors, and the protocol's error bodies.

usage: tritonclient_test.py ATTNSERVE REPO_ROOT
"""
import os
import queue
import sys
import unittest

import json
import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as triton
from tritonclient.grpc import model_config_pb2
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

SERVER, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import stubs  # noqa: E402  (starts the server)

import attnserve  # noqa: E402  (the reference: attnserve's own API)


class TritonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = stubs.Attnserve(SERVER, "--max_queue_delay=1ms")
        cls.triton = triton.InferenceServerClient(url=cls.server.target)
        cls.own = attnserve.Client(cls.server.target)

    @classmethod
    def tearDownClass(cls):
        cls.triton.close()
        cls.own.close()
        assert cls.server.stop() == 0

    def test_health_and_metadata(self):
        self.assertTrue(self.triton.is_server_live())
        self.assertTrue(self.triton.is_server_ready())
        self.assertTrue(self.triton.is_model_ready("mha-base"))
        self.assertFalse(self.triton.is_model_ready("nope"))
        server = self.triton.get_server_metadata()
        self.assertEqual(server.name, "attnserve")
        self.assertEqual(set(server.extensions),
                         {"model_configuration", "statistics", "parameters",
                          "model_repository"})
        model = self.triton.get_model_metadata("mha-base")
        self.assertEqual([i.name for i in model.inputs], ["query", "memory"])
        self.assertEqual(list(model.inputs[0].shape), [-1, 512])
        self.assertEqual([o.name for o in model.outputs], ["output", "attention"])
        with self.assertRaises(InferenceServerException) as error:
            self.triton.get_model_metadata("nope")
        self.assertIn("not served", str(error.exception))

    def test_infer_equals_attnserves_own_api(self):
        query = np.random.default_rng(3).uniform(-1, 1, (2, 7, 512)).astype(np.float32)
        inputs = [triton.InferInput("query", list(query.shape), "FP32")]
        inputs[0].set_data_from_numpy(query)
        outputs = [triton.InferRequestedOutput("output"),
                   triton.InferRequestedOutput("attention")]
        result = self.triton.infer("mha-base", inputs, outputs=outputs, request_id="t-1",
                                   parameters={"causal": True})
        expected, weights = self.own.attend(query, causal=True, return_attention=True)
        np.testing.assert_array_equal(result.as_numpy("output"), expected)
        np.testing.assert_array_equal(result.as_numpy("attention"), weights)
        self.assertEqual(result.get_response().id, "t-1")

    def test_cross_attention_and_head_mask(self):
        rng = np.random.default_rng(4)
        query = rng.uniform(-1, 1, (5, 512)).astype(np.float32)
        memory = rng.uniform(-1, 1, (9, 512)).astype(np.float32)
        inputs = [triton.InferInput("query", [5, 512], "FP32"),
                  triton.InferInput("memory", [9, 512], "FP32")]
        inputs[0].set_data_from_numpy(query)
        inputs[1].set_data_from_numpy(memory)
        mask = [1, 0, 1, 1, 0.5, 1, 1, 0]
        result = self.triton.infer("mha-base", inputs,
                                   parameters={"head_mask": ",".join(map(str, mask))})
        expected = self.own.attend(query, memory=memory, head_mask=mask)
        np.testing.assert_array_equal(result.as_numpy("output"), expected)

    def test_errors_come_back_as_the_servers_status(self):
        inputs = [triton.InferInput("query", [3, 100], "FP32")]
        inputs[0].set_data_from_numpy(np.zeros((3, 100), dtype=np.float32))
        with self.assertRaises(InferenceServerException) as error:
            self.triton.infer("mha-base", inputs)
        self.assertIn("INVALID_ARGUMENT", error.exception.status())
        self.assertIn("512", error.exception.message())
        self.assertTrue(self.triton.is_server_live())

    def test_model_config_and_repository_index(self):
        config = self.triton.get_model_config("mha-base").config
        self.assertEqual((config.name, config.backend, config.max_batch_size),
                         ("mha-base", "attnserve", 0))
        self.assertEqual([(i.name, list(i.dims), i.optional) for i in config.input],
                         [("query", [-1, 512], False), ("memory", [-1, 512], True)])
        self.assertEqual([(o.name, list(o.dims)) for o in config.output],
                         [("output", [-1, 512]), ("attention", [8, -1, -1])])
        self.assertEqual(config.input[0].data_type, model_config_pb2.TYPE_FP32)
        with self.assertRaises(InferenceServerException) as error:
            self.triton.get_model_config("mha-base", model_version="2")
        self.assertIn("not served", str(error.exception))
        index = self.triton.get_model_repository_index().models
        self.assertEqual([(m.name, m.version, m.state) for m in index],
                         [("mha-base", "1", "READY")])

    def test_statistics_count_what_was_served(self):
        """ModelStatistics (Triton's statistics extension) counts exactly the requests
        this test sends."""
        def stats():
            return self.triton.get_inference_statistics("mha-base").model_stats[0]
        before = stats()
        query = np.ones((4, 512), dtype=np.float32)
        for _ in range(3):
            inputs = [triton.InferInput("query", [4, 512], "FP32")]
            inputs[0].set_data_from_numpy(query)
            self.triton.infer("mha-base", inputs)
        bad = [triton.InferInput("query", [2, 100], "FP32")]
        bad[0].set_data_from_numpy(np.zeros((2, 100), dtype=np.float32))
        with self.assertRaises(InferenceServerException):
            self.triton.infer("mha-base", bad)
        after = stats()
        self.assertEqual((after.name, after.version), ("mha-base", "1"))
        now, then = after.inference_stats, before.inference_stats
        self.assertEqual(now.success.count - then.success.count, 3)
        self.assertGreater(now.success.ns, then.success.ns)
        self.assertEqual(now.fail.count - then.fail.count, 1)
        self.assertEqual(now.queue.count - then.queue.count, 3)
        self.assertEqual(now.compute_infer.count - then.compute_infer.count, 3)
        self.assertGreater(now.compute_infer.ns, then.compute_infer.ns)
        self.assertEqual(after.inference_count - before.inference_count, 3)
        self.assertIn(after.execution_count - before.execution_count, (1, 2, 3))
        self.assertGreater(after.last_inference, 0)
        every = self.triton.get_inference_statistics().model_stats
        self.assertIn("mha-base", [model.name for model in every])
        with self.assertRaises(InferenceServerException) as error:
            self.triton.get_inference_statistics("nope")
        self.assertIn("not served", str(error.exception))

    def test_stream_answers_each_request_in_order(self):
        """ModelStreamInfer through tritonclient's own stream API: every request is
        answered, in order, with the unary API's answer; a bad one gets its error on the
        stream and the stream goes on. The stream's requests may be batched together, and
        oneDNN blocks sums by the batch's row count, so the last bits may differ from a
        lone request's (4e-7 measured)."""
        answers = queue.Queue()
        client = triton.InferenceServerClient(url=self.server.target)
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        rng = np.random.default_rng(5)
        queries = [rng.uniform(-1, 1, (length, 512)).astype(np.float32)
                   for length in (3, 17, 1, 64, 9)]
        for index, query in enumerate(queries):
            shape = list(query.shape) if index != 2 else [1, 100]  # index 2 is refused
            data = query if index != 2 else np.zeros((1, 100), dtype=np.float32)
            inputs = [triton.InferInput("query", shape, "FP32")]
            inputs[0].set_data_from_numpy(data)
            client.async_stream_infer("mha-base", inputs, request_id=f"s-{index}",
                                      parameters={"causal": index % 2 == 1})
        received = [answers.get(timeout=60) for _ in queries]
        client.stop_stream()
        client.close()
        for index, (query, (result, error)) in enumerate(zip(queries, received)):
            if index == 2:
                self.assertIsNone(result)
                self.assertIn("INVALID_ARGUMENT", str(error))
                self.assertIn("512", str(error))
                continue
            self.assertIsNone(error, f"request {index}")
            self.assertEqual(result.get_response().id, f"s-{index}")
            expected = self.own.attend(query, causal=index % 2 == 1)
            np.testing.assert_allclose(result.as_numpy("output"), expected, rtol=0,
                                       atol=1e-5)


class TritonHttpClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = stubs.Attnserve(SERVER, "--max_queue_delay=1ms", http=True)
        cls.url = f"127.0.0.1:{cls.server.http_port}"
        cls.triton = triton_http.InferenceServerClient(url=cls.url)
        cls.own = attnserve.Client(cls.server.target)

    @classmethod
    def tearDownClass(cls):
        cls.triton.close()
        cls.own.close()
        assert cls.server.stop() == 0

    def test_health_and_metadata(self):
        self.assertTrue(self.triton.is_server_live())
        self.assertTrue(self.triton.is_server_ready())
        self.assertTrue(self.triton.is_model_ready("mha-base"))
        self.assertFalse(self.triton.is_model_ready("nope"))
        self.assertEqual(self.triton.get_server_metadata()["name"], "attnserve")
        model = self.triton.get_model_metadata("mha-base")
        self.assertEqual(model["inputs"][0], {"name": "query", "datatype": "FP32",
                                              "shape": [-1, 512]})

    def test_infer_binary_and_json_equal_attnserves_own_api(self):
        query = np.random.default_rng(5).uniform(-1, 1, (2, 6, 512)).astype(np.float32)
        expected, weights = self.own.attend(query, causal=True, return_attention=True)
        for binary in (True, False):
            with self.subTest(binary=binary):
                inputs = [triton_http.InferInput("query", list(query.shape), "FP32")]
                inputs[0].set_data_from_numpy(query, binary_data=binary)
                outputs = [triton_http.InferRequestedOutput("output", binary_data=binary),
                           triton_http.InferRequestedOutput("attention", binary_data=binary)]
                result = self.triton.infer("mha-base", inputs, outputs=outputs,
                                           parameters={"causal": True}, request_id="h-1")
                np.testing.assert_array_equal(result.as_numpy("output"), expected)
                np.testing.assert_array_equal(result.as_numpy("attention"), weights)
                self.assertEqual(result.get_response()["id"], "h-1")

    def test_errors_are_json_with_the_http_status(self):
        def post(path, body):
            request = urllib.request.Request(f"http://{self.url}{path}", method="POST",
                                             data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as reply:
                    return reply.status, json.loads(reply.read())
            except urllib.error.HTTPError as error:
                return error.code, json.loads(error.read())
        narrow = {"inputs": [{"name": "query", "shape": [2, 3], "datatype": "FP32",
                              "data": [[1, 2, 3], [4, 5, 6]]}]}
        status, body = post("/v2/models/mha-base/infer", narrow)
        self.assertEqual(status, 400)
        self.assertIn("512", body["error"])
        status, body = post("/v2/models/nope/infer", narrow)
        self.assertEqual(status, 404)
        self.assertIn("nope", body["error"])
        status, body = post("/v2/models/mha-base/infer", {"inputs": "x"})
        self.assertEqual(status, 400)
        self.assertIn("inputs must be an array", body["error"])
        # Nested JSON data works, and the server keeps serving.
        ok = {"inputs": [{"name": "query", "shape": [1, 512], "datatype": "FP32",
                          "data": [[0.5] * 512]}]}
        status, body = post("/v2/models/mha-base/infer", ok)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["outputs"][0]["shape"], [1, 512])
        self.assertEqual(len(body["outputs"][0]["data"]), 512)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
