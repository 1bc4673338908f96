#!/usr/bin/python3
"""TLS, mTLS and bearer tokens, for real: a CA, server and client certificates made
with openssl at test time, attnserve processes on 127.0.0.1, and attnctl, Python grpcio,
tritonclient and plain HTTP as clients. Certificate rotation under load and token
rotation are waited on as events (bounded), and the server's log is checked to never
contain a token.

usage: security_test.py ATTNSERVE ATTNCTL REPO_ROOT
"""
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

import grpc
import numpy as np

SERVER, ATTNCTL, ROOT = sys.argv[1], sys.argv[2], sys.argv[3]

from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2  # noqa: E402


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(folder, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
            "-subj", f"/CN={name}", cwd=folder)


def make_cert(folder, name, ca, san="IP:127.0.0.1,DNS:localhost"):
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
            cwd=folder)
    with open(os.path.join(folder, f"{name}.ext"), "w") as ext:
        ext.write(f"subjectAltName={san}\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
            cwd=folder)


class Server:
    """attnserve with `flags`; its stderr goes to a file the test reads."""

    def __init__(self, folder, *flags):
        self.log_path = os.path.join(folder, f"server-{time.monotonic_ns()}.log")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [SERVER, "--host=127.0.0.1", "--port=0", "--metrics_host=127.0.0.1",
             "--metrics_port=0", "--http_port=0", *flags],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.process.stdout.readline()
        if "listening on" not in line:
            self.process.kill()
            raise AssertionError(f"attnserve did not start: {open(self.log_path).read()}")
        self.target = line.strip().rsplit(" ", 1)[1]
        self.metrics = self.process.stdout.readline().strip().rsplit(" ", 1)[1]
        self.http = self.process.stdout.readline().strip().rsplit(" ", 1)[1]

    def stop(self):
        self.process.terminate()
        code = self.process.wait(timeout=60)
        self.process.stdout.close()
        self.log.close()
        return code

    def stderr(self):
        with open(self.log_path) as f:
            return f.read()


def attnctl(target, *args):
    return subprocess.run([ATTNCTL, f"--target={target}", "--timeout=10s", *args],
                          capture_output=True, text=True, timeout=60)


def request(length=4):
    values = np.random.default_rng(length).uniform(-1, 1, (length, 512)).astype("<f4")
    return attention_pb2.AttendRequest(query=tensor_pb2.Tensor(
        dtype=tensor_pb2.DATA_TYPE_FP32, shape=[length, 512], raw=values.tobytes()))


class SecurityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        make_ca(cls.dir.name, "ca")
        make_ca(cls.dir.name, "other-ca")
        make_cert(cls.dir.name, "server", "ca")
        make_cert(cls.dir.name, "server2", "ca")
        make_cert(cls.dir.name, "client", "ca", san="DNS:client")

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def read(self, name):
        with open(self.path(name), "rb") as f:
            return f.read()

    def test_tls_with_attnctl_and_python(self):
        server = Server(self.dir.name, f"--tls_cert={self.path('server.pem')}",
                        f"--tls_key={self.path('server.key')}")
        try:
            ok = attnctl(server.target, f"--tls_ca={self.path('ca.pem')}", "health")
            self.assertEqual(ok.returncode, 0, ok.stderr)
            self.assertEqual(ok.stdout.strip(), "SERVING")
            infer = attnctl(server.target, f"--tls_ca={self.path('ca.pem')}", "infer",
                            "--random", "--seq_len=8")
            self.assertEqual(infer.returncode, 0, infer.stderr)
            credentials = grpc.ssl_channel_credentials(self.read("ca.pem"))
            with grpc.secure_channel(server.target, credentials) as channel:
                reply = attention_pb2_grpc.AttentionServiceStub(channel).Attend(
                    request(), timeout=30)
                self.assertEqual(list(reply.output.shape), [4, 512])
            # A client that trusts another CA, or speaks plaintext, gets nothing.
            wrong = attnctl(server.target, f"--tls_ca={self.path('other-ca.pem')}", "health")
            self.assertEqual(wrong.returncode, 1)
            self.assertIn("UNAVAILABLE", wrong.stderr)
            plain = attnctl(server.target, "health")
            self.assertEqual(plain.returncode, 1)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_readme_python_tls_and_token_example(self):
        # docs/operations.md's block, run as written against a TLS + token server: only the
        # target changes (the example's host name resolves nowhere).
        with open(os.path.join(ROOT, "docs", "operations.md")) as f:
            readme = f.read()
        code = readme.split("<!-- security_test -->\n```python\n", 1)[1].split("```", 1)[0]
        with open(self.path("tokens"), "w") as f:
            f.write("readme-secret-token\n")
        with open(self.path("my.token"), "w") as f:
            f.write("readme-secret-token\n")
        server = Server(self.dir.name, f"--tls_cert={self.path('server.pem')}",
                        f"--tls_key={self.path('server.key')}",
                        f"--auth_token_file={self.path('tokens')}")
        try:
            code = code.replace("attnserve.example:50051", server.target)
            result = subprocess.run([sys.executable, "-c", code + "\nprint(output.shape)"],
                                    cwd=self.dir.name, capture_output=True, text=True,
                                    timeout=120)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn("(16, 512)", result.stdout)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_mtls_refuses_clients_without_a_certificate(self):
        server = Server(self.dir.name, f"--tls_cert={self.path('server.pem')}",
                        f"--tls_key={self.path('server.key')}",
                        f"--tls_client_ca={self.path('ca.pem')}")
        try:
            anonymous = attnctl(server.target, f"--tls_ca={self.path('ca.pem')}", "health")
            self.assertEqual(anonymous.returncode, 1)
            signed = attnctl(server.target, f"--tls_ca={self.path('ca.pem')}",
                             f"--tls_cert={self.path('client.pem')}",
                             f"--tls_key={self.path('client.key')}", "health")
            self.assertEqual(signed.returncode, 0, signed.stderr)
            self.assertEqual(signed.stdout.strip(), "SERVING")
        finally:
            self.assertEqual(server.stop(), 0)

    def test_tokens(self):
        with open(self.path("tokens"), "w") as f:
            f.write("# one per line\nfirst-secret-token\n\nsecond-secret-token\n")
        with open(self.path("good"), "w") as f:
            f.write("second-secret-token\n")
        with open(self.path("bad"), "w") as f:
            f.write("not-a-token\n")
        server = Server(self.dir.name, f"--auth_token_file={self.path('tokens')}")
        try:
            health = attnctl(server.target, "health")  # probes stay open
            self.assertEqual(health.stdout.strip(), "SERVING", health.stderr)
            for flags in ([], [f"--token_file={self.path('bad')}"]):
                refused = attnctl(server.target, *flags, "infer", "--random", "--seq_len=4")
                self.assertEqual(refused.returncode, 1)
                self.assertIn("UNAUTHENTICATED", refused.stderr)
            allowed = attnctl(server.target, f"--token_file={self.path('good')}", "infer",
                              "--random", "--seq_len=4")
            self.assertEqual(allowed.returncode, 0, allowed.stderr)

            # KServe over gRPC (Triton's client) and HTTP follow the same tokens.
            import tritonclient.grpc as triton
            from tritonclient.utils import InferenceServerException
            client = triton.InferenceServerClient(url=server.target)
            self.assertTrue(client.is_server_ready())  # readiness stays open
            query = np.zeros((2, 512), dtype=np.float32)
            inputs = [triton.InferInput("query", [2, 512], "FP32")]
            inputs[0].set_data_from_numpy(query)
            with self.assertRaises(InferenceServerException):
                client.infer("mha-base", inputs)
            result = client.infer("mha-base", inputs,
                                  headers={"authorization": "Bearer first-secret-token"})
            self.assertEqual(result.as_numpy("output").shape, (2, 512))
            client.close()
            body = json.dumps({"inputs": [{"name": "query", "shape": [1, 512],
                                           "datatype": "FP32", "data": [0.0] * 512}]})
            http = urllib.request.Request(f"http://{server.http}/v2/models/mha-base/infer",
                                          data=body.encode(), method="POST")
            with self.assertRaises(urllib.error.HTTPError) as error:
                urllib.request.urlopen(http, timeout=30)
            self.assertEqual(error.exception.code, 401)
            http.add_header("Authorization", "Bearer first-secret-token")
            with urllib.request.urlopen(http, timeout=30) as reply:
                self.assertEqual(reply.status, 200)
            with urllib.request.urlopen(f"http://{server.http}/v2/health/ready",
                                        timeout=30) as reply:
                self.assertEqual(reply.status, 200)
            # The descriptions (OpenAI's model list, TEI's /info) follow them too.
            for path in ("/v1/models", "/v1/models/mha-base", "/info"):
                described = urllib.request.Request(f"http://{server.http}{path}")
                with self.assertRaises(urllib.error.HTTPError) as error:
                    urllib.request.urlopen(described, timeout=30)
                self.assertEqual(error.exception.code, 401, path)
                described.add_header("Authorization", "Bearer first-secret-token")
                with urllib.request.urlopen(described, timeout=30) as reply:
                    self.assertEqual(reply.status, 200, path)

            # Rotation: a new file replaces the tokens without a restart.
            with open(self.path("tokens.new"), "w") as f:
                f.write("third-secret-token\n")
            os.replace(self.path("tokens.new"), self.path("tokens"))
            with open(self.path("third"), "w") as f:
                f.write("third-secret-token\n")
            deadline = time.monotonic() + 30
            while True:
                new = attnctl(server.target, f"--token_file={self.path('third')}", "models")
                if new.returncode == 0:
                    break
                self.assertLess(time.monotonic(), deadline, new.stderr)
                time.sleep(0.2)
            old = attnctl(server.target, f"--token_file={self.path('good')}", "models")
            self.assertIn("UNAUTHENTICATED", old.stderr)

            # SIGHUP re-reads the file even when its time and size look unchanged.
            before = os.stat(self.path("tokens"))
            with open(self.path("tokens"), "w") as f:
                f.write("fourth-secret-tokn\n")  # as long as the third
            os.utime(self.path("tokens"), ns=(before.st_atime_ns, before.st_mtime_ns))
            with open(self.path("fourth"), "w") as f:
                f.write("fourth-secret-tokn\n")
            unchanged = attnctl(server.target, f"--token_file={self.path('fourth')}", "models")
            self.assertIn("UNAUTHENTICATED", unchanged.stderr)
            server.process.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 30
            while attnctl(server.target, f"--token_file={self.path('fourth')}",
                          "models").returncode != 0:
                self.assertLess(time.monotonic(), deadline, "SIGHUP did not reload the tokens")
                time.sleep(0.2)

            with urllib.request.urlopen(f"http://{server.metrics}/metrics",
                                        timeout=30) as reply:
                metrics = reply.read().decode()
            # attnctl infer asks GetModel for d_model first: those were refused.
            self.assertRegex(metrics, r'grpc_server_handled_total\{[^}]*grpc_code='
                                      r'"Unauthenticated"[^}]*grpc_method="GetModel"[^}]*\} '
                                      r'[2-9]')
        finally:
            self.assertEqual(server.stop(), 0)
        log = server.stderr()
        for token in ("first-secret-token", "second-secret-token", "third-secret-token",
                      "fourth-secret-tokn", "not-a-token"):
            self.assertNotIn(token, log)

    def test_certificate_rotation_under_load_fails_no_call(self):
        for name in ("server", "server2"):
            for ext in ("pem", "key"):
                with open(self.path(f"{name}.{ext}"), "rb") as source:
                    data = source.read()
                with open(self.path(f"live-{name}.{ext}"), "wb") as target:
                    target.write(data)
        os.makedirs(self.path("live"), exist_ok=True)
        for ext in ("pem", "key"):
            os.replace(self.path(f"live-server.{ext}"), self.path(f"live/server.{ext}"))
        server = Server(self.dir.name, f"--tls_cert={self.path('live/server.pem')}",
                        f"--tls_key={self.path('live/server.key')}")
        failures, calls = [], [0]
        stop = threading.Event()
        credentials = grpc.ssl_channel_credentials(self.read("ca.pem"))

        def load():
            while not stop.is_set():
                # A new channel each round: every round makes a fresh handshake.
                with grpc.secure_channel(server.target, credentials) as channel:
                    stub = attention_pb2_grpc.AttentionServiceStub(channel)
                    for _ in range(5):
                        try:
                            stub.Attend(request(), timeout=30)
                            calls[0] += 1
                        except grpc.RpcError as error:
                            failures.append(error)

        def presented():
            host, port = server.target.rsplit(":", 1)
            return ssl.get_server_certificate((host, int(port)))

        try:
            thread = threading.Thread(target=load)
            thread.start()
            first = presented()
            with open(self.path("server2.pem")) as f:
                rotated = ssl.PEM_cert_to_DER_cert(f.read())
            # Swap key and certificate (a rename each; gRPC re-reads the pair).
            os.replace(self.path("live-server2.key"), self.path("live/server.key"))
            os.replace(self.path("live-server2.pem"), self.path("live/server.pem"))
            deadline = time.monotonic() + 60
            while ssl.PEM_cert_to_DER_cert(presented()) != rotated:
                self.assertLess(time.monotonic(), deadline, "the new certificate never showed")
                time.sleep(0.2)
            before = calls[0]
            while calls[0] < before + 10 and time.monotonic() < deadline:
                time.sleep(0.05)  # calls keep succeeding on the new certificate
            stop.set()
            thread.join(timeout=60)
            self.assertNotEqual(ssl.PEM_cert_to_DER_cert(first), rotated)
            self.assertEqual(failures, [])
            self.assertGreaterEqual(calls[0], before + 10)
        finally:
            stop.set()
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
