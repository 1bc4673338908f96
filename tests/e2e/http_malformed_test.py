#!/usr/bin/python3
"""The KServe v2 HTTP door against malformed and mistyped requests: a real attnserve on
127.0.0.1:0, raw HTTP over a socket (http.client), one case per mistake. Each must get
a 4xx with a JSON {"error": ...} that names the field, and the server must keep serving:
a valid request after every case is answered 200, and the process is still alive at the
end (it exits 0 on SIGTERM).

usage: http_malformed_test.py ATTNSERVE REPO_ROOT
"""
import http.client
import json
import os
import struct
import sys
import unittest

SERVER, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import stubs  # noqa: E402

D = 512  # mha-base's d_model
INFER = "/v2/models/mha-base/infer"


def query(rows=1, **extra):
    tensor = {"name": "query", "shape": [rows, D], "datatype": "FP32",
              "data": [0.25] * (rows * D)}
    tensor.update(extra)
    return tensor


def dumps(value):
    return json.dumps(value).encode()


# (name, method, path, body bytes, extra headers, HTTP status, words the error must hold)
CASES = [
    ("inputs of numbers (killed the server once)", "POST", INFER, b'{"inputs":[5]}', {},
     400, "inputs[0] must be an object, got 5"),
    ("not JSON", "POST", INFER, b"{inputs:", {}, 400, "not valid JSON"),
    ("empty body", "POST", INFER, b"", {}, 400, "not valid JSON"),
    ("JSON array body", "POST", INFER, b"[]", {}, 400, "the body must be an object"),
    ("inputs missing", "POST", INFER, b"{}", {}, 400, "inputs is missing"),
    ("inputs a string", "POST", INFER, dumps({"inputs": "x"}), {}, 400,
     "inputs must be an array"),
    ("name a number", "POST", INFER, dumps({"inputs": [query(name=1)]}), {}, 400,
     "inputs[0].name must be a string, got 1"),
    ("name missing", "POST", INFER,
     dumps({"inputs": [{"shape": [1, D], "datatype": "FP32", "data": [0] * D}]}), {}, 400,
     "inputs[0].name is missing"),
    ("datatype a list", "POST", INFER, dumps({"inputs": [query(datatype=["FP32"])]}), {},
     400, "inputs[0].datatype must be a string"),
    ("datatype unknown", "POST", INFER, dumps({"inputs": [query(datatype="INT8")]}), {},
     400, "datatype must be FP32 or BF16"),
    ("shape a string", "POST", INFER, dumps({"inputs": [query(shape="1,512")]}), {}, 400,
     "inputs[0].shape must be an array"),
    ("shape element a string", "POST", INFER, dumps({"inputs": [query(shape=[1, "a"])]}),
     {}, 400, 'inputs[0].shape[1] must be a non-negative integer, got "a"'),
    ("shape element negative", "POST", INFER, dumps({"inputs": [query(shape=[-1, D])]}),
     {}, 400, "inputs[0].shape[0] must be a non-negative integer, got -1"),
    ("shape element a float", "POST", INFER, dumps({"inputs": [query(shape=[1.5, D])]}),
     {}, 400, "inputs[0].shape[0] must be a non-negative integer"),
    ("shape element past int64", "POST", INFER,
     b'{"inputs":[{"name":"query","shape":[18446744073709551615,512],"datatype":"FP32",'
     b'"data":[]}]}', {}, 400, "inputs[0].shape[0] must be a non-negative integer"),
    ("data a string", "POST", INFER, dumps({"inputs": [query(data="abc")]}), {}, 400,
     "inputs[0].data must be a number"),
    ("data element a string", "POST", INFER,
     dumps({"inputs": [query(data=[0.5] * (D - 1) + ["x"])]}), {}, 400,
     f'inputs[0].data[{D - 1}] must be a number, got "x"'),
    ("data beyond float32", "POST", INFER,
     dumps({"inputs": [query(data=[1e300] + [0] * (D - 1))]}), {}, 400,
     "inputs[0].data[0] is 1e+300, beyond float32's range"),
    ("data too short for the shape", "POST", INFER,
     dumps({"inputs": [query(data=[0.5] * 3)]}), {}, 400, "query"),
    ("no data", "POST", INFER,
     dumps({"inputs": [{"name": "query", "shape": [1, D], "datatype": "FP32"}]}), {}, 400,
     "inputs[0] needs data or parameters.binary_data_size"),
    ("input parameters an array", "POST", INFER,
     dumps({"inputs": [query(parameters=[1])]}), {}, 400,
     "inputs[0].parameters must be an object"),
    ("binary_data_size a string", "POST", INFER,
     dumps({"inputs": [query(parameters={"binary_data_size": "x"})]}), {}, 400,
     "inputs[0].parameters.binary_data_size must be a non-negative integer"),
    ("binary_data_size past the body", "POST", INFER,
     dumps({"inputs": [{"name": "query", "shape": [1, D], "datatype": "FP32",
                        "parameters": {"binary_data_size": 99999}}]}), {}, 400,
     "inputs[0].parameters.binary_data_size is 99999, more than the 0 binary bytes"),
    ("parameters an array", "POST", INFER, dumps({"parameters": [1], "inputs": [query()]}),
     {}, 400, "parameters must be an object"),
    ("parameter an object", "POST", INFER,
     dumps({"parameters": {"causal": {"x": 1}}, "inputs": [query()]}), {}, 400,
     "parameters.causal must be a bool, an int64 or a string"),
    ("parameter of the wrong kind", "POST", INFER,
     dumps({"parameters": {"causal": "yes"}, "inputs": [query()]}), {}, 400,
     'parameters["causal"] must be a bool_param'),
    ("unknown parameter", "POST", INFER,
     dumps({"parameters": {"priority": 1}, "inputs": [query()]}), {}, 400,
     'parameters["priority"] is not a parameter'),
    ("timeout negative", "POST", INFER,
     dumps({"parameters": {"timeout": -5}, "inputs": [query()]}), {}, 400,
     'parameters["timeout"] must be an int64_param of microseconds >= 0'),
    ("binary_data_output a string", "POST", INFER,
     dumps({"parameters": {"binary_data_output": "yes"}, "inputs": [query()]}), {}, 400,
     "parameters.binary_data_output must be true or false"),
    ("id a number", "POST", INFER, dumps({"id": 7, "inputs": [query()]}), {}, 400,
     "id must be a string, got 7"),
    ("outputs an object", "POST", INFER, dumps({"inputs": [query()], "outputs": {"a": 1}}),
     {}, 400, "outputs must be an array"),
    ("output a number", "POST", INFER, dumps({"inputs": [query()], "outputs": [3]}), {},
     400, "outputs[0] must be an object, got 3"),
    ("output binary_data a string", "POST", INFER,
     dumps({"inputs": [query()],
            "outputs": [{"name": "output", "parameters": {"binary_data": "yes"}}]}), {}, 400,
     "outputs[0].parameters.binary_data must be true or false"),
    ("unknown output", "POST", INFER,
     dumps({"inputs": [query()], "outputs": [{"name": "logits"}]}), {}, 400,
     'outputs[0].name must be "output" or "attention"'),
    ("unknown input", "POST", INFER, dumps({"inputs": [query(name="x")]}), {}, 400,
     'inputs[0].name must be "query" or "memory"'),
    ("deep nesting", "POST", INFER, b'{"inputs":' + b"[" * 100000 + b"]" * 100000 + b"}",
     {}, 400, "nests more than 32 levels deep"),
    ("invalid UTF-8 in a string", "POST", INFER, b'{"inputs":[],"id":"\xff\xfe"}', {}, 400,
     "not valid JSON"),
    ("header length not a number", "POST", INFER, dumps({"inputs": [query()]}),
     {"Inference-Header-Content-Length": "abc"}, 400,
     'Inference-Header-Content-Length must be a non-negative byte count, got "abc"'),
    ("header length negative", "POST", INFER, dumps({"inputs": [query()]}),
     {"Inference-Header-Content-Length": "-1"}, 400, "non-negative byte count"),
    ("header length past the body", "POST", INFER, dumps({"inputs": [query()]}),
     {"Inference-Header-Content-Length": "999999"}, 400,
     "Inference-Header-Content-Length 999999 is more than the body's"),
    ("binary bytes nobody claims", "POST", INFER, b'{"inputs":[]}' + b"\0" * 8,
     {"Inference-Header-Content-Length": "13"}, 400,
     "the body has 8 binary bytes that no input's binary_data_size claims"),
    ("model not served", "POST", "/v2/models/nope/infer", b'{"inputs":[5]}', {}, 404,
     'model "nope" is not served (served: mha-base (version 1))'),
    ("version not served", "POST", "/v2/models/mha-base/versions/2/infer",
     dumps({"inputs": [query()]}), {}, 404, 'model "mha-base" version "2" is not served'),
    ("model name not UTF-8", "POST", "/v2/models/%FF%FE/infer", b"{}", {}, 404,
     "is not served"),
    ("GET on infer", "GET", INFER, b"", {}, 405, "use POST"),
    ("POST on metadata", "POST", "/v2/models/mha-base", b"{}", {}, 405, "use GET"),
    ("unknown endpoint", "GET", "/v2/models/mha-base/explain", b"", {}, 404,
     "no such endpoint"),
    ("body over the limit", "POST", INFER, b"{}",
     {"Content-Length": str(1 << 40)}, 413, "over the limit"),
]


class HttpMalformedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = stubs.Attnserve(SERVER, "--max_queue_delay=1ms", http=True)

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0

    def request(self, method, path, body=b"", headers=None):
        connection = http.client.HTTPConnection("127.0.0.1", self.server.http_port,
                                                timeout=60)
        try:
            connection.putrequest(method, path, skip_accept_encoding=True)
            headers = dict(headers or {})
            headers.setdefault("Content-Length", str(len(body)))
            for name, value in headers.items():
                connection.putheader(name, value)
            connection.endheaders()
            # A declared length past what is sent is refused before the body is read.
            if int(headers["Content-Length"]) == len(body):
                connection.send(body)
            reply = connection.getresponse()
            return reply.status, reply.read()
        finally:
            connection.close()

    def assert_serving(self):
        status, body = self.request("POST", INFER, dumps({"inputs": [query()]}))
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["outputs"][0]["shape"], [1, D])

    def test_every_malformed_request_gets_a_4xx_naming_the_field(self):
        for name, method, path, body, headers, code, words in CASES:
            with self.subTest(name):
                status, reply = self.request(method, path, body, headers)
                self.assertEqual(status, code, reply)
                self.assertIn(words, json.loads(reply)["error"])
                self.assertIsNone(self.server.process.poll(), "the server exited")
                self.assert_serving()

    def test_binary_request_with_binary_outputs(self):
        header = dumps({"inputs": [{"name": "query", "shape": [1, D], "datatype": "FP32",
                                    "parameters": {"binary_data_size": 4 * D}}],
                        "outputs": [{"name": "output",
                                     "parameters": {"binary_data": True}}]})
        body = header + struct.pack(f"<{D}f", *([0.25] * D))
        status, reply = self.request(
            "POST", INFER, body, {"Inference-Header-Content-Length": str(len(header))})
        self.assertEqual(status, 200, reply)
        _, json_reply = self.request("POST", INFER, dumps({"inputs": [query()]}))
        expected = json.loads(json_reply)["outputs"][0]["data"]
        answer_header = json.loads(reply[:reply.index(b"}]}") + 3])
        self.assertEqual(answer_header["outputs"][0]["parameters"]["binary_data_size"],
                         4 * D)
        values = struct.unpack(f"<{D}f", reply[-4 * D:])
        self.assertEqual(list(values), [struct.unpack("<f", struct.pack("<f", v))[0]
                                        for v in expected])

    def test_health_answers_json(self):
        for path, key in (("/v2/health/live", "live"), ("/v2/health/ready", "ready")):
            status, reply = self.request("GET", path)
            self.assertEqual(status, 200)
            self.assertIs(json.loads(reply)[key], True)

    def test_timeout_parameter_of_one_microsecond_expires(self):
        status, reply = self.request(
            "POST", INFER, dumps({"parameters": {"timeout": 1}, "inputs": [query()]}))
        self.assertEqual(status, 504, reply)
        self.assertIn("deadline", json.loads(reply)["error"])


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
