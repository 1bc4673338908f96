#!/usr/bin/python3
"""The status page (GET / on the metrics port) in a real browser: Debian's Chromium,
headless, loads it from a real attnserve on 127.0.0.1:0 while two clients keep the
server busy. The DOM it renders must list every served model with its batching, and
each model's charts must hold data points drawn from the server's own histograms; a
screenshot is kept as a test artifact (BUILD/tests/e2e/artifacts/status_page.png).
With --auth_token_file the page asks for the token (Basic or Bearer), while /metrics
stays open.

The head view (GET /heads) of a pruned encoder (tests/data/heads_tiny/pruned) renders in
Chromium while clients encode texts: a layer x head grid per statistic whose cells equal
HeadStatistics over gRPC for the same text, the pruned heads crossed out in each, and the
picked head's attention over the text's tokens as a heatmap equal to the weights
HeadStatistics returns (return_attention); a pruned head says so; bad queries are
refused naming the field (screenshot: BUILD/tests/e2e/artifacts/heads_page.png).

usage: status_page_test.py ATTNSERVE REPO_ROOT ARTIFACTS_DIR
"""
import base64
import json
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
import urllib.parse
import urllib.request

import grpc
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
                with self.assertRaises(urllib.error.HTTPError) as heads:
                    self.fetch(page + "heads?text=x")
                self.assertEqual(heads.exception.code, 401)
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



