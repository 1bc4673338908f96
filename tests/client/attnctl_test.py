#!/usr/bin/python3
"""attnctl against a real attnserve on 127.0.0.1:0: each subcommand, .npy round trips
checked with numpy, and malformed inputs with their exit codes and messages.

usage: attnctl_test.py ATTNSERVE ATTNCTL REPO_ROOT
"""
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

SERVER, ATTNCTL, ROOT = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import stubs  # noqa: E402


class AttnctlTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = stubs.Attnserve(SERVER, "--max_queue_delay=1ms")
        cls.dir = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0
        cls.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def run_attnctl(self, *args, target=None):
        return subprocess.run([ATTNCTL, f"--target={target or self.server.target}", *args],
                              capture_output=True, text=True, timeout=60)

    def test_health(self):
        result = self.run_attnctl("health")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), "SERVING")
        result = self.run_attnctl("health", "--model=mha-base")
        self.assertEqual(result.stdout.strip(), "mha-base: SERVING")
        result = self.run_attnctl("health", "--model=nope")
        self.assertEqual(result.returncode, 1)
        self.assertIn("NOT_FOUND", result.stderr)

    def test_models_and_model(self):
        result = self.run_attnctl("models")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stdout, r"mha-base\s+512\s+8\s+fp32")
        result = self.run_attnctl("model", "mha-base")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("d_model: 512", result.stdout)
        result = self.run_attnctl("model", "missing")
        self.assertEqual(result.returncode, 1)
        self.assertIn("NOT_FOUND", result.stderr)

    def test_infer_npy_round_trip(self):
        rng = np.random.default_rng(0)
        query = rng.uniform(-1, 1, size=(2, 5, 512)).astype("<f4")
        np.save(self.path("q.npy"), query)
        result = self.run_attnctl("infer", f"--input={self.path('q.npy')}",
                                  f"--output={self.path('y.npy')}",
                                  f"--attention_out={self.path('a.npy')}")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("output_shape=[2, 5, 512]", result.stdout)
        output = np.load(self.path("y.npy"))
        weights = np.load(self.path("a.npy"))
        self.assertEqual(output.shape, (2, 5, 512))
        self.assertEqual(output.dtype, np.float32)
        self.assertEqual(weights.shape, (2, 8, 5, 5))
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
        # The written output feeds back in as an input: the file format round-trips.
        result = self.run_attnctl("infer", f"--input={self.path('y.npy')}",
                                  f"--output={self.path('y2.npy')}")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(np.load(self.path("y2.npy")).shape, (2, 5, 512))
        # Sequences are independent: the first sequence alone gives the same output.
        np.save(self.path("q0.npy"), query[0])
        result = self.run_attnctl("infer", f"--input={self.path('q0.npy')}",
                                  f"--output={self.path('y0.npy')}")
        self.assertEqual(result.returncode, 0, result.stderr)
        np.testing.assert_allclose(np.load(self.path("y0.npy")), output[0], atol=1e-5)

    def test_infer_random_cross_causal_and_head_mask(self):
        result = self.run_attnctl("infer", "--random", "--seq_len=7", "--batch=3",
                                  "--causal", "--head_mask=1,1,0,1,1,0.5,1,1")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("output_shape=[3, 7, 512]", result.stdout)
        np.save(self.path("m.npy"), np.ones((4, 512), dtype="<f4"))
        np.save(self.path("q1.npy"), np.zeros((2, 512), dtype="<f4"))
        result = self.run_attnctl("infer", f"--input={self.path('q1.npy')}",
                                  f"--memory={self.path('m.npy')}")
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_help_exits_zero_and_lists_own_flags_without_build_paths(self):
        for binary, flags in ((ATTNCTL, ("--target", "--seq_len", "--head_mask")),
                              (SERVER, ("--port", "--builtin_model", "--precision"))):
            for spelling in ("--help", "-h"):
                result = subprocess.run([binary, spelling], capture_output=True,
                                        text=True, timeout=30)
                self.assertEqual(result.returncode, 0, result.stderr)
                for flag in flags:
                    self.assertIn(flag, result.stdout)
                self.assertNotIn(".cc", result.stdout)
                self.assertNotIn("--flagfile", result.stdout)  # Abseil's own flags

    def test_heads(self):
        # Identical tokens give identical keys, so every head attends uniformly: entropy
        # ln(L) and largest weight 1/L, computed here independently of the server.
        length = 10
        np.save(self.path("same.npy"), np.tile(np.linspace(-1, 1, 512, dtype="<f4"),
                                               (length, 1)))
        result = self.run_attnctl("heads", f"--input={self.path('same.npy')}")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"tokens={length}", result.stdout)
        rows = [line.split() for line in result.stdout.splitlines()
                if line.split() and line.split()[0].isdigit()]
        self.assertEqual([int(row[0]) for row in rows], list(range(8)))
        for row in rows:
            self.assertAlmostEqual(float(row[1]), np.log(length), places=3)
            self.assertAlmostEqual(float(row[2]), 1 / length, places=3)
            self.assertGreater(float(row[3]), 0)
        self.assertRegex(result.stdout, r"smallest output term first: (\d+, ){7}\d+")
        result = self.run_attnctl("heads", "--random", "--seq_len=6", "--causal")
        self.assertEqual(result.returncode, 0, result.stderr)
        result = self.run_attnctl("heads")
        self.assertEqual(result.returncode, 2)
        self.assertIn("heads needs exactly one of --input=FILE.npy and --random",
                      result.stderr)

    def test_rpc_error_exits_one_with_code_name(self):
        np.save(self.path("narrow.npy"), np.zeros((3, 16), dtype="<f4"))
        result = self.run_attnctl("infer", f"--input={self.path('narrow.npy')}")
        self.assertEqual(result.returncode, 1)
        self.assertIn("INVALID_ARGUMENT", result.stderr)
        self.assertIn("d_model=512", result.stderr)

    def test_unreachable_server_exits_one(self):
        result = self.run_attnctl("models", "--timeout=2s", target="127.0.0.1:1")
        self.assertEqual(result.returncode, 1)
        self.assertIn("UNAVAILABLE", result.stderr)

    def test_malformed_npy_files_exit_two(self):
        cases = {
            "magic.npy": (b"PK\x03\x04 not numpy at all", "bad magic"),
            "f8.npy": (None, "'<f8' is not supported"),
            "fortran.npy": (None, "Fortran-order"),
            "short.npy": (None, "truncated"),
        }
        with open(self.path("magic.npy"), "wb") as f:
            f.write(cases["magic.npy"][0])
        np.save(self.path("f8.npy"), np.zeros((2, 512), dtype="<f8"))
        np.save(self.path("fortran.npy"), np.asfortranarray(np.zeros((2, 512), dtype="<f4")))
        np.save(self.path("short.npy"), np.zeros((2, 512), dtype="<f4"))
        with open(self.path("short.npy"), "r+b") as f:
            f.truncate(os.path.getsize(self.path("short.npy")) - 100)
        for name, (_, words) in cases.items():
            result = self.run_attnctl("infer", f"--input={self.path(name)}")
            self.assertEqual(result.returncode, 2, (name, result.stderr))
            self.assertIn(words, result.stderr, name)

    def test_usage_errors_exit_two(self):
        for args in (["frobnicate"], [], ["infer"], ["infer", "--random", "--seq_len=x"],
                     ["models", "--no_such_flag=1"], ["infer", "--random", "--input=a.npy"],
                     ["infer", "--random", "--lb=random"]):
            result = self.run_attnctl(*args)
            self.assertEqual(result.returncode, 2, (args, result.stdout, result.stderr))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
