#!/usr/bin/python3
"""One behaviour through every front door: the same requests sent through attnserve.v1
(Attend unary and AttendStream), KServe v2 gRPC (ModelInfer unary and ModelStreamInfer)
and KServe v2 HTTP (JSON and binary tensors) of one real attnserve on 127.0.0.1:0.

- A valid request gets identical output bytes from every door.
- Each class of bad input gets the same status class and the same message text.
- A deadline that passes while the request is queued ends it DEADLINE_EXCEEDED (504).
- A call cancelled while queued is dropped before compute (CANCELLED in the metrics).
- While the server drains, a call for a model it does not serve and a call without a
  valid token get the same code and words from every door (the drain check comes after
  auth and before the lookup everywhere), and every door's refusal is counted the same
  way in attnserve_requests_total.

usage: doors_test.py ATTNSERVE REPO_ROOT
"""
import http.client
import json
import os
import queue
import signal
import socket
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

SERVER, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import stubs  # noqa: E402
from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2  # noqa: E402

D = 512
# gRPC status code name -> HTTP status, as the HTTP door maps them.
HTTP_OF = {"INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "DEADLINE_EXCEEDED": 504,
           "CANCELLED": 499, "RESOURCE_EXHAUSTED": 429, "UNAVAILABLE": 503,
           "UNAUTHENTICATED": 401}


class Answer:
    """A door's answer: (code name, message) or output bytes."""

    def __init__(self, code="OK", message="", output=b""):
        self.code, self.message, self.output = code, message, output

    def __repr__(self):
        return f"Answer({self.code}, {self.message!r}, {len(self.output)} bytes)"


