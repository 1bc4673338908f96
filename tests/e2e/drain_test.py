"""SIGTERM's drain delivers every accepted answer, even to a client that reads slowly.

gRPC closes a connection the moment its last call ends after a GOAWAY. When the client
was behind (its socket buffer full), the tail of its last answers was still in the
server's send queue; the client's next window update then met a closed socket, the
reset threw that tail away, and the call failed UNAVAILABLE ("recvmsg: Connection reset
by peer") although the server had answered it. CI hit this once in
ServerProcessTest.SigtermDrainsInFlightRequestsAndExitsZero. attnserve now finishes
every accepted call before the GOAWAY (AttentionServer::Shutdown).

The slow client is made real with a loopback relay between a grpcio client and the
server: its socket towards the server has a small receive buffer, and it stops
forwarding the server's bytes near the end of the drain, so the last answers wait in the
server's send queue. It forwards again once the server has exited or has logged that
every call is answered (at most 20 s); every call must then succeed with the right
answer, and the server must exit 0.

usage: drain_test.py ATTNSERVE_BINARY REPO_ROOT
"""
import array
import os
import re
import socket
import struct
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stubs  # noqa: E402

BINARY, ROOT = sys.argv[1], sys.argv[2]
CALLS = 60  # answers of 512 KiB; well over a second of compute in batches of 4
LENGTH = 256
D_MODEL = 512


class Relay:
    """Forwards one loopback TCP connection to `port`. The server-to-client direction
    pauses once `pause_at` bytes have gone that way; a reset from the server is passed
    on to the client as a reset."""

    def __init__(self, port):
        self.port = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.flowing = threading.Event()
        self.flowing.set()
        self.paused = threading.Event()
        self.pause_at = None
        self.forwarded = 0  # server to client
        self.forwarded_after_pause = 0
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()

    def resume(self):
        self.flowing.set()

    def _accept(self):
        client, _ = self.listener.accept()
        self.listener.close()
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Small, so that paused bytes stay in the server's send queue, not in ours.
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        server.connect(("127.0.0.1", self.port))
        for source, sink, gated in ((client, server, False), (server, client, True)):
            threading.Thread(target=self._pump, args=(source, sink, gated),
                             daemon=True).start()

    def _pump(self, source, sink, gated):
        while True:
            if gated:
                self.flowing.wait()
            try:
                data = source.recv(1 << 16)
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
            except OSError:
                # A reset (or any failure) on either side resets both: SO_LINGER 0
                # makes close() send RST.
                for end in (source, sink):
                    try:
                        end.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
                        end.close()
                    except OSError:
                        pass
                return
            if gated:
                if self.paused.is_set():
                    self.forwarded_after_pause += len(data)
                self.forwarded += len(data)
                if (self.pause_at is not None and self.forwarded >= self.pause_at and
                        not self.paused.is_set()):
                    self.flowing.clear()
                    self.paused.set()


def held_calls(port):
    """Attend calls the server holds or has answered OK (one /metrics fetch)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    total = 0.0
    for series in ('attnserve_inflight_requests{model="mha-base"}',
                   'attnserve_requests_total{code="OK",model="mha-base"}'):
        match = re.search(re.escape(series) + r" (\S+)", text.decode())
        total += float(match.group(1)) if match else 0.0
    return total


class DrainTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stub_dir = stubs.generate_stubs(ROOT)

    @classmethod
    def tearDownClass(cls):
        cls.stub_dir.cleanup()

    def test_a_slow_client_gets_every_answer(self):
        import grpc
        from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2

        log = tempfile.NamedTemporaryFile(prefix="drain-", suffix=".stderr")
        server = stubs.Attnserve(BINARY, "--instances=1", "--max_batch_size=4",
                                 "--max_queue_delay=1ms", "--grace_period=60s",
                                 metrics=True, stderr=log.name)
        relay = Relay(int(server.target.rsplit(":", 1)[1]))
        size = 64 << 20
        channel = grpc.insecure_channel(relay.address, options=[
            ("grpc.max_receive_message_length", size),
            ("grpc.max_send_message_length", size)])
        stub = attention_pb2_grpc.AttentionServiceStub(channel)

        def request(length):
            values = array.array("f", [0.25 + 0.001 * (i % 97)
                                       for i in range(length * D_MODEL)])
            return attention_pb2.AttendRequest(query=tensor_pb2.Tensor(
                dtype=tensor_pb2.DATA_TYPE_FP32, shape=[length, D_MODEL],
                raw=values.tobytes()))

        stub.Attend(request(8), timeout=60)  # connected and warm
        expected = numpy.frombuffer(stub.Attend(request(LENGTH), timeout=60).output.raw,
                                    numpy.float32)
        self.assertEqual(expected.size, LENGTH * D_MODEL)
        # The relay stops passing answers on with the last two (1 MiB) still to come:
        # those wait in the server's send queue while it drains.
        relay.pause_at = relay.forwarded + (CALLS - 2) * LENGTH * D_MODEL * 4
        futures = [stub.Attend.future(request(LENGTH), timeout=120) for _ in range(CALLS)]

        before = 2  # the two calls above
        deadline = time.monotonic() + 120
        while held_calls(server.metrics_port) - before < CALLS:
            self.assertLess(time.monotonic(), deadline, "the server never held every call")
            time.sleep(0.01)
        server.process.send_signal(15)  # SIGTERM
        self.assertTrue(relay.paused.wait(timeout=120), "the relay never paused")
        deadline = time.monotonic() + 20
        while (server.process.poll() is None and time.monotonic() < deadline and
               "event=calls_answered" not in open(log.name).read()):
            time.sleep(0.01)
        relay.resume()

        failures = []
        for future in futures:
            try:
                output = numpy.frombuffer(future.result().output.raw, numpy.float32)
                # A batch of 4 may round differently from the lone call.
                numpy.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-5)
            except grpc.RpcError as error:
                failures.append(f"{error.code().name}: {error.details()}")
        self.assertEqual(failures, [], f"{len(failures)} of {CALLS} calls failed")
        self.assertEqual(server.process.wait(timeout=60), 0)
        server.process.stdout.close()
        channel.close()
        text = open(log.name).read()
        self.assertIn("event=calls_answered all=true open=0", text)
        self.assertIn("event=shutdown_finished", text)
        # The warm-up's timing of the projections, logged once at start.
        self.assertRegex(text, r'event=projection_choices choices="512x512@\d+: '
                               r'(per shape|runtime rows) \([0-9.]+ vs [0-9.]+ ms at '
                               r'128 rows\)')
        print(f"relay forwarded {relay.forwarded_after_pause} bytes after the pause",
              file=sys.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
