#!/usr/bin/python3
"""How the HTTP door treats connections, against a real attnserve on 127.0.0.1:0:
- a kept-alive connection answers as fast as a fresh one (it once lost about 40 ms per
  request: Nagle's algorithm holding the answer's last segment until the client's
  delayed ACK) and as KServe gRPC answers the same request, measured as the gaps
  between the medians, arms alternating (and a self-test shows the check fails on a
  server that stalls so);
- an idle kept-alive connection stays open as long as each answer's Keep-Alive header
  says, and is closed after that;
- a second server on a taken gRPC, HTTP or metrics port exits at start naming the port,
  the cause and the flag (gRPC's default SO_REUSEPORT once let two share :50051).

usage: http_connection_test.py ATTNSERVE REPO_ROOT
"""
import http.client
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import unittest

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

SERVER, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import stubs  # noqa: E402

D = 512  # mha-base's d_model
INFER = "/v2/models/mha-base/infer"
BODY = json.dumps({"inputs": [{"name": "query", "shape": [1, D], "datatype": "FP32",
                               "data": [0.25] * D}]}).encode()
# Rounds of (kept-alive, fresh, gRPC) requests timed; the gap allowed between the
# kept-alive median and each other one. The stall this guards against cost 40 ms; a
# kept-alive connection skips the connect and the accept, so it is no slower than a
# fresh one when nothing stalls it. The same request over gRPC skips JSON, whose cost
# grows under a loaded machine's slowdown: against it the gap may also be as much as
# gRPC's own median (in a Release build, 1 ms is the larger). Under a sanitizer JSON's
# share grows with the load of the tests beside it (ThreadSanitizer, measured: 1.29 ms
# kept-alive against 0.75 ms gRPC alone, 9.45 against 3.82 under `make test`'s -j2), so
# there the check against gRPC allows at least half the stall: it still fails on the
# stall.
ROUNDS = 41
GAP_MS = 1.0
GRPC_GAP_SHARE = 1.0
STALL_MS = 40.0
SANITIZED = os.environ.get("ATTNSERVE_SANITIZERS", "") != ""


def grpc_gap_ms(grpc_p50):
    """How far the kept-alive median may lie above gRPC's median `grpc_p50`."""
    gap = max(GAP_MS, GRPC_GAP_SHARE * grpc_p50)
    return max(gap, STALL_MS / 2) if SANITIZED else gap


def p50s(arms):
    """Each arm's median time (ms) over ROUNDS rounds, the arms alternating within each
    round, after 5 warm-up rounds."""
    for _ in range(5):
        for call in arms.values():
            call()
    ms = {name: [] for name in arms}
    for _ in range(ROUNDS):
        for name, call in arms.items():
            start = time.perf_counter()
            call()
            ms[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(times) for name, times in ms.items()}


