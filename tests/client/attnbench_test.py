#!/usr/bin/python3
"""attnbench against a real attnserve on 127.0.0.1:0: short closed- and open-loop runs,
their JSON, CSV and SVG outputs, and agreement with the server's own /metrics.

usage: attnbench_test.py ATTNSERVE ATTNBENCH REPO_ROOT
"""
import csv
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request
import xml.dom.minidom

SERVER, ATTNBENCH, ROOT = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import stubs  # noqa: E402


def served(metrics_url):
    """The server's count of OK calls."""
    text = urllib.request.urlopen(metrics_url, timeout=30).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("attnserve_requests_total{") and 'code="OK"' in line)


class AttnbenchTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = stubs.Attnserve(SERVER, "--max_queue_delay=1ms", metrics=True)
        cls.dir = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0
        cls.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def bench(self, *args):
        result = subprocess.run(
            [ATTNBENCH, f"--target={self.server.target}", "--warmup=0.3s", "--window=0.5s",
             "--max_duration=2s", *args], capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        return result

    def test_closed_loop_outputs_and_server_agreement(self):
        metrics = f"http://127.0.0.1:{self.server.metrics_port}/metrics"
        result = self.bench("--concurrency=1,4", "--seq_len=8*3,32*1",
                            f"--metrics_url={metrics}", f"--json={self.path('r.json')}",
                            f"--csv={self.path('r.csv')}", f"--plot={self.path('r.svg')}")
        self.assertIn("conc=4", result.stdout)
        run = json.load(open(self.path("r.json")))
        self.assertEqual(len(run["steps"]), 2)
        for step in run["steps"]:
            latency = step["latency_ms"]
            ordered = [latency[k] for k in ("p50", "p90", "p95", "p99", "p99.9", "max")]
            self.assertEqual(ordered, sorted(ordered), latency)
            self.assertGreater(step["requests"], 0)
            self.assertEqual(step["errors"], {})
            # The server counted the same calls between the two scrapes that bracket the
            # measurement, give or take the calls in flight at each edge and the calls
            # that finished while a scrape was being read (the server's snapshot falls
            # somewhere inside it; under a sanitizer a scrape takes several calls' time).
            self.assertLessEqual(abs(step["server"]["requests"] - step["requests"]),
                                 2 * step["level"]
                                 + step["server"]["completed_during_scrapes"], step)
            self.assertGreaterEqual(step["server"]["mean_batch_size"], 1.0)
        rows = list(csv.DictReader(open(self.path("r.csv"))))
        self.assertEqual([float(r["level"]) for r in rows], [1.0, 4.0])
        svg = xml.dom.minidom.parse(self.path("r.svg"))
        self.assertEqual(svg.documentElement.tagName, "svg")
        self.assertEqual(len(svg.getElementsByTagName("polyline")), 3)

    def test_open_loop_sends_at_the_rate(self):
        rate = 150
        self.bench(f"--rate={rate}", "--seq_len=4:16", f"--json={self.path('o.json')}")
        step = json.load(open(self.path("o.json")))["steps"][0]
        self.assertEqual(step["mode"], "rate")
        # Poisson arrivals: the count in a window of T seconds has mean rate*T and
        # standard deviation sqrt(rate*T). A fixed +-10% band is crossed by chance
        # (1.7 sigma at T=2 s) and by a slow machine; 4.5 sigma is crossed by chance
        # about once in 150,000 runs, and still catches a generator off by a third.
        expected = rate * step["seconds"]
        self.assertLess(abs(step["sent"] - expected), 4.5 * math.sqrt(expected), step)

    def test_stream_mode(self):
        self.bench("--concurrency=2", "--stream", "--seq_len=8", f"--json={self.path('s.json')}")
        run = json.load(open(self.path("s.json")))
        self.assertTrue(run["stream"])
        self.assertGreater(run["steps"][0]["requests"], 0)

    def test_sigint_ends_the_step_and_reports_it(self):
        """A step an hour long, interrupted once the server has answered: attnbench
        reports what it measured until then and exits 0."""
        metrics = f"http://127.0.0.1:{self.server.metrics_port}/metrics"
        before = served(metrics)
        process = subprocess.Popen(
            [ATTNBENCH, f"--target={self.server.target}", "--warmup=0s", "--window=1h",
             "--max_duration=1h", "--concurrency=2,4", "--seq_len=8",
             f"--json={self.path('i.json')}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while served(metrics) < before + 20:
                self.assertLess(time.monotonic(), deadline, "no calls reached the server")
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=60)
        finally:
            process.kill()
        self.assertEqual(process.returncode, 0, stderr)
        self.assertIn("(interrupted)", stderr)
        run = json.load(open(self.path("i.json")))
        self.assertEqual(len(run["steps"]), 1, "no step may run after the interrupt")
        step = run["steps"][0]
        self.assertTrue(step["interrupted"])
        self.assertGreater(step["requests"], 0)
        self.assertLess(step["seconds"], 3600)

    def test_bad_arguments_exit_two(self):
        for args in (["--concurrency=0"], ["--seq_len=0"], [], ["--rate=5", "--concurrency=1"],
                     ["--concurrency=1", "--dtype=int8"]):
            result = subprocess.run([ATTNBENCH, f"--target={self.server.target}", *args],
                                    capture_output=True, text=True, timeout=60)
            self.assertEqual(result.returncode, 2, (args, result.stderr))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