class Doors:
    """Sends one request (model, query array, parameters) through each door."""

    def __init__(self, server, timeout=30.0, token=None):
        # `token`: sent as "authorization: Bearer <token>" by every door.
        self.metadata = [("authorization", f"Bearer {token}")] if token else []
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.channel = grpc.insecure_channel(server.target)
        self.v1 = attention_pb2_grpc.AttentionServiceStub(self.channel)
        self.kserve = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.http_port = server.http_port
        self.timeout = timeout

    def close(self):
        self.channel.close()

    @staticmethod
    def _tensor(query):
        return tensor_pb2.Tensor(dtype=tensor_pb2.DATA_TYPE_FP32, shape=list(query.shape),
                                 raw=query.astype("<f4").tobytes())

    def _attend(self, model, query, causal):
        return attention_pb2.AttendRequest(model=model, query=self._tensor(query),
                                           causal=causal)

    def _infer(self, model, query, causal, timeout_us):
        request = service_pb2.ModelInferRequest(model_name=model)
        tensor = request.inputs.add(name="query", datatype="FP32", shape=list(query.shape))
        del tensor
        request.raw_input_contents.append(query.astype("<f4").tobytes())
        request.parameters["causal"].bool_param = causal
        if timeout_us:
            request.parameters["timeout"].int64_param = timeout_us
        return request

    def v1_unary(self, model, query, causal=False, timeout=None, **_):
        try:
            reply = self.v1.Attend(self._attend(model, query, causal),
                                   timeout=timeout or self.timeout, metadata=self.metadata)
            return Answer(output=reply.output.raw)
        except grpc.RpcError as error:
            return Answer(error.code().name, error.details())

    def v1_stream(self, model, query, causal=False, timeout=None, **_):
        try:
            replies = self.v1.AttendStream(
                iter([attention_pb2.AttendStreamRequest(
                    request=self._attend(model, query, causal))]),
                timeout=timeout or self.timeout, metadata=self.metadata)
            reply = next(iter(replies))
        except grpc.RpcError as error:
            return Answer(error.code().name, error.details())
        if reply.HasField("error"):
            return Answer(grpc.StatusCode(
                next(c for c in grpc.StatusCode if c.value[0] == reply.error.code)).name,
                reply.error.message)
        return Answer(output=reply.response.output.raw)

    def kserve_unary(self, model, query, causal=False, timeout_us=0, **_):
        try:
            reply = self.kserve.ModelInfer(self._infer(model, query, causal, timeout_us),
                                           timeout=self.timeout, metadata=self.metadata)
            return Answer(output=reply.raw_output_contents[0])
        except grpc.RpcError as error:
            return Answer(error.code().name, error.details())

    def kserve_stream(self, model, query, causal=False, timeout_us=0, **_):
        try:
            replies = self.kserve.ModelStreamInfer(
                iter([self._infer(model, query, causal, timeout_us)]), timeout=self.timeout,
                metadata=self.metadata)
            reply = next(iter(replies))
        except grpc.RpcError as error:
            return Answer(error.code().name, error.details())
        if reply.error_message:
            code, message = reply.error_message.split(": ", 1)
            return Answer(code, message)
        return Answer(output=reply.infer_response.raw_output_contents[0])

    def _http(self, model, body, headers):
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port,
                                                timeout=self.timeout)
        try:
            connection.request("POST", f"/v2/models/{model}/infer", body=body,
                               headers={**self.headers, **headers})
            reply = connection.getresponse()
            return reply.status, reply.getheaders(), reply.read()
        finally:
            connection.close()

    def _http_answer(self, status, body):
        error = json.loads(body)["error"]
        code = next(name for name, http_status in HTTP_OF.items() if http_status == status)
        return Answer(code, error)

    def http_json(self, model, query, causal=False, timeout_us=0, **_):
        parameters = {"causal": causal}
        if timeout_us:
            parameters["timeout"] = timeout_us
        body = json.dumps({"parameters": parameters, "inputs": [{
            "name": "query", "shape": list(query.shape), "datatype": "FP32",
            "data": query.astype(np.float32).ravel().tolist()}]})
        status, _, reply = self._http(model, body, {"Content-Type": "application/json"})
        if status != 200:
            return self._http_answer(status, reply)
        values = json.loads(reply)["outputs"][0]["data"]
        return Answer(output=np.asarray(values, dtype="<f4").tobytes())

    def http_binary(self, model, query, causal=False, timeout_us=0, **_):
        raw = query.astype("<f4").tobytes()
        parameters = {"causal": causal, "binary_data_output": True}
        if timeout_us:
            parameters["timeout"] = timeout_us
        header = json.dumps({"parameters": parameters, "inputs": [{
            "name": "query", "shape": list(query.shape), "datatype": "FP32",
            "parameters": {"binary_data_size": len(raw)}}]}).encode()
        status, headers, reply = self._http(
            model, header + raw,
            {"Inference-Header-Content-Length": str(len(header)),
             "Content-Type": "application/octet-stream"})
        if status != 200:
            return self._http_answer(status, reply)
        length = int(dict(headers)["Inference-Header-Content-Length"])
        outputs = json.loads(reply[:length])["outputs"]
        size = outputs[0]["parameters"]["binary_data_size"]
        return Answer(output=reply[length:length + size])

    def all(self):
        return {"v1 unary": self.v1_unary, "v1 stream": self.v1_stream,
                "kserve unary": self.kserve_unary, "kserve stream": self.kserve_stream,
                "http json": self.http_json, "http binary": self.http_binary}


