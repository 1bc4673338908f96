#!/usr/bin/python3
"""A real Prometheus (Debian's `prometheus` package) scraping a real attnserve.

Checks the exposition with `promtool check metrics`, the Grafana dashboard's PromQL
against the live metric names, then starts Prometheus on a free loopback port with a
temporary data folder and a 1 s scrape interval, sends traffic, and asserts through
Prometheus's HTTP API that the target is up, that attnserve_requests_total equals what
was sent, and that histogram_quantile(0.99, ...) is finite. Everything is stopped at
the end; every wait is bounded.

usage: prometheus_test.py ATTNSERVE_BINARY REPO_ROOT
"""
import array
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stubs  # noqa: E402

BINARY, ROOT = sys.argv[1], sys.argv[2]
SENT_OK, SENT_INVALID = 25, 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


class PrometheusTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stub_dir = stubs.generate_stubs(ROOT)
        cls.server = stubs.Attnserve(BINARY, "--max_queue_delay=1ms", metrics=True)
        cls.metrics_url = f"http://127.0.0.1:{cls.server.metrics_port}/metrics"
        cls.data = tempfile.TemporaryDirectory()
        cls.prometheus = None

    @classmethod
    def tearDownClass(cls):
        if cls.prometheus is not None:
            cls.prometheus.terminate()
            cls.prometheus.wait(timeout=30)
        code = cls.server.stop()
        cls.data.cleanup()
        cls.stub_dir.cleanup()
        assert code == 0, f"attnserve exited with {code}"

    def send_traffic(self):
        import grpc
        from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2
        channel = grpc.insecure_channel(self.server.target)
        stub = attention_pb2_grpc.AttentionServiceStub(channel)
        for i in range(SENT_OK):
            length = 1 + i % 16
            query = array.array("f", [0.01 * (i % 7)] * (length * 512))
            stub.Attend(attention_pb2.AttendRequest(query=tensor_pb2.Tensor(
                dtype=tensor_pb2.DATA_TYPE_FP32, shape=[length, 512],
                raw=query.tobytes())), timeout=30)
        for _ in range(SENT_INVALID):
            with self.assertRaises(grpc.RpcError):
                stub.Attend(attention_pb2.AttendRequest(query=tensor_pb2.Tensor(
                    dtype=tensor_pb2.DATA_TYPE_FP32, shape=[1, 3], raw=bytes(12))),
                    timeout=30)
        channel.close()

    def query(self, promql):
        url = (f"http://127.0.0.1:{self.prometheus_port}/api/v1/query?"
               + urllib.parse.urlencode({"query": promql}))
        body = json.loads(http_get(url))
        self.assertEqual(body["status"], "success", body)
        return body["data"]["result"]

    def scalar(self, promql):
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, promql, predicate, seconds=60):
        deadline = time.monotonic() + seconds
        value = None
        while time.monotonic() < deadline:
            value = self.scalar(promql)
            if value is not None and predicate(value):
                return value
            time.sleep(0.5)
        self.fail(f"{promql} never satisfied the condition (last value {value})")

    def test_1_exposition_passes_promtool(self):
        text = http_get(self.metrics_url)
        check = subprocess.run(["promtool", "check", "metrics"], input=text,
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        self.assertEqual(check.stdout.strip() + check.stderr.strip(), "",
                         "promtool reported warnings")

    def test_2_dashboard_names_only_exported_metrics(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as metrics:
            metrics.write(http_get(self.metrics_url))
            metrics.flush()
            check = subprocess.run(
                ["/usr/bin/python3", os.path.join(ROOT, "tests/tools/check_dashboard.py"),
                 os.path.join(ROOT, "deploy/grafana/attnserve.json"), metrics.name],
                capture_output=True, text=True, timeout=60)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)

    def test_readme_lists_every_metric(self):
        """docs/operations.md's Metrics table names exactly the metric families the server exports."""
        text = http_get(self.metrics_url)
        exported = set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))
        with open(os.path.join(ROOT, "docs", "operations.md")) as f:
            readme = f.read()
        section = readme.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
        documented = set()
        for row in section.splitlines():
            if row.startswith("| `"):
                documented.update(re.findall(r"`([a-z_]+)`", row.split(" | ")[0]))
        self.assertEqual(sorted(exported - documented), [], "exported, not in docs/operations.md")
        self.assertEqual(sorted(documented - exported), [], "in docs/operations.md, not exported")

    def test_3_real_prometheus_scrape(self):
        type(self).prometheus_port = free_port()
        config = os.path.join(self.data.name, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: attnserve\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{self.server.metrics_port}']\n")
        log = open(os.path.join(self.data.name, "prometheus.log"), "w")
        type(self).prometheus = subprocess.Popen(
            ["prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(self.data.name, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{self.prometheus_port}"],
            stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while True:
            try:
                http_get(f"http://127.0.0.1:{self.prometheus_port}/-/ready")
                break
            except OSError:
                self.assertLess(time.monotonic(), deadline, "Prometheus did not start")
                time.sleep(0.3)
        # One scrape before the traffic, so rates over the window see it all.
        self.wait_for('up{job="attnserve"}', lambda v: v == 1)
        self.send_traffic()

        total = self.wait_for('sum(attnserve_requests_total{model="mha-base"})',
                              lambda v: v >= SENT_OK + SENT_INVALID)
        ok = self.scalar('attnserve_requests_total{model="mha-base",code="OK"}')
        invalid = self.scalar('sum(attnserve_requests_total{code="INVALID_ARGUMENT"})')
        p99 = self.scalar('histogram_quantile(0.99, sum by (le) '
                          '(rate(attnserve_request_duration_seconds_bucket[1m])))')
        mean_batch = self.scalar('sum(rate(attnserve_batch_size_sum[1m])) / '
                                 'sum(rate(attnserve_batch_size_count[1m]))')
        tokens = self.scalar('sum(increase(attnserve_tokens_total[1m]))')
        up = self.scalar('up{job="attnserve"}')
        print(f"\nPrometheus results: up={up} requests_total={total} ok={ok} "
              f"invalid={invalid} p99_latency_s={p99} mean_batch_size={mean_batch} "
              f"tokens_increase_1m={tokens}")
        self.assertEqual(up, 1)
        self.assertEqual(total, SENT_OK + SENT_INVALID)
        self.assertEqual(ok, SENT_OK)
        self.assertEqual(invalid, SENT_INVALID)
        self.assertIsNotNone(p99)
        self.assertTrue(math.isfinite(p99) and p99 > 0, p99)

    def test_4_readme_promql_examples_answer(self):
        """Each PromQL line in docs/operations.md's Metrics section returns a finite value here
        (after test_3's traffic)."""
        with open(os.path.join(ROOT, "docs", "operations.md")) as f:
            readme = f.read()
        block = readme.split("<!-- promql_test -->\n```\n", 1)[1].split("```", 1)[0]
        queries = [line for line in block.splitlines()
                   if line.strip() and not line.startswith("#")]
        self.assertGreaterEqual(len(queries), 5)
        for promql in queries:
            with self.subTest(query=promql):
                value = self.wait_for(promql, math.isfinite)
                print(f"docs PromQL: {promql} = {value}")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
