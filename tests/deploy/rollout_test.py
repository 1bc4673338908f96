"""Scale-out with real containers: a rolling update under load, the autoscaling signal
evaluated by a real Prometheus, and the cost of start-up warm-up.

Three containers of the project image run with --network host on loopback. Each holds
one "slot", a fixed 127.0.0.1 port that the client lists (`ipv4:` target, round_robin,
retries as the README recommends). A rolling update replaces the slots one at a time,
as a Deployment with maxSurge=1, maxUnavailable=0 does: the new container starts on the
slot's port (--reuse_grpc_port: gRPC listens with SO_REUSEPORT, so both processes
hold it while they overlap), becomes ready, and only then is the old one stopped with `docker stop` and the
Deployment's grace period. The old server's GOAWAY sends the client to reconnect, and
only the new listener is left to take the connection: the host-network analogue of a
Service whose endpoints change. Each container's readiness is read on its own HTTP port
(KServe /v2/health/ready), because the gRPC port is shared.

Prometheus scrapes every container (file-based discovery, relabelled with the
namespace/pod labels Kubernetes gives), and the prometheus-adapter rule's query, expanded
as the adapter expands it, is evaluated below and above the capacity measured here.

Every load run has a bound (a duration, or SIGINT once the rollout is done), every
container is removed at the end, and nothing leaves loopback. Exits 77 (SKIPPED, with
the reason) where no Docker engine can start.

usage: rollout_test.py REPO_ROOT BUILD_DIR ATTNBENCH
"""
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse

import yaml

ROOT, BUILD, ATTNBENCH = sys.argv[1:4]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import stubs  # noqa: E402
from docker_util import (IMAGE, build_image, docker, http_get, require_engine,  # noqa: E402
                         wait_for_log_line)

K8S = os.path.join(ROOT, "deploy", "k8s")
NAMESPACE = "attnserve"
SLOTS = 3


def load_yaml(*path):
    with open(os.path.join(K8S, *path)) as f:
        return yaml.safe_load(f)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric_sum(text, name, **labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        series, value = line.rsplit(" ", 1)
        if all(f'{key}="{want}"' in series for key, want in labels.items()):
            total += float(value)
    return total


class Container:
    """One attnserve container on loopback: its own metrics and HTTP ports (0: free
    ones, read from its output), and the gRPC port it is given."""
    serial = 0

    def __init__(self, port, *flags):
        Container.serial += 1
        self.name = f"attnserve-rollout-{os.getpid()}-{Container.serial}"
        self.started = time.monotonic()
        docker("run", "-d", "--network", "host", "--name", self.name, IMAGE,
               "--host=127.0.0.1", f"--port={port}", "--reuse_grpc_port",
               "--metrics_host=127.0.0.1", "--metrics_port=0", "--http_port=0", *flags)
        self.port = self.metrics = self.http = None
        self.ready_s = None

    def wait_ready(self, timeout_s=120):
        """Waits for KServe readiness on the container's own HTTP port; returns the
        seconds from `docker run` until then."""
        pattern = r"attnserve (listening|metrics|http) on 127\.0\.0\.1:(\d+)$"
        wait_for_log_line(self.name, r"attnserve http on \S+$", timeout_s, poll_s=0.05)
        for line in docker("logs", self.name).splitlines():
            match = re.match(pattern, line)
            if match:
                setattr(self, {"listening": "port", "metrics": "metrics",
                               "http": "http"}[match.group(1)], int(match.group(2)))
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if http_get(f"http://127.0.0.1:{self.http}/v2/health/ready")[0] == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} never became ready")
            time.sleep(0.02)
        self.ready_s = time.monotonic() - self.started
        return self.ready_s

    def scrape(self):
        return http_get(f"http://127.0.0.1:{self.metrics}/metrics")[1]

    def unary_ok(self):
        return metric_sum(self.scrape(), "grpc_server_handled_total", grpc_method="Attend",
                          grpc_code="OK")

    def stop(self, grace_s):
        """`docker stop` with the grace period: SIGTERM, then SIGKILL at its end.
        Returns (exit code, seconds the stop took)."""
        started = time.monotonic()
        docker("stop", "-t", str(grace_s), self.name, timeout=grace_s + 60)
        code = int(docker("inspect", "-f", "{{.State.ExitCode}}", self.name))
        return code, time.monotonic() - started

    def remove(self):
        docker("rm", "-f", self.name, check=False)


