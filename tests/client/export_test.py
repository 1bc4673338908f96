#!/usr/bin/python3
"""client/python/attnserve_export.py with real PyTorch modules, served by a real
attnserve on 127.0.0.1:0 and called over gRPC: the served answers equal torch's, and
what attnserve does not compute is refused by name, both by the exporter and by the
server loading a hand-written file.

usage: export_test.py ATTNSERVE REPO_ROOT
"""
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

SERVER, ROOT = sys.argv[1], sys.argv[2]
EXPORT = os.path.join(ROOT, "client", "python", "attnserve_export.py")
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import attnserve_export  # noqa: E402
import stubs  # noqa: E402


def run_export(*args):
    return subprocess.run([sys.executable, EXPORT, *args], capture_output=True, text=True,
                          timeout=120)


def start_failure(repository):
    """attnserve's exit code and stderr when it is started on `repository`."""
    result = subprocess.run([SERVER, "--host=127.0.0.1", "--port=0", "--metrics_port=-1", "--http_port=-1",
                             f"--model_repository={repository}"],
                            capture_output=True, text=True, timeout=60)
    return result.returncode, result.stderr


class ExportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stub_dir = stubs.generate_stubs(ROOT)
        cls.dir = tempfile.TemporaryDirectory()
        torch.manual_seed(0)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()
        cls.stub_dir.cleanup()

    def path(self, *parts):
        return os.path.join(self.dir.name, *parts)

    def attend(self, repository, model, query):
        """query [n, L, d] float32 through a fresh attnserve; returns the output array."""
        import grpc
        from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2
        server = stubs.Attnserve(SERVER, f"--model_repository={repository}")
        try:
            with grpc.insecure_channel(server.target) as channel:
                stub = attention_pb2_grpc.AttentionServiceStub(channel)
                request = attention_pb2.AttendRequest(
                    model=model, query=tensor_pb2.Tensor(
                        dtype=tensor_pb2.DATA_TYPE_FP32, shape=list(query.shape),
                        raw=np.ascontiguousarray(query, dtype="<f4").tobytes()))
                response = stub.Attend(request, timeout=60)
            output = np.frombuffer(response.output.raw, dtype="<f4")
            return output.reshape(tuple(response.output.shape))
        finally:
            self.assertEqual(server.stop(), 0)

    def test_torch_is_debians(self):
        # The project venv sees Debian's python3-torch; a PyTorch from PyPI (pulled in
        # by a package's dependencies) would shadow it and change torch.load's defaults.
        self.assertTrue(torch.__file__.startswith("/usr/lib/python3/dist-packages/"),
                        torch.__file__)

    def test_module_file_serves_what_torch_computes(self):
        # PyTorch's default layout is [L, N, E]; attnserve's is batch-first [n, L, d].
        module = torch.nn.MultiheadAttention(64, 4).eval()
        torch.save(module, self.path("mha.pt"))
        result = run_export("--input", self.path("mha.pt"), "--out",
                            self.path("repo1", "mha"))
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(self.path("repo1", "mha", "config.pbtxt")) as config:
            self.assertEqual(config.read(), 'name: "mha"\nd_model: 64\nnum_heads: 4\n')
        x = torch.randn(7, 3, 64)  # [L, N, E]
        with torch.no_grad():
            expected, _ = module(x, x, x, need_weights=False)
        got = self.attend(self.path("repo1"), "mha", x.transpose(0, 1).numpy())
        np.testing.assert_allclose(got, expected.transpose(0, 1).numpy(), atol=1e-5)

    def test_prefix_of_a_larger_state_dict(self):
        layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=2).eval()
        torch.save(layer.state_dict(), self.path("layer.pt"))
        result = run_export("--input", self.path("layer.pt"), "--prefix", "self_attn.",
                            "--num_heads", "2", "--out", self.path("repo2", "layer-attn"))
        self.assertEqual(result.returncode, 0, result.stderr)
        x = torch.randn(5, 2, 32)
        with torch.no_grad():
            expected, _ = layer.self_attn(x, x, x, need_weights=False)
        got = self.attend(self.path("repo2"), "layer-attn", x.transpose(0, 1).numpy())
        np.testing.assert_allclose(got, expected.transpose(0, 1).numpy(), atol=1e-5)
        # Without the prefix the layer's other tensors are named, not ignored.
        result = run_export("--input", self.path("layer.pt"), "--num_heads", "2",
                            "--out", self.path("repo2", "whole"))
        self.assertEqual(result.returncode, 1)
        self.assertIn("unexpected tensor", result.stderr)
        # A prefix without its trailing dot is a likely slip: say what was meant.
        result = run_export("--input", self.path("layer.pt"), "--prefix", "self_attn",
                            "--num_heads", "2", "--out", self.path("repo2", "no-dot"))
        self.assertEqual(result.returncode, 1)
        self.assertIn("did you mean 'self_attn.'?", result.stderr)

    def test_exporter_refuses_unsupported_options_by_name(self):
        cases = {
            "add_bias_kv is not supported":
                torch.nn.MultiheadAttention(16, 2, add_bias_kv=True),
            "add_zero_attn is not supported":
                torch.nn.MultiheadAttention(16, 2, add_zero_attn=True),
            "bias=False is not supported": torch.nn.MultiheadAttention(16, 2, bias=False),
            "kdim/vdim different from embed_dim is not supported":
                torch.nn.MultiheadAttention(16, 2, kdim=8, vdim=8),
        }
        for message, module in cases.items():
            with self.subTest(message=message):
                torch.save(module, self.path("bad.pt"))
                result = run_export("--input", self.path("bad.pt"), "--out",
                                    self.path("repo3", "bad"))
                self.assertEqual(result.returncode, 1)
                self.assertIn(message, result.stderr)

    def test_server_refuses_hand_written_files_with_unsupported_tensors(self):
        # Files written without the exporter (e.g. safetensors.torch.save_file of a
        # state_dict): attnserve itself refuses what it would otherwise compute wrongly.
        cases = {
            "add_bias_kv is not supported": torch.nn.MultiheadAttention(
                16, 2, add_bias_kv=True).state_dict(),
            "bias=False is not supported": torch.nn.MultiheadAttention(
                16, 2, bias=False).state_dict(),
            "kdim/vdim different from embed_dim is not supported":
                torch.nn.MultiheadAttention(16, 2, kdim=8, vdim=8).state_dict(),
            "unexpected tensor 'extra'": dict(
                torch.nn.MultiheadAttention(16, 2).state_dict(), extra=torch.zeros(3)),
        }
        for index, (message, state) in enumerate(cases.items()):
            with self.subTest(message=message):
                folder = self.path(f"repo4_{index}", "m")
                os.makedirs(folder)
                attnserve_export.write_safetensors(
                    os.path.join(folder, "weights.safetensors"), state)
                with open(os.path.join(folder, "config.pbtxt"), "w") as config:
                    config.write("d_model: 16\nnum_heads: 2\n")
                code, stderr = start_failure(self.path(f"repo4_{index}"))
                self.assertEqual(code, 1, stderr)
                self.assertIn(message, stderr)
                self.assertIn('model "m"', stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