class HeadViewTest(unittest.TestCase):
    TEXT = "the quick brown fox jumps over the lazy dog"

    @classmethod
    def setUpClass(cls):
        assert CHROMIUM, "chromium is missing: run `make deps` (deploy/install-deps.sh --test)"
        data = os.path.join(ROOT, "tests", "data")
        with open(os.path.join(data, "heads_tiny.golden.json"), encoding="utf-8") as f:
            cls.pruned_heads = {(int(layer), head) for layer, heads
                                in json.load(f)["pruned_heads"].items() for head in heads}
        cls.repository = tempfile.TemporaryDirectory()
        folder = os.path.join(cls.repository.name, "pruned")
        os.mkdir(folder)
        source = os.path.join(data, "heads_tiny", "pruned")
        for name in os.listdir(source):
            os.symlink(os.path.join(source, name), os.path.join(folder, name))
        with open(os.path.join(folder, "config.pbtxt"), "w") as f:
            f.write("encoder { }\n")
        cls.server = stubs.Attnserve(SERVER, f"--model_repository={cls.repository.name}",
                                     "--max_queue_delay=1ms", metrics=True)
        cls.base = f"http://127.0.0.1:{cls.server.metrics_port}"
        from attnserve.v1 import attention_pb2, attention_pb2_grpc
        cls.pb = attention_pb2
        cls.channel = grpc.insecure_channel(cls.server.target)
        cls.v1 = attention_pb2_grpc.AttentionServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.server.stop() == 0
        cls.repository.cleanup()

    def url(self, **query):
        return f"{self.base}/heads?" + urllib.parse.urlencode(query)

    def test_grids_and_heatmap_render_while_traffic_flows(self):
        stop = threading.Event()
        errors, answered = [], []

        def client_loop():
            try:
                for _ in range(100000):
                    if stop.is_set():
                        return
                    self.v1.Encode(self.pb.EncodeRequest(
                        model="pruned", text=["a text in flight", "and another"]),
                        timeout=60)
                    answered.append(1)
            except Exception as error:  # noqa: BLE001 (reported below)
                errors.append(error)

        thread = threading.Thread(target=client_loop)
        thread.start()
        try:
            page = self.url(model="pruned", text=self.TEXT, layer=1, head=2)
            dom = chromium("--dump-dom", page)
            os.makedirs(ARTIFACTS, exist_ok=True)
            screenshot = os.path.join(ARTIFACTS, "heads_page.png")
            chromium(f"--screenshot={screenshot}", page)
        finally:
            stop.set()
            thread.join()
        self.assertEqual(errors, [])
        self.assertGreater(len(answered), 0)

        measured = self.v1.HeadStatistics(self.pb.HeadStatisticsRequest(
            model="pruned", encode=self.pb.EncodeRequest(text=[self.TEXT]),
            return_attention=True), timeout=60)
        layers, heads, length, _ = measured.attention.shape
        self.assertEqual((layers, heads), (3, 4))
        figures = {(h.layer, h.head): h for h in measured.heads}
        grids = re.findall(r'<svg class="head-grid" data-statistic="(\w+)"(.*?)</svg>', dom,
                           re.S)
        self.assertEqual(len(grids), 7, dom[:2000])
        for statistic, grid in grids:
            cells = re.findall(r'<rect class="cell( pruned)?" data-layer="(\d+)" '
                               r'data-head="(\d+)" data-value="([^"]+)"', grid)
            self.assertEqual(len(cells), layers * heads, statistic)
            crossed = {(int(layer), int(head)) for pruned, layer, head, _ in cells if pruned}
            self.assertEqual(crossed, self.pruned_heads, statistic)
            for _, layer, head, value in cells:
                expected = getattr(figures[(int(layer), int(head))], statistic)
                self.assertAlmostEqual(float(value), expected, delta=1e-5 * max(1, expected),
                                       msg=f"{statistic} layer {layer} head {head}")

        heatmap = re.search(r'<svg id="heatmap" data-layer="1" data-head="2" '
                            r'data-tokens="(\d+)"(.*?)</svg>', dom, re.S)
        self.assertIsNotNone(heatmap, dom[-3000:])
        self.assertEqual(int(heatmap.group(1)), length)
        tokens = re.findall(r'<text class="query-token"[^>]*>([^<]*)</text>', heatmap.group(2))
        self.assertEqual(tokens, list(measured.token_texts))
        self.assertEqual((tokens[0], tokens[-1]), ("[CLS]", "[SEP]"))
        shown = np.array([float(w) for w in re.findall(
            r'<rect class="weight"[^>]*><title>\d+ → \d+: ([0-9.]+)</title>',
            heatmap.group(2))]).reshape(length, length)
        weights = np.frombuffer(measured.attention.raw, "<f4").reshape(
            layers, heads, length, length)
        np.testing.assert_allclose(shown, weights[1, 2], atol=5e-5)
        # The Python client's view of the same pass.
        from attnserve.client import Client
        with Client(self.server.target, timeout=60) as client:
            client_tokens, client_weights = client.attention_map(self.TEXT, model="pruned")
        self.assertEqual(client_tokens, tokens)
        np.testing.assert_array_equal(client_weights, weights)
        np.testing.assert_allclose(weights[1, 2].sum(axis=1), 1, atol=1e-5)
        for layer, head in self.pruned_heads:
            self.assertEqual(np.abs(weights[layer, head]).max(), 0)

        with open(screenshot, "rb") as f:
            png = f.read()
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        self.assertGreater(len(png), 10000)
        print(f"\nscreenshot: {screenshot} ({len(png)} bytes)", file=sys.stderr)

    def fetch_error(self, url):
        with self.assertRaises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=60)
        return refused.exception.code, refused.exception.read().decode()

    def test_a_pruned_head_says_so_and_bad_queries_name_the_field(self):
        layer, head = sorted(self.pruned_heads)[0]
        with urllib.request.urlopen(self.url(model="pruned", text=self.TEXT, layer=layer,
                                             head=head), timeout=60) as reply:
            html = reply.read().decode()
        self.assertIn(f"layer {layer} head {head} is pruned", html)
        self.assertNotIn('id="heatmap"', html)
        # The form alone, with the encoders offered and the status page linking to it.
        with urllib.request.urlopen(f"{self.base}/heads", timeout=60) as reply:
            self.assertIn("<option selected>pruned</option>", reply.read().decode())
        with urllib.request.urlopen(f"{self.base}/", timeout=60) as reply:
            self.assertIn('href="/heads?model=pruned"', reply.read().decode())
        for query, code, words in (
                ({"model": "pruned", "text": "x", "layer": "two"}, 400,
                 "layer must be a number in [0, 1000000], got &quot;two&quot;"),
                ({"model": "pruned", "text": "x" * 2001}, 400, "text is over 2000 bytes"),
                ({"model": "pruned", "text": "x", "layer": 3}, 200,
                 "layer 3 head 0: the model has 3 layers of 4 heads"),
                ({"model": "nope", "text": "x"}, 404, "nope"),
                ({"model": "mha-base", "text": "x"}, 400, "is an attention layer")):
            with self.subTest(query=query):
                if code == 200:
                    with urllib.request.urlopen(self.url(**query), timeout=60) as reply:
                        html = reply.read().decode()
                else:
                    status, html = self.fetch_error(self.url(**query))
                    self.assertEqual(status, code)
                self.assertIn(words, html)
                self.assertIn('class="error"', html)
        # The server still serves.
        measured = self.v1.HeadStatistics(self.pb.HeadStatisticsRequest(
            model="pruned", encode=self.pb.EncodeRequest(text=["still here"])), timeout=60)
        self.assertEqual(len(measured.heads), 12)
        self.assertFalse(measured.HasField("attention"))

if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
