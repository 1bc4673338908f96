#!/usr/bin/python3
"""The pip-installed Python client (client/python, installed into the project venv by
deploy/install-deps.sh --test) against a real attnserve on 127.0.0.1:0: numpy in and
out in fp32 and bf16, attention weights, head statistics, errors, and its bf16
rounding against PyTorch's.

usage: python_package_test.py ATTNSERVE REPO_ROOT
"""
import os
import sys
import unittest

import grpc
import numpy as np

SERVER, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import stubs  # noqa: E402  (only to start the server; the stubs come from the package)

import attnserve  # noqa: E402


class PythonPackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = stubs.Attnserve(SERVER, "--max_queue_delay=1ms")
        cls.client = attnserve.Client(cls.server.target, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        assert cls.server.stop() == 0

    def test_installed_from_the_package_not_the_checkout(self):
        self.assertIn("site-packages", attnserve.__file__)

    def test_fp32_and_bf16_round_trips(self):
        query = np.random.default_rng(1).uniform(-1, 1, (2, 9, 512)).astype(np.float32)
        output, weights = self.client.attend(query, return_attention=True)
        self.assertEqual(output.shape, (2, 9, 512))
        self.assertEqual(output.dtype, np.float32)
        self.assertEqual(weights.shape, (2, 8, 9, 9))
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
        # Sequences are independent: the first alone gives the same rows.
        np.testing.assert_allclose(self.client.attend(query[0]), output[0], atol=1e-5)
        # bf16 in, bf16 out: the same answer up to bf16 rounding of the input and output.
        in_bf16 = attnserve.bf16_to_float32(attnserve.float32_to_bf16(query))
        expected = self.client.attend(in_bf16)
        got = self.client.attend(query, dtype="bf16")
        np.testing.assert_allclose(got, expected, rtol=2 ** -8, atol=1e-6)

    def test_bf16_rounding_matches_torch(self):
        import torch
        values = np.concatenate([
            np.random.default_rng(2).normal(0, 3, 10000).astype(np.float32),
            np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, np.inf, -np.inf, 3.4e38],
                     dtype=np.float32)])
        ours = attnserve.float32_to_bf16(values)
        theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy()
        np.testing.assert_array_equal(ours, theirs.view(np.uint16))
        np.testing.assert_array_equal(attnserve.bf16_to_float32(ours),
                                      torch.from_numpy(values).to(torch.bfloat16)
                                      .to(torch.float32).numpy())

    def test_head_statistics_and_models(self):
        same = np.tile(np.linspace(-1, 1, 512, dtype=np.float32), (6, 1))
        heads = self.client.head_statistics(same)
        self.assertEqual([h["head"] for h in heads], list(range(8)))
        for head in heads:  # identical tokens: uniform attention
            self.assertAlmostEqual(head["mean_entropy"], np.log(6), places=4)
            self.assertAlmostEqual(head["mean_max_weight"], 1 / 6, places=4)
        names = [model.name for model in self.client.models()]
        self.assertIn("mha-base", names)

    def test_errors_carry_the_servers_status(self):
        with self.assertRaises(grpc.RpcError) as error:
            self.client.attend(np.zeros((3, 100), dtype=np.float32))
        self.assertEqual(error.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("512", error.exception.details())
        with self.assertRaises(ValueError):
            attnserve.to_tensor(np.zeros((2, 2)), dtype="fp16")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
