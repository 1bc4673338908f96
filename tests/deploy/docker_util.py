"""Helpers shared by the tests that run the project image with a real Docker engine:
the docker CLI, the engine check (exit 77, CTest's SKIP_RETURN_CODE, where none can
start), the offline image build, waiting on a container's output, and a plain HTTP GET
for the containers' loopback ports."""
import os
import re
import subprocess
import sys
import time
import urllib.request

DOCKER = "/usr/bin/docker"
IMAGE = "attnserve:test"
BASE = "debian:bookworm-slim"
SKIPPED = 77


def docker(*args, timeout=120, check=True):
    result = subprocess.run([DOCKER, *args], capture_output=True, text=True,
                            timeout=timeout, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout.strip()


def require_engine(root, build):
    """Starts the engine if needed (deploy/docker-prepare.sh --engine). Exits 77 with
    the reason when no engine can start here; fails when `make deps` has not made the
    base image."""
    engine = subprocess.run([os.path.join(root, "deploy", "docker-prepare.sh"), "--engine",
                             build], capture_output=True, text=True, timeout=120)
    if engine.returncode == 3:
        print(f"SKIPPED: no Docker engine can start here: {engine.stderr.strip()}")
        sys.exit(SKIPPED)
    if engine.returncode != 0:
        sys.exit(f"docker-prepare failed: {engine.stderr}")
    if subprocess.run([DOCKER, "image", "inspect", BASE], capture_output=True).returncode:
        sys.exit(f"{BASE} is missing: run `make deps` (deploy/docker-prepare.sh --all)")


def build_image(root):
    """Builds the top-level Dockerfile as IMAGE with no network (its package layers come
    from `make deps`; an unchanged tree is a cache hit). Returns the seconds taken."""
    started = time.monotonic()
    docker("build", "--network", "none", "-t", IMAGE, root, timeout=1200)
    return time.monotonic() - started


def wait_for_log_line(container, pattern, timeout_s=120, poll_s=0.2):
    """Waits until the container's output has a line matching `pattern` (or it exits)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = docker("logs", container) + "\n"
        match = re.search(pattern, logs, re.MULTILINE)
        if match:
            return match
        state = docker("inspect", "-f", "{{.State.Running}}", container)
        if state != "true":
            raise AssertionError(f"container exited before '{pattern}':\n{logs}")
        time.sleep(poll_s)
    raise AssertionError(f"no '{pattern}' in the container's output after {timeout_s} s")


def http_get(url, timeout=10):
    """(status, body) of a GET; raises OSError (URLError) while nothing answers."""
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return reply.status, reply.read().decode()
