#!/usr/bin/python3
"""Triton's own Python client (PyPI tritonclient[grpc], pinned in
deploy/requirements-test.txt) against a real attnserve on 127.0.0.1:0, through the
KServe v2 / Open Inference Protocol gRPC service on attnserve's port: health, metadata,
and inference whose answers equal attnserve's own API.

usage: tritonclient_test.py ATTNSERVE REPO_ROOT
"""
import os
import sys
import unittest

import numpy as np
import tritonclient.grpc as triton
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


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
