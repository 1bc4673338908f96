"""The image for real: builds the top-level Dockerfile with a real Docker engine, runs it
with --network host on loopback ports and checks it from the host:
health is SERVING through attnctl, one infer equals the host binary's output, /metrics
is scraped, the server runs as uid 10001, `docker stop` exits 0 within the grace period.
Prints the image's size: base, added, and the five largest contributors.

The build runs with --network none: its package layers were built by `make deps`
(deploy/docker-prepare.sh --all), so this test downloads nothing. Where no Docker engine
can start, it exits 77 (CTest SKIP_RETURN_CODE) with the reason.

usage: docker_test.py REPO_ROOT BUILD_DIR ATTNSERVE_BINARY ATTNCTL_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import numpy as np

ROOT, BUILD, ATTNSERVE, ATTNCTL = sys.argv[1:5]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import stubs  # noqa: E402
from docker_util import (BASE, IMAGE, build_image, docker, require_engine,  # noqa: E402
                         wait_for_log_line)

UID = 10001
GRACE_SECONDS = 30


def image_bytes(image):
    return int(docker("image", "inspect", "-f", "{{.Size}}", image))


def mib(size):
    return f"{size / 2**20:.0f} MiB"


class DockerImageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        print(f"docker build: {build_image(ROOT):.0f} s", flush=True)
        cls.container = None

    @classmethod
    def tearDownClass(cls):
        if cls.container:
            docker("rm", "-f", cls.container, check=False)

    def test_image(self):
        self.report_size()
        # Port 0 on loopback: the server picks free ports and prints them.
        container = docker("run", "-d", "--network", "host", IMAGE, "--host=127.0.0.1",
                           "--port=0", "--metrics_host=127.0.0.1", "--metrics_port=0", "--http_port=-1",
                           f"--grace_period={GRACE_SECONDS // 2}s")
        type(self).container = container
        target = wait_for_log_line(container, r"listening on (\S+)$").group(1)
        metrics = wait_for_log_line(container, r"metrics on (\S+)$").group(1)
        print(f"container {container[:12]} serves {target}, metrics {metrics}")

        health = subprocess.run([ATTNCTL, f"--target={target}", "health"],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(health.stdout.strip(), "SERVING", health.stderr)
        # The image's own HEALTHCHECK, run now inside the container: it must dial the
        # port the server bound (here a free one picked by --port=0, not 50051).
        check = json.loads(docker("inspect", "-f", "{{json .Config.Healthcheck.Test}}",
                                  container))
        self.assertEqual(check[0], "CMD", check)
        result = docker("exec", container, *check[1:], check=False)
        self.assertIn("SERVING", result, check)

        self.check_infer_equals_host(target)

        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=30) as reply:
            text = reply.read().decode()
        self.assertRegex(text, r'attnserve_requests_total\{[^}]*code="OK"[^}]*\} 1\b')
        self.assertIn("process_resident_memory_bytes", text)

        pid = int(docker("inspect", "-f", "{{.State.Pid}}", container))
        self.assertEqual(os.stat(f"/proc/{pid}").st_uid, UID)

        started = time.monotonic()
        docker("stop", "-t", str(GRACE_SECONDS), container, timeout=GRACE_SECONDS + 60)
        stopped_s = time.monotonic() - started
        code = int(docker("inspect", "-f", "{{.State.ExitCode}}", container))
        print(f"docker stop: exit {code} after {stopped_s:.1f} s (grace {GRACE_SECONDS} s)")
        self.assertEqual(code, 0)
        self.assertLess(stopped_s, GRACE_SECONDS)

    def check_infer_equals_host(self, container_target):
        host = stubs.Attnserve(ATTNSERVE)
        try:
            with tempfile.TemporaryDirectory() as folder:
                query = np.random.default_rng(7).uniform(-1, 1, (24, 512)).astype("<f4")
                np.save(os.path.join(folder, "x.npy"), query)
                outputs = {}
                for name, target in (("container", container_target), ("host", host.target)):
                    path = os.path.join(folder, f"{name}.npy")
                    subprocess.run([ATTNCTL, f"--target={target}", "infer",
                                    f"--input={folder}/x.npy", f"--output={path}"],
                                   check=True, capture_output=True, timeout=60)
                    outputs[name] = np.load(path)
        finally:
            self.assertEqual(host.stop(), 0)
        self.assertEqual(outputs["container"].shape, (24, 512))
        # Same sources, compiler and libraries on the same CPU: the same primitives run.
        np.testing.assert_allclose(outputs["container"], outputs["host"], rtol=0, atol=1e-6)

    def report_size(self):
        total, base = image_bytes(IMAGE), image_bytes(BASE)
        print(f"image {IMAGE}: {mib(total)} = base {BASE} {mib(base)} + "
              f"attnserve {mib(total - base)}")
        packages = docker("run", "--rm", "--network", "none", "--entrypoint", "dpkg-query",
                          IMAGE, "-W", "-f", "${Installed-Size}\t${Package}\n")
        base_packages = set(docker("run", "--rm", "--network", "none", "--entrypoint",
                                   "dpkg-query", BASE, "-W", "-f", "${Package}\n").split())
        added = []
        for line in packages.splitlines():
            kib, name = line.split("\t")
            if name not in base_packages:
                added.append((int(kib or 0) * 1024, f"package {name}"))
        binaries = docker("run", "--rm", "--network", "none", "--entrypoint", "stat", IMAGE,
                          "-c", "%s\t%n", "/usr/local/bin/attnserve",
                          "/usr/local/bin/attnctl", "/usr/local/bin/attnbench")
        for line in binaries.splitlines():
            size, name = line.split("\t")
            added.append((int(size), f"binary {os.path.basename(name)}"))
        print("five largest additions over the base:")
        for size, name in sorted(added, reverse=True)[:5]:
            print(f"  {mib(size):>8}  {name}")


if __name__ == "__main__":
    require_engine(ROOT, BUILD)
    unittest.main(argv=[sys.argv[0]], verbosity=2)
