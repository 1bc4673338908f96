#!/usr/bin/python3
"""Triton's perf_analyzer (the binary in PyPI's tritonclient wheel, pinned in
deploy/requirements-client.txt) against a real attnserve on 127.0.0.1:0, unary ModelInfer
and streaming ModelStreamInfer, zero and random (its default) input data: every run
completes, reports its client and server-side latencies (ModelConfig, ModelStatistics),
and the server's own metrics count the calls it made.

perf_analyzer links libcudart.so.12 (from the pinned nvidia-cuda-runtime-cu12 wheel; no
GPU is used) and libb64 (Debian's libb64-0d, deploy/install-deps.sh --test).

usage: perf_analyzer_test.py ATTNSERVE REPO_ROOT
"""
import csv
import os
import re
import subprocess
import sys
import tempfile
import unittest
import urllib.request

SERVER, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import stubs  # noqa: E402  (starts the server)

import nvidia.cuda_runtime  # noqa: E402  (libcudart.so.12 for perf_analyzer)

PERF_ANALYZER = os.path.join(os.path.dirname(sys.executable), "perf_analyzer")


def metric_sum(text, name, **labels):
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


class PerfAnalyzerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = stubs.Attnserve(SERVER, "--max_queue_delay=1ms", metrics=True,
                                     http=True)

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0

    def metrics(self):
        url = f"http://127.0.0.1:{self.server.metrics_port}/metrics"
        return urllib.request.urlopen(url, timeout=30).read().decode()

    def run_perf_analyzer(self, *flags, http=False, data=("--input-data", "zero")):
        """Runs it over concurrency 1 and 2, 20 requests per window (bounded, no
        stability wait: these machines are noisy); returns the CSV rows."""
        protocol = (["-u", f"127.0.0.1:{self.server.http_port}", "-i", "http"] if http
                    else ["-u", self.server.target, "-i", "grpc"])
        library = os.path.join(os.path.dirname(nvidia.cuda_runtime.__file__), "lib")
        env = dict(os.environ, LD_LIBRARY_PATH=library)
        with tempfile.TemporaryDirectory() as scratch:
            report = os.path.join(scratch, "report.csv")
            done = subprocess.run(
                [PERF_ANALYZER, "-m", "mha-base", *protocol,
                 "--shape", "query:128,512", "--shape", "memory:128,512",
                 *data, "--concurrency-range", "1:2",
                 "--measurement-mode", "count_windows", "--measurement-request-count", "20",
                 "--stability-percentage", "999", "--max-trials", "3", "-f", report,
                 *flags],
                env=env, capture_output=True, text=True, timeout=240)
            self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
            self.assertRegex(done.stdout, re.compile(r"p99 latency: \d+ usec"))
            # Server-side figures from ModelStatistics, which perf_analyzer reads because
            # ServerMetadata lists the statistics extension and ModelConfig answers.
            self.assertRegex(done.stdout, re.compile(
                r"Server: \n\s+Inference count: \d+\n\s+Execution count: \d+"))
            self.assertRegex(done.stdout,
                             re.compile(r"queue \d+ usec \+ compute input 0 usec \+ "
                                        r"compute infer \d+ usec"))
            with open(report) as rows:
                return list(csv.DictReader(rows))

    def check(self, method, *flags, http=False, **data):
        before = metric_sum(self.metrics(), "attnserve_requests_total", model="mha-base",
                            code="OK")
        rows = self.run_perf_analyzer(*flags, http=http, **data)
        # perf_analyzer orders its CSV rows by throughput, not by concurrency: under a
        # sanitizer c1 can come out faster than c2.
        self.assertEqual(sorted(row["Concurrency"] for row in rows), ["1", "2"])
        for row in rows:
            self.assertGreater(float(row["Inferences/Second"]), 0)
            self.assertGreater(int(row["p50 latency"]), 0)
        text = self.metrics()
        # At least the measured requests (2 concurrencies x 3 windows x 20 at least one
        # window each) were computed, and counted under perf_analyzer's RPC.
        answered = metric_sum(text, "attnserve_requests_total", model="mha-base",
                              code="OK") - before
        self.assertGreaterEqual(answered, 40)
        if method:
            self.assertGreater(
                metric_sum(text, "grpc_server_started_total", grpc_method=method), 0)
        self.assertEqual(metric_sum(text, "attnserve_requests_total", model="mha-base",
                                    code="INVALID_ARGUMENT"), 0)

    def test_unary_model_infer(self):
        self.check("ModelInfer")

    def test_streaming_model_stream_infer(self):
        self.check("ModelStreamInfer", "--streaming")

    def test_its_default_random_data_is_computed_through(self):
        # perf_analyzer's default data is random bytes: as FP32, some are NaN or
        # infinite. The server computes them through (NaN in, NaN out) as PyTorch, ONNX
        # Runtime and Triton do, unless started with --reject_non_finite; so every call
        # answers OK (check() also counts no INVALID_ARGUMENT).
        self.check("ModelInfer", data=())

    def test_http_infer_with_binary_tensors(self):
        # Over KServe HTTP perf_analyzer reads /v2/models/{m}/config and .../stats, and
        # sends binary tensors.
        self.check(None, http=True)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