class Prometheus:
    """A real Prometheus scraping the containers every second; targets come from a file
    it watches (file_sd), labelled namespace/pod as on Kubernetes."""

    def __init__(self, folder):
        self.folder = folder
        self.port = free_port()
        self.targets_file = os.path.join(folder, "targets.json")
        self.set_targets([])
        config = os.path.join(folder, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: attnserve\n    file_sd_configs:\n"
                    f"      - files: ['{self.targets_file}']\n")
        self.log = open(os.path.join(folder, "prometheus.log"), "w")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(folder, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 60
        while True:
            try:
                http_get(f"http://127.0.0.1:{self.port}/-/ready")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("Prometheus did not start")
                time.sleep(0.3)

    def set_targets(self, containers):
        groups = [{"targets": [f"127.0.0.1:{c.metrics}"],
                   "labels": {"namespace": NAMESPACE, "pod": c.name}} for c in containers]
        # Renamed into place: Prometheus never reads a half-written file.
        with open(self.targets_file + ".new", "w") as f:
            json.dump(groups, f)
        os.replace(self.targets_file + ".new", self.targets_file)

    def query(self, promql):
        url = (f"http://127.0.0.1:{self.port}/api/v1/query?"
               + urllib.parse.urlencode({"query": promql}))
        body = json.loads(http_get(url)[1])
        assert body["status"] == "success", body
        return {sample["metric"].get("pod", ""): float(sample["value"][1])
                for sample in body["data"]["result"]}

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


class Load:
    """attnbench over the slots with round_robin and retries. A bounded run lasts
    `seconds`; an open-ended one lasts until finish() sends SIGINT."""

    def __init__(self, folder, name, target, *flags, seconds=None):
        self.out = os.path.join(folder, f"{name}.json")
        window = f"{seconds}s" if seconds else "1h"
        self.process = subprocess.Popen(
            [ATTNBENCH, f"--target={target}", "--lb=round_robin", "--max_attempts=4",
             "--warmup=0s", f"--window={window}", f"--max_duration={window}",
             "--max_requests=100000000", f"--json={self.out}", *flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def finish(self, interrupt=False):
        if interrupt:
            self.process.send_signal(signal.SIGINT)
        try:
            _, stderr = self.process.communicate(timeout=300)
        finally:
            self.process.kill()
        assert self.process.returncode == 0, stderr
        with open(self.out) as f:
            return json.load(f)["steps"][0]


def errors(step):
    return sum(step["errors"].values())


class RolloutTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        print(f"docker build: {build_image(ROOT):.0f} s", flush=True)
        deployment = load_yaml("base", "deployment.yaml")
        pod = deployment["spec"]["template"]["spec"]
        # The Deployment's own drain settings: the server's --grace_period and the
        # kubelet's terminationGracePeriodSeconds, used as `docker stop -t`.
        cls.grace_flags = [a for a in pod["containers"][0]["args"]
                           if a.startswith("--grace_period=")]
        cls.termination_grace_s = pod["terminationGracePeriodSeconds"]
        cls.dir = tempfile.TemporaryDirectory()
        cls.containers = []
        cls.prometheus = Prometheus(cls.dir.name)
        # Bounded queues keep an overloaded container's memory small.
        cls.flags = [*cls.grace_flags, "--max_queue_size=256"]
        cls.slots = [cls.start(0) for _ in range(SLOTS)]
        cls.prometheus.set_targets(cls.slots)
        cls.target = "ipv4:" + ",".join(f"127.0.0.1:{c.port}" for c in cls.slots)
        print(f"slots {cls.target}; ready after "
              f"{[round(c.ready_s, 2) for c in cls.slots]} s", flush=True)

    @classmethod
    def start(cls, port, *flags):
        container = Container(port, *cls.flags, *flags)
        cls.containers.append(container)
        container.wait_ready()
        return container

    @classmethod
    def tearDownClass(cls):
        for container in cls.containers:
            container.remove()
        cls.prometheus.stop()
        cls.dir.cleanup()

    def shares(self, before):
        served = [c.unary_ok() - b for c, b in zip(self.slots, before)]
        total = sum(served)
        return served, [s / total if total else 0 for s in served]

    def test_1_rolling_update_under_load_fails_no_call(self):
        folder = self.dir.name
        # Before: unary calls and streams together, a fixed 5 s.
        before = [c.unary_ok() for c in self.slots]
        unary = Load(folder, "before", self.target, "--concurrency=4", "--seq_len=16",
                     seconds=5)
        streams = Load(folder, "before-stream", self.target, "--concurrency=2", "--stream",
                       "--seq_len=16", seconds=5)
        base, base_stream = unary.finish(), streams.finish()
        _, shares_before = self.shares(before)

        # During: the same load until every slot has been replaced.
        unary = Load(folder, "during", self.target, "--concurrency=4", "--seq_len=16")
        streams = Load(folder, "during-stream", self.target, "--concurrency=2", "--stream",
                       "--seq_len=16")
        rollout = []
        for slot in range(SLOTS):
            old = self.slots[slot]
            # maxSurge=1, maxUnavailable=0: the new one is ready before the old one goes.
            new = self.start(old.port)
            self.prometheus.set_targets(self.slots + [new])
            code, stop_s = old.stop(self.termination_grace_s)
            self.slots[slot] = new
            self.prometheus.set_targets(self.slots)
            rollout.append((slot, new.ready_s, code, stop_s))
            self.assertEqual(code, 0, f"{old.name} exited {code}")
            self.assertLess(stop_s, self.termination_grace_s, "the drain hit SIGKILL")
        during, during_stream = unary.finish(interrupt=True), streams.finish(interrupt=True)

        # After: every slot is a new container.
        before = [c.unary_ok() for c in self.slots]
        after = Load(folder, "after", self.target, "--concurrency=4", "--seq_len=16",
                     seconds=5).finish()
        served_after, shares_after = self.shares(before)

        print("\nrolling update, 3 slots, unary c=4 + 2 streams, L=16:")
        for slot, ready_s, code, stop_s in rollout:
            print(f"  slot {slot}: new container SERVING {ready_s:.2f} s after docker run; "
                  f"old one stopped in {stop_s:.2f} s, exit {code}")
        for label, step in (("before", base), ("during", during), ("after", after)):
            print(f"  unary {label:>6}: {step['requests']} ok, {errors(step)} failed "
                  f"{step['errors']}, p50 {step['latency_ms']['p50']:.2f} ms, "
                  f"p99 {step['latency_ms']['p99']:.2f} ms over {step['seconds']:.1f} s")
        for label, step in (("before", base_stream), ("during", during_stream)):
            print(f"  stream {label:>6}: {step['requests']} ok, {errors(step)} failed, "
                  f"p99 {step['latency_ms']['p99']:.2f} ms, "
                  f"{step['streams_reopened']} streams reopened")
        print(f"  p99 during / before: unary "
              f"{during['latency_ms']['p99'] / base['latency_ms']['p99']:.2f}, streams "
              f"{during_stream['latency_ms']['p99'] / base_stream['latency_ms']['p99']:.2f}")
        print(f"  shares per slot before {[round(s, 3) for s in shares_before]}, after "
              f"(new containers) {[round(s, 3) for s in shares_after]}")

        for step in (base, base_stream, during, during_stream, after):
            self.assertEqual(step["errors"], {}, step)
            self.assertGreater(step["requests"], 0, step)
        # Every stream found on a replaced container was ended by its drain and reopened
        # on another; with 2 streams over 3 replaced slots at least one must have been.
        self.assertGreaterEqual(during_stream["streams_reopened"], 1)
        # The new containers took the load, evenly.
        for served in served_after:
            self.assertGreater(served, 0, served_after)
        for share in shares_before + shares_after:
            self.assertLess(abs(share - 1 / SLOTS) * SLOTS, 0.25,
                            (shares_before, shares_after))

    def adapter_query(self):
        """The prometheus-adapter rule's metricsQuery, expanded as the adapter does for
        the HPA's request: the pods of the namespace, grouped by pod."""
        rule = load_yaml("prometheus-adapter", "rules.yaml")["rules"][0]
        pods = "|".join(c.name for c in self.slots)
        return (rule["metricsQuery"]
                .replace("<<.Series>>", rule["name"]["as"])
                .replace("<<.LabelMatchers>>", f'namespace="{NAMESPACE}",pod=~"{pods}"')
                .replace("<<.GroupBy>>", "pod"))

    def hpa(self):
        """The prod HPA's queue-depth target and its replica bounds."""
        hpa = load_yaml("overlays", "prod", "horizontalpodautoscaler.yaml")["spec"]
        for metric in hpa["metrics"]:
            if metric["type"] == "Pods":
                self.assertEqual(metric["pods"]["metric"]["name"], "attnserve_queue_depth")
                target = float(metric["pods"]["target"]["averageValue"])
                return target, hpa["minReplicas"], hpa["maxReplicas"]
        self.fail("the prod HPA has no Pods metric")

    def signal(self, query):
        """Per-pod values (all three pods must answer) and their mean, which the HPA
        compares with the target."""
        values = self.prometheus.query(query)
        if sorted(values) != sorted(c.name for c in self.slots):
            return values, None
        return values, sum(values.values()) / len(values)

    def test_2_queue_depth_signal_crosses_the_hpa_target(self):
        folder = self.dir.name
        query = self.adapter_query()
        target, min_replicas, max_replicas = self.hpa()
        # What each phase produced on its own (the adapter's 1m window also holds the
        # phases before), and the CPU it took.
        recent = query.replace("[1m]", "[10s]")
        cpu = 'sum(rate(process_cpu_seconds_total{namespace="attnserve"}[10s]))'
        deadline = time.monotonic() + 60
        while self.signal(query)[1] is None:
            self.assertLess(time.monotonic(), deadline, "Prometheus never saw the pods")
            time.sleep(0.5)

        def desired(mean):
            # The HPA's rule: ceil(replicas * current / target) within its 10%
            # tolerance, clamped to the overlay's replica bounds.
            ratio = mean / target
            wanted = SLOTS if abs(ratio - 1) <= 0.1 else math.ceil(SLOTS * ratio)
            return min(max(wanted, min_replicas), max_replicas)

        # Capacity: a closed loop keeps 4 calls per pod in flight, so it cannot queue
        # more than 4 per pod itself.
        capacity = Load(folder, "capacity", self.target, "--concurrency=12",
                        "--seq_len=128", seconds=5).finish()
        self.assertEqual(capacity["errors"], {})
        rate = capacity["requests_per_second"]
        print(f"\nautoscaling signal; prod HPA: {target:g} queued per pod, "
              f"{min_replicas}-{max_replicas} replicas, now {SLOTS}")
        print(f"  adapter query: {query}")
        print(f"  capacity (closed loop, c=12, L=128): {rate:.0f} req/s")

        phases = {}
        for name, fraction, seconds in (("light", 0.5, 12), ("near", 0.9, 12),
                                        ("heavy", 1.5, 15)):
            load = Load(folder, name, self.target, f"--rate={fraction * rate:.0f}",
                        "--seq_len=128")
            started = time.monotonic()
            crossed_s = None
            try:
                # Polled throughout: when the HPA's view first goes over the target.
                while time.monotonic() - started < seconds or (
                        name == "heavy" and crossed_s is None and
                        time.monotonic() - started < 60):
                    mean = self.signal(query)[1]
                    if crossed_s is None and mean is not None and mean > target:
                        crossed_s = time.monotonic() - started
                    time.sleep(0.5)
                values, mean = self.signal(query)
                own = self.signal(recent)[1]
                cores = sum(self.prometheus.query(cpu).values())
            finally:
                step = load.finish(interrupt=True)
            phases[name] = mean
            print(f"  {name:>5} {fraction}x = {fraction * rate:.0f} req/s for "
                  f"{step['seconds']:.0f} s: adapter value per pod "
                  f"{[round(v, 2) for v in values.values()]}, mean {mean:.2f} -> HPA wants "
                  f"{desired(mean)} replicas; the phase's own 10 s mean {own:.2f}; "
                  f"{cores:.2f} cores used by the pods; over the target "
                  f"{'after %.1f s' % crossed_s if crossed_s is not None else 'never'}; "
                  f"client: {step['requests']} ok, errors {step['errors']}")
            if name == "light":
                self.assertEqual(step["errors"], {})

        self.assertLess(phases["light"], target)
        self.assertEqual(desired(phases["light"]), min_replicas)
        self.assertGreater(phases["heavy"], target, "the signal never crossed the target")
        self.assertGreater(desired(phases["heavy"]), SLOTS)

    def test_3_warm_up_is_paid_before_readiness(self):
        """Start to SERVING with and without --warm_up, and the first call's latency on
        each: the readiness gate opens only after the warm-up."""
        stub_dir = stubs.generate_stubs(ROOT)
        import grpc
        from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2
        request = attention_pb2.AttendRequest(query=tensor_pb2.Tensor(
            dtype=tensor_pb2.DATA_TYPE_FP32, shape=[128, 512], raw=bytes(128 * 512 * 4)))
        results = {}
        try:
            for warm in (True, False):
                container = self.start(0, f"--warm_up={str(warm).lower()}")
                channel = grpc.insecure_channel(f"127.0.0.1:{container.port}")
                grpc.channel_ready_future(channel).result(timeout=60)
                stub = attention_pb2_grpc.AttentionServiceStub(channel)
                times = []
                for _ in range(5):
                    started = time.perf_counter()
                    stub.Attend(request, timeout=60)
                    times.append((time.perf_counter() - started) * 1000)
                channel.close()
                results[warm] = (container.ready_s, times[0], sorted(times[1:])[1])
                container.stop(self.termination_grace_s)
        finally:
            stub_dir.cleanup()
        print("\nstart-up (docker run -> SERVING) and the first L=128 call:")
        for warm, (ready_s, first, steady) in results.items():
            print(f"  --warm_up={str(warm).lower():5}: SERVING after {ready_s:.2f} s, first "
                  f"call {first:.1f} ms, then {steady:.1f} ms (median of the next 4)")
        for ready_s, first, steady in results.values():
            self.assertGreater(ready_s, 0)
            self.assertGreater(first, 0)


if __name__ == "__main__":
    require_engine(ROOT, BUILD)
    unittest.main(argv=[sys.argv[0]], verbosity=2)