def metric(port, name, labels):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith(name + "{") and all(label in line for label in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


class DoorsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Non-finite inputs are refused here (off by default, as the peers do) so that
        # every door's wording for it is compared.
        cls.server = stubs.Attnserve(SERVER, "--max_queue_delay=1ms", "--reject_non_finite",
                                     http=True)
        cls.doors = Doors(cls.server)

    @classmethod
    def tearDownClass(cls):
        cls.doors.close()
        assert cls.server.stop() == 0

    def test_valid_requests_get_identical_bytes_from_every_door(self):
        rng = np.random.default_rng(11)
        # Values that JSON carries exactly (float32 printed and read back).
        for rows, causal in ((1, False), (7, True), (33, False)):
            query = rng.uniform(-1, 1, (rows, D)).astype(np.float32)
            answers = {name: door("mha-base", query, causal=causal)
                       for name, door in self.doors.all().items()}
            for name, answer in answers.items():
                with self.subTest(rows=rows, door=name):
                    self.assertEqual(answer.code, "OK", answer.message)
                    self.assertEqual(len(answer.output), rows * D * 4)
                    self.assertEqual(answer.output, answers["v1 unary"].output)

    def test_bad_input_gets_the_same_status_and_words_from_every_door(self):
        good = np.full((2, D), 0.5, np.float32)
        cases = {
            "model not served": ("nope", good, "NOT_FOUND"),
            "wrong width": ("mha-base", np.zeros((2, 100), np.float32), "INVALID_ARGUMENT"),
            "non-finite value": ("mha-base", np.full((2, D), np.inf, np.float32),
                                 "INVALID_ARGUMENT"),
            "too long": ("mha-base", np.zeros((9000, D), np.float32), "INVALID_ARGUMENT"),
        }
        for case, (model, query, code) in cases.items():
            if case == "non-finite value":
                doors = {k: v for k, v in self.doors.all().items() if k != "http json"}
            else:
                doors = self.doors.all()
            answers = {name: door(model, query) for name, door in doors.items()}
            for name, answer in answers.items():
                with self.subTest(case=case, door=name):
                    self.assertEqual(answer.code, code, answer.message)
                    self.assertEqual(answer.message, answers["v1 unary"].message)


class DoorsDrainingTest(unittest.TestCase):
    """A server held in its drain by one HTTP request whose body is not finished: it stays
    open (an open call delays shutdown up to the grace period) until the test sends the
    rest. Its first HELD bytes are more than loopback's socket buffers hold, so once they
    are sent the server's handler is reading the body: the drain begins with it open."""

    HELD = 32 << 20

    UNARY = ("v1 unary", "kserve unary", "http json", "http binary")

    @classmethod
    def setUpClass(cls):
        cls.tokens = tempfile.NamedTemporaryFile("w", suffix=".tokens")
        cls.tokens.write("secret\n")
        cls.tokens.flush()
        cls.server = stubs.Attnserve(SERVER, f"--auth_token_file={cls.tokens.name}",
                                     "--grace_period=120s", metrics=True, http=True)
        cls.doors = Doors(cls.server, token="secret")
        cls.strangers = Doors(cls.server)

    @classmethod
    def tearDownClass(cls):
        cls.doors.close()
        cls.strangers.close()
        cls.tokens.close()

    def embeddings(self, path, headers, model):
        """The embedding APIs' answer to a request for `model`: (HTTP status, message)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.server.http_port,
                                                timeout=60)
        try:
            connection.request("POST", path, json.dumps({"model": model, "input": ["a"],
                                                         "inputs": "a"}),
                               {"Content-Type": "application/json", **headers})
            reply = connection.getresponse()
            error = json.loads(reply.read())["error"]
            return reply.status, error["message"] if isinstance(error, dict) else error
        finally:
            connection.close()

    def refusals(self, code):
        return metric(self.server.metrics_port, "attnserve_requests_total",
                      [f'code="{code}"'])

    def test_unknown_model_and_no_token_while_draining_are_refused_alike(self):
        held = socket.create_connection(("127.0.0.1", self.server.http_port), timeout=60)
        held.sendall(b"POST /v2/models/mha-base/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer secret\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {self.HELD + 1}\r\n\r\n".encode())
        held.sendall(b" " * self.HELD)
        before = {code: self.refusals(code) for code in ("UNAVAILABLE", "UNAUTHENTICATED")}
        self.server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while True:  # readiness turns false once draining has begun
            try:
                urllib.request.urlopen(
                    f"http://127.0.0.1:{self.server.http_port}/v2/health/ready", timeout=10)
            except urllib.error.HTTPError as error:
                if error.code == 503:
                    break
            self.assertLess(time.monotonic(), deadline, "the drain did not begin")
            time.sleep(0.05)
        good = np.full((2, D), 0.5, np.float32)
        cases = {"model not served": (self.doors, "nope", "UNAVAILABLE"),
                 "no token, model served": (self.strangers, "mha-base", "UNAUTHENTICATED"),
                 "no token, model not served": (self.strangers, "nope", "UNAUTHENTICATED")}
        for case, (doors, model, code) in cases.items():
            answers = {name: door(model, good) for name, door in doors.all().items()}
            for name, answer in answers.items():
                with self.subTest(case=case, door=name):
                    self.assertEqual(answer.code, code, answer.message)
                    self.assertEqual(answer.message, answers["v1 unary"].message)
            # The embedding APIs (OpenAI, TEI), in their own error shapes.
            for path in ("/v1/embeddings", "/embed"):
                with self.subTest(case=case, door=path):
                    status, message = self.embeddings(path, doors.headers, model)
                    self.assertEqual(status, HTTP_OF[code], message)
                    self.assertEqual(message, answers["v1 unary"].message)
        # Each unary door's refusals are requests, counted under their code (a stream
        # refused when it opens has no message to count).
        unary = len(self.UNARY) + 2
        self.assertEqual(self.refusals("UNAVAILABLE") - before["UNAVAILABLE"], unary)
        self.assertEqual(self.refusals("UNAUTHENTICATED") - before["UNAUTHENTICATED"],
                         2 * unary)
        held.sendall(b" ")  # the held call ends (400: not JSON), then the server
        self.assertIn(b"400", held.recv(4096))
        held.close()
        self.assertEqual(self.server.process.wait(timeout=120), 0)
        self.server.process.stdout.close()


class DoorsQueuedTest(unittest.TestCase):
    """A server whose lone request waits an hour for company: it stays queued until it is
    cancelled or its deadline passes."""

    @classmethod
    def setUpClass(cls):
        cls.server = stubs.Attnserve(SERVER, "--max_queue_delay=1h", http=True, metrics=True)
        cls.doors = Doors(cls.server)

    @classmethod
    def tearDownClass(cls):
        cls.doors.close()
        assert cls.server.stop() == 0

    def test_a_deadline_passing_in_the_queue_ends_the_request_at_every_door(self):
        query = np.full((1, D), 0.5, np.float32)
        for name, door in self.doors.all().items():
            with self.subTest(door=name):
                answer = door("mha-base", query, timeout=0.3, timeout_us=300000)
                self.assertEqual(answer.code, "DEADLINE_EXCEEDED", answer)

    def queue_depth(self):
        return metric(self.server.metrics_port, "attnserve_queue_depth",
                      ['model="mha-base"'])

    def cancelled(self):
        return metric(self.server.metrics_port, "attnserve_requests_total",
                      ['model="mha-base"', 'code="CANCELLED"'])

    def wait_for(self, condition, what):
        for _ in range(1500):
            if condition():
                return
            time.sleep(0.02)
        self.fail(f"timed out waiting for {what}")

    def test_a_call_cancelled_while_queued_is_dropped_at_every_door(self):
        query = np.full((1, D), 0.5, np.float32)
        raw = query.astype("<f4").tobytes()

        def grpc_unary(stub_call, request):
            future = stub_call.future(request, timeout=600)
            return future.cancel

        def grpc_stream(stub_call, request):
            requests = queue.Queue()
            requests.put(request)
            call = stub_call(iter(requests.get, None), timeout=600)
            return call.cancel

        def http_door(body, headers):
            connection = socket.create_connection(("127.0.0.1", self.server.http_port))
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            connection.sendall((f"POST /v2/models/mha-base/infer HTTP/1.1\r\n"
                                f"Host: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
                                f"{head}\r\n").encode() + body)
            return connection.close

        attend = self.doors._attend("mha-base", query, False)
        infer = self.doors._infer("mha-base", query, False, 0)
        json_body = json.dumps({"inputs": [{"name": "query", "shape": [1, D],
                                            "datatype": "FP32",
                                            "data": query.ravel().tolist()}]}).encode()
        header = json.dumps({"inputs": [{"name": "query", "shape": [1, D],
                                         "datatype": "FP32",
                                         "parameters": {"binary_data_size": len(raw)}}]}
                            ).encode()
        senders = {
            "v1 unary": lambda: grpc_unary(self.doors.v1.Attend, attend),
            "v1 stream": lambda: grpc_stream(
                self.doors.v1.AttendStream, attention_pb2.AttendStreamRequest(request=attend)),
            "kserve unary": lambda: grpc_unary(self.doors.kserve.ModelInfer, infer),
            "kserve stream": lambda: grpc_stream(self.doors.kserve.ModelStreamInfer, infer),
            "http json": lambda: http_door(json_body, {}),
            "http binary": lambda: http_door(
                header + raw, {"Inference-Header-Content-Length": str(len(header))}),
        }
        for name, send in senders.items():
            with self.subTest(door=name):
                before = self.cancelled()
                cancel = send()
                self.wait_for(lambda: self.queue_depth() == 1, "the request to be queued")
                cancel()
                self.wait_for(lambda: self.cancelled() == before + 1,
                              "the request to be dropped CANCELLED")
                self.assertEqual(self.queue_depth(), 0)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
