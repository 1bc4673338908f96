#!/usr/bin/python3
"""The status page (GET / on the metrics port) in a real browser: Debian's Chromium,
headless, loads it from a real attnserve on 127.0.0.1:0 while two clients keep the
server busy. The DOM it renders must list every served model with its batching, and
each model's charts must hold data points drawn from the server's own histograms; a
screenshot is kept as a test artifact (BUILD/tests/e2e/artifacts/status_page.png).
With --auth_token_file the page asks for the token (Basic or Bearer), while /metrics
stays open.

usage: status_page_test.py ATTNSERVE REPO_ROOT ARTIFACTS_DIR
"""
import base64
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

import numpy as np

SERVER, ROOT, ARTIFACTS = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import stubs  # noqa: E402

CHROMIUM = shutil.which("chromium")


def chromium(*args):
    """Runs headless Chromium (as root it needs --no-sandbox) and returns its stdout."""
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={profile}", "--window-size=1300,1800", *args],
            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise AssertionError(f"chromium failed: {result.stderr[-2000:]}")
    return result.stdout


class StatusPageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        assert CHROMIUM, "chromium is missing: run `make deps` (deploy/install-deps.sh --test)"
        cls.stub_dir = stubs.generate_stubs(ROOT)
        cls.server = stubs.Attnserve(SERVER, "--status_interval=1s", "--max_queue_delay=1ms",
                                     metrics=True)
        cls.page = f"http://127.0.0.1:{cls.server.metrics_port}/"

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0

    def fetch(self, url, headers=None):
        request = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()

    def test_the_page_shows_models_and_charts_with_data_under_load(self):
        from attnserve.client import Client
        stop = threading.Event()
        errors = []

        def client_loop():
            try:
                with Client(self.server.target, timeout=60) as client:
                    query = np.random.default_rng(0).random((32, 512), dtype=np.float32)
                    for _ in range(100000):
                        if stop.is_set():
                            return
                        client.attend(query)
            except Exception as error:  # noqa: BLE001 (reported below)
                errors.append(error)

        clients = [threading.Thread(target=client_loop) for _ in range(2)]
        for thread in clients:
            thread.start()
        try:
            # Waits for the sampler's event: three intervals with answers in them
            # (bounded: 120 s).
            deadline = time.monotonic() + 120
            while True:
                _, html = self.fetch(self.page)
                points = [int(n) for n in re.findall(
                    r'class="series p50" data-points="(\d+)"', html)]
                if points and points[0] >= 3:
                    break
                self.assertLess(time.monotonic(), deadline, "no chart data after 120 s")
                time.sleep(0.5)
            dom = chromium("--dump-dom", self.page)
            os.makedirs(ARTIFACTS, exist_ok=True)
            screenshot = os.path.join(ARTIFACTS, "status_page.png")
            chromium(f"--screenshot={screenshot}", self.page)
        finally:
            stop.set()
            for thread in clients:
                thread.join()
        self.assertEqual(errors, [])
        # The browser's DOM: the model's row with its settings and live figures.
        row = re.search(r'<tr class="model" data-model="mha-base">(.*?)</tr>', dom, re.S)
        self.assertIsNotNone(row, dom[:2000])
        cells = re.findall(r"<td>(.*?)</td>", row.group(1))
        self.assertEqual(cells[:6], ["mha-base", "attention", "1", "cpu", "fp32", "512 / 8"])
        self.assertIn("max_batch_size", cells[6])
        self.assertGreater(int(cells[9]), 0)                  # requests answered
        self.assertRegex(cells[10], r"^\d+\.\d+ / \d+\.\d+$")  # p50 / p99 in ms
        # The charts hold data: latency lines, the rate, and batch-size bars.
        charts = re.search(r'<section class="charts" data-model="mha-base">(.*?)</section>',
                           dom, re.S).group(1)
        for series in ("p50", "p99", "rate"):
            points = int(re.search(rf'class="series {series}" data-points="(\d+)"',
                                   charts).group(1))
            self.assertGreaterEqual(points, 3, series)
        bars = [int(n) for n in re.findall(r'class="bar" data-count="(\d+)"', charts)]
        self.assertTrue(bars and sum(bars) > 0, "no batch-size bars")
        self.assertIn("--status_interval", dom)
        with open(screenshot, "rb") as f:
            png = f.read()
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        self.assertGreater(len(png), 10000)
        print(f"\nscreenshot: {screenshot} ({len(png)} bytes)", file=sys.stderr)

    def test_metrics_and_unknown_paths(self):
        status, text = self.fetch(self.page + "metrics")
        self.assertEqual(status, 200)
        self.assertIn("attnserve_requests_total", text)
        with self.assertRaises(urllib.error.HTTPError) as missing:
            self.fetch(self.page + "nope")
        self.assertEqual(missing.exception.code, 404)

    def test_a_token_guards_the_page_but_not_metrics(self):
        with tempfile.TemporaryDirectory() as scratch:
            tokens = os.path.join(scratch, "tokens")
            with open(tokens, "w") as f:
                f.write("s3cret\n")
            server = stubs.Attnserve(SERVER, f"--auth_token_file={tokens}",
                                     "--metrics_host=127.0.0.1", metrics=True)
            try:
                page = f"http://127.0.0.1:{server.metrics_port}/"
                with self.assertRaises(urllib.error.HTTPError) as refused:
                    self.fetch(page)
                self.assertEqual(refused.exception.code, 401)
                self.assertIn("Basic", refused.exception.headers["WWW-Authenticate"])
                with self.assertRaises(urllib.error.HTTPError) as wrong:
                    self.fetch(page, {"Authorization": "Bearer nope"})
                self.assertEqual(wrong.exception.code, 401)
                basic = base64.b64encode(b"operator:s3cret").decode()
                status, html = self.fetch(page, {"Authorization": f"Basic {basic}"})
                self.assertEqual(status, 200)
                self.assertIn('data-model="mha-base"', html)
                status, _ = self.fetch(page, {"Authorization": "Bearer s3cret"})
                self.assertEqual(status, 200)
                status, _ = self.fetch(page + "metrics")
                self.assertEqual(status, 200)
            finally:
                self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