def fresh_call(port, call):
    """`call` on a new connection to `port`, closed after."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    call(connection)
    connection.close()


def infer(connection):
    connection.request("POST", INFER, BODY, {"Content-Type": "application/json"})
    reply = connection.getresponse()
    body = reply.read()
    assert reply.status == 200, (reply.status, body[:200])
    return reply


class KeepAliveTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = stubs.Attnserve(SERVER, "--max_queue_delay=0ms", http=True)

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0

    def connect(self):
        return http.client.HTTPConnection("127.0.0.1", self.server.http_port, timeout=60)

    def test_kept_alive_connection_is_as_fast_as_a_fresh_one_and_grpc(self):
        kept = self.connect()
        channel = grpc.insecure_channel(self.server.target)
        self.addCleanup(channel.close)
        kserve = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="mha-base")
        request.inputs.add(name="query", datatype="FP32", shape=[1, D])
        request.raw_input_contents.append(struct.pack(f"<{D}f", *[0.25] * D))
        p50 = p50s({"kept-alive": lambda: infer(kept),
                    "fresh": lambda: fresh_call(self.server.http_port, infer),
                    "gRPC": lambda: kserve.ModelInfer(request, timeout=60)})
        port = kept.sock.getsockname()[1]
        infer(kept)
        self.assertEqual(kept.sock.getsockname()[1], port, "the connection was reopened")
        kept.close()
        grpc_gap = grpc_gap_ms(p50["gRPC"])
        print("p50 " + ", ".join(f"{name} {value:.2f} ms" for name, value in p50.items())
              + f" (kept-alive at most {GAP_MS} ms above fresh, {grpc_gap:.2f} above gRPC)")
        self.assertLessEqual(p50["kept-alive"] - p50["fresh"], GAP_MS)
        self.assertLessEqual(p50["kept-alive"] - p50["gRPC"], grpc_gap)

    def test_idle_connection_stays_open_as_long_as_the_answer_says(self):
        connection = self.connect()
        reply = infer(connection)
        self.assertEqual(reply.getheader("Connection"), "keep-alive")
        self.assertEqual(reply.getheader("Keep-Alive"), "timeout=75")
        port = connection.sock.getsockname()[1]
        # Past civetweb's default (0.5 s), after which a pooled client once wrote into a
        # closed socket (BrokenPipeError).
        time.sleep(2)
        infer(connection)
        self.assertEqual(connection.sock.getsockname()[1], port, "the connection was reopened")
        connection.close()


class GapCheckSelfTest(unittest.TestCase):
    """The gap check above fails on the stall it guards against: a loopback server that
    writes each answer's head and body in two sends, Nagle's algorithm on, as the door
    once did."""

    def test_the_gap_check_catches_a_nagle_stall(self):
        listener = socket.create_server(("127.0.0.1", 0))
        body = b"x" * 3000

        def answer(connection):
            with connection:
                pending = b""
                while True:
                    while b"\r\n\r\n" not in pending:
                        data = connection.recv(65536)
                        if not data:
                            return
                        pending += data
                    head, _, pending = pending.partition(b"\r\n\r\n")
                    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length:"))
                    while len(pending) < length:
                        data = connection.recv(65536)
                        if not data:
                            return
                        pending += data
                    pending = pending[length:]
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
                                       % len(body))
                    connection.sendall(body)

        def accept():
            while True:
                try:
                    connection, _ = listener.accept()
                except OSError:  # shut down by the cleanup
                    return
                threading.Thread(target=answer, args=(connection,), daemon=True).start()
        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()

        def stop():
            listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
            listener.close()
            acceptor.join(timeout=10)
        self.addCleanup(stop)
        port = listener.getsockname()[1]

        def call(connection):
            connection.request("POST", "/", BODY)
            connection.getresponse().read()
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.addCleanup(kept.close)
        p50 = p50s({"kept-alive": lambda: call(kept),
                    "fresh": lambda: fresh_call(port, call)})
        print(f"stalling server: p50 kept-alive {p50['kept-alive']:.2f} ms, fresh "
              f"{p50['fresh']:.2f} ms")
        self.assertGreater(p50["kept-alive"] - p50["fresh"], GAP_MS)
        # The stall alone also exceeds the 20 ms a sanitizer build allows against gRPC.
        self.assertGreater(p50["kept-alive"] - p50["fresh"], STALL_MS / 2)


class KeepAliveTimeoutTest(unittest.TestCase):
    def test_server_closes_an_idle_connection_after_its_timeout(self):
        server = stubs.Attnserve(SERVER, "--http_keep_alive_timeout=1s", http=True)
        try:
            connection = http.client.HTTPConnection("127.0.0.1", server.http_port,
                                                    timeout=60)
            reply = infer(connection)
            self.assertEqual(reply.getheader("Keep-Alive"), "timeout=1")
            # The server's close arrives as end of file on the idle socket.
            connection.sock.settimeout(30)
            self.assertEqual(connection.sock.recv(1), b"")
            connection.close()
        finally:
            self.assertEqual(server.stop(), 0)

    def test_bad_timeout_is_refused_naming_the_flag(self):
        result = subprocess.run([SERVER, "--port=0", "--metrics_port=-1", "--http_port=0",
                                 "--http_keep_alive_timeout=0s"],
                                capture_output=True, text=True, timeout=300)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("http_keep_alive_timeout must be in [1s, 1h], got 0", result.stderr)


class TakenPortTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.first = stubs.Attnserve(SERVER, metrics=True, http=True)
        cls.grpc_port = int(cls.first.target.rsplit(":", 1)[1])

    @classmethod
    def tearDownClass(cls):
        assert cls.first.stop() == 0

    def second_server(self, *flags):
        """A second server's exit code and log; it must not start."""
        args = [SERVER, "--host=127.0.0.1", "--metrics_host=127.0.0.1", "--port=0",
                "--metrics_port=-1", "--http_port=-1", "--warm_up=false", *flags]
        result = subprocess.run(args, capture_output=True, text=True, timeout=300)
        self.assertNotIn("listening on", result.stdout)
        return result.returncode, result.stderr

    def test_each_taken_port_fails_at_start_naming_it(self):
        for flag, port, door in (("--port", self.grpc_port, "gRPC"),
                                 ("--http_port", self.first.http_port, "HTTP"),
                                 ("--metrics_port", self.first.metrics_port, "metrics")):
            with self.subTest(flag=flag):
                code, log = self.second_server(f"{flag}={port}")
                self.assertNotEqual(code, 0, log)
                self.assertIn(f"cannot listen on 127.0.0.1:{port} ({door}): address "
                              f"already in use; {flag} picks another port", log)
        # The first server still answers on every port.
        with socket.create_connection(("127.0.0.1", self.first.http_port), timeout=30):
            pass
        connection = http.client.HTTPConnection("127.0.0.1", self.first.http_port,
                                                timeout=60)
        infer(connection)
        connection.close()


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
