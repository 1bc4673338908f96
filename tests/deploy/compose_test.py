"""The compose stack run for real: Debian's docker-compose brings up
deploy/compose.host.yaml (compose.yaml on host networking, loopback only, as this engine
has no bridge network; compose_check keeps the two alike): attnserve and Prometheus.

attnserve runs the project image built offline from the Dockerfile (docker_util, as
docker_test builds it) through ATTNSERVE_IMAGE: compose's own build sends the context
through docker-py, which misses the package layers `make deps` cached and would need
the network.

Checked: attnserve answers a call on 127.0.0.1:50051 and KServe ready on :8000; the
image's HEALTHCHECK turns the container healthy; Prometheus (the compose service, with
its mounted configuration and alert rules) scrapes attnserve and counts that call; the
alert rules from deploy/prometheus/alerts.yml are loaded; `docker-compose stop` drains
attnserve, which exits 0.

Prometheus comes from Debian's package (attnserve-prometheus:debian, made by `make deps`
from deploy/prometheus/Dockerfile.debian) through PROMETHEUS_IMAGE, because no registry
is reachable here. Grafana is not started: no Grafana image can be pulled or built here
(no registry, and Debian 12 does not package Grafana); its provisioning files are checked
by compose_check.

The stack uses fixed loopback ports (50051, 8000, 8080, 9090, as compose.host.yaml says);
the test is skipped (exit 77), naming the port, when one is taken. Everything is removed at the
end. Exits 77 (SKIPPED, with the reason) where no Docker engine can start.

usage: compose_test.py REPO_ROOT BUILD_DIR ATTNCTL
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import unittest
import urllib.parse

import yaml

ROOT, BUILD, ATTNCTL = sys.argv[1:4]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from docker_util import IMAGE, build_image, docker, http_get, require_engine  # noqa: E402

COMPOSE = "/usr/bin/docker-compose"  # Debian's docker-compose (1.29)
PROJECT = "attnserve-compose-test"
PROMETHEUS_IMAGE = "attnserve-prometheus:debian"
PORTS = {"gRPC": 50051, "KServe HTTP": 8000, "metrics": 8080, "Prometheus": 9090}
FILES = [os.path.join(ROOT, "deploy", "compose.host.yaml")]


def compose(*args, timeout=300, check=True):
    command = [COMPOSE, "-p", PROJECT]
    for path in FILES:
        command += ["-f", path]
    result = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "ATTNSERVE_IMAGE": IMAGE, "PROMETHEUS_IMAGE": PROMETHEUS_IMAGE})
    if check and result.returncode != 0:
        raise AssertionError(f"docker-compose {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout.strip()


def wait_for(what, condition, timeout_s=120, poll_s=0.5):
    """Polls `condition` (a function returning a value or None, raising while the
    thing is not up yet) until it gives a value; fails naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except (OSError, ValueError, KeyError) as error:
            last = error
        time.sleep(poll_s)
    raise AssertionError(f"{what} not within {timeout_s} s (last: {last})")


def container_id(service):
    return compose("ps", "-q", service)


class ComposeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        compose("down", "--remove-orphans", "-t", "5", check=False)
        build_image(ROOT)
        compose("up", "-d", "--no-build", "attnserve", "prometheus")

    @classmethod
    def tearDownClass(cls):
        logs = compose("logs", "--no-color", check=False)
        compose("down", "--remove-orphans", "-t", "30", check=False)
        if cls._failed:
            print(logs[-6000:])

    _failed = False

    def run(self, result=None):
        outcome = super().run(result)
        if result is not None and not result.wasSuccessful():
            type(self)._failed = True
        return outcome

    def test_1_attnserve_answers_and_turns_healthy(self):
        wait_for("attnserve ready on :8000",
                 lambda: http_get("http://127.0.0.1:8000/v2/health/ready")[0] == 200)
        infer = subprocess.run(
            [ATTNCTL, "--target=127.0.0.1:50051", "--timeout=30s", "infer", "--random", "--seq_len=8"],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(infer.returncode, 0, infer.stderr)
        # The image's HEALTHCHECK dials the port attnserve wrote to its port file.
        attnserve = container_id("attnserve")
        health = wait_for(
            "the HEALTHCHECK to pass",
            lambda: docker("inspect", "-f", "{{.State.Health.Status}}", attnserve) == "healthy",
            timeout_s=90)
        self.assertTrue(health)

    def test_2_prometheus_scrapes_attnserve_and_loads_the_alerts(self):
        def scraped_call():
            query = urllib.parse.urlencode(
                {"query": 'sum(grpc_server_handled_total{job="attnserve",grpc_method="Attend"})'})
            _, body = http_get(f"http://127.0.0.1:9090/api/v1/query?{query}")
            result = json.loads(body)["data"]["result"]
            return float(result[0]["value"][1]) >= 1 if result else None
        wait_for("Prometheus to scrape the Attend call", scraped_call, timeout_s=120)
        _, body = http_get("http://127.0.0.1:9090/api/v1/targets")
        targets = json.loads(body)["data"]["activeTargets"]
        self.assertEqual([(t["labels"]["job"], t["scrapeUrl"], t["health"]) for t in targets],
                         [("attnserve", "http://127.0.0.1:8080/metrics", "up")])
        _, body = http_get("http://127.0.0.1:9090/api/v1/rules")
        alerts = [rule["name"] for group in json.loads(body)["data"]["groups"]
                  for rule in group["rules"] if rule["type"] == "alerting"]
        shipped = yaml.safe_load(open(os.path.join(ROOT, "deploy", "prometheus", "alerts.yml")))
        self.assertEqual(sorted(alerts), sorted(rule["alert"] for group in shipped["groups"]
                                                for rule in group["rules"] if "alert" in rule))

    def test_3_stop_drains_attnserve_to_exit_0(self):
        attnserve = container_id("attnserve")
        compose("stop", "-t", "30", "attnserve")
        self.assertEqual(docker("inspect", "-f", "{{.State.ExitCode}}", attnserve), "0")


def main():
    # The stack's ports are fixed (compose.host.yaml is what users run); when something
    # else holds one (a `make run` in another terminal), skip and say which.
    for name, port in PORTS.items():
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                print(f"SKIPPED: 127.0.0.1:{port} ({name}) is taken, and "
                      "compose.host.yaml needs it")
                sys.exit(77)
    require_engine(ROOT, BUILD)
    if not shutil.which(COMPOSE):
        sys.exit(f"{COMPOSE} is missing: run `make deps` (deploy/install-deps.sh --test)")
    if subprocess.run(["/usr/bin/docker", "image", "inspect", PROMETHEUS_IMAGE],
                      capture_output=True).returncode:
        sys.exit(f"{PROMETHEUS_IMAGE} is missing: run `make deps` "
                 "(deploy/docker-prepare.sh --all)")
    unittest.main(argv=[sys.argv[0], "-v"])


if __name__ == "__main__":
    main()
