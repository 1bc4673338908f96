#!/usr/bin/python3
"""Scale-out on loopback: three attnserve replicas behind one client target
`ipv4:127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3` with round_robin and a retry policy for
UNAVAILABLE (what the headless Service + dns:/// gives a client in Kubernetes).

Asserts each replica serves a third of the load (±20%), that a replica receiving SIGTERM
mid-load costs no failed request (unary calls, and AttendStream streams, which end
UNAVAILABLE on the draining replica and are reopened elsewhere), and reports how many fail when one is SIGKILLed
(asserting the others keep succeeding). Bounded: every attnbench run has a fixed length.

usage: scale_out_test.py ATTNSERVE ATTNBENCH REPO_ROOT
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

SERVER, ATTNBENCH, ROOT = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import stubs  # noqa: E402


def ok_requests(metrics_port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith("attnserve_requests_total{") and 'code="OK"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


class ScaleOutTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.replicas = [stubs.Attnserve(SERVER, "--max_queue_delay=1ms",
                                         "--grace_period=20s", "--intra_op_threads=1",
                                         metrics=True) for _ in range(3)]
        self.target = "ipv4:" + ",".join(r.target for r in self.replicas)

    def tearDown(self):
        for replica in self.replicas:
            if replica.process.poll() is None:
                replica.stop()
        self.dir.cleanup()

    def bench(self, seconds, name, *flags):
        out = os.path.join(self.dir.name, name + ".json")
        command = [ATTNBENCH, f"--target={self.target}", "--lb=round_robin",
                   "--max_attempts=4", "--concurrency=6", "--seq_len=16", "--warmup=0.5s",
                   "--window=1s", f"--max_duration={seconds}s", "--max_requests=100000000",
                   f"--json={out}", *flags]
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True), out

    def finish(self, process, out):
        _, stderr = process.communicate(timeout=120)
        self.assertEqual(process.returncode, 0, stderr)
        return json.load(open(out))["steps"][0]

    def test_1_round_robin_spreads_load_evenly(self):
        before = [ok_requests(r.metrics_port) for r in self.replicas]
        process, out = self.bench(4, "spread")
        step = self.finish(process, out)
        served = [ok_requests(r.metrics_port) - b for r, b in zip(self.replicas, before)]
        total = sum(served)
        shares = [s / total for s in served]
        print(f"\nper-replica requests {served} shares "
              f"{[round(s, 3) for s in shares]} client ok={step['requests']} "
              f"errors={step['errors']}")
        self.assertEqual(step["errors"], {})
        for share in shares:
            self.assertLess(abs(share - 1 / 3) / (1 / 3), 0.20, shares)

    def test_2_sigterm_mid_load_loses_nothing(self):
        process, out = self.bench(6, "sigterm")
        time.sleep(2.5)
        victim = self.replicas[0]
        before_kill = ok_requests(victim.metrics_port)
        victim.process.send_signal(signal.SIGTERM)
        self.assertEqual(victim.process.wait(timeout=60), 0)
        step = self.finish(process, out)
        survivors = [ok_requests(r.metrics_port) for r in self.replicas[1:]]
        print(f"\nSIGTERM: client ok={step['requests']} errors={step['errors']} "
              f"victim served {before_kill:.0f} before the signal; survivors {survivors}")
        self.assertEqual(step["errors"], {})
        self.assertGreater(step["requests"], 0)

    def test_2b_sigterm_ends_streams_cleanly_and_they_reopen_elsewhere(self):
        # No warm-up and one window as long as the run: measurement starts before the
        # victim's first answer and cannot end early by being stable, so the signal
        # lands inside it.
        process, out = self.bench(8, "stream", "--stream", "--warmup=0s", "--window=8s")
        victim = self.replicas[0]
        deadline = time.monotonic() + 60
        while ok_requests(victim.metrics_port) < 20:
            self.assertLess(time.monotonic(), deadline, "the victim never got stream load")
            time.sleep(0.1)
        victim.process.send_signal(signal.SIGTERM)
        self.assertEqual(victim.process.wait(timeout=60), 0)
        step = self.finish(process, out)
        print(f"\nSIGTERM under streams: client ok={step['requests']} "
              f"errors={step['errors']} streams reopened={step['streams_reopened']}")
        # The victim's streams ended UNAVAILABLE after answering what they held; each
        # was reopened on a survivor and its unanswered message sent again.
        self.assertEqual(step["errors"], {})
        self.assertGreaterEqual(step["streams_reopened"], 1)
        self.assertGreater(step["requests"], 0)

    def test_3_sigkill_mid_load(self):
        process, out = self.bench(6, "sigkill")
        time.sleep(2.5)
        self.replicas[1].process.send_signal(signal.SIGKILL)
        self.replicas[1].process.wait(timeout=30)
        step = self.finish(process, out)
        failed = sum(step["errors"].values())
        print(f"\nSIGKILL: client ok={step['requests']} failed={failed} "
              f"errors={step['errors']}")
        self.assertGreater(step["requests"], 100)
        # The retry policy should absorb the loss; report rather than hide any misses.
        self.assertLessEqual(failed, 6, step["errors"])


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
