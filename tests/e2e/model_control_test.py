"""Models loaded, replaced and unloaded while attnserve serves, through the ecosystem's
own clients: tritonclient's load_model / unload_model over KServe gRPC, the HTTP
repository endpoints, and a repository folder followed by polling.

- A model's version is replaced 5 times while 2 clients send at about 80% of what the
  server answers: no call fails, and every answer equals (to 1e-4) a naive fp64
  attention over the weights of the version the answer names: old or new, never a mix.
- Unloading frees the model's memory: the server's RSS comes back within 10% of before.
- Polling loads a folder renamed into place, a new version, and unloads a removed one.

- attnctl's repository, load and unload commands.

usage: model_control_test.py ATTNSERVE_BINARY REPO_ROOT ATTNCTL_BINARY
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stubs  # noqa: E402

SERVER, ATTNCTL = sys.argv[1], sys.argv[3]
# A sanitizer's allocator keeps freed memory in quarantine: RSS says nothing there.
SANITIZERS = os.environ.get("ATTNSERVE_SANITIZERS", "")
D, HEADS, LENGTH = 64, 4, 16


def write_weights(path, seed, d=D):
    """A PyTorch-named attention module's weights (F32 safetensors) from `seed`."""
    rng = np.random.default_rng(seed)
    tensors = {
        "in_proj_weight": rng.normal(0, d ** -0.5, (3 * d, d)),
        "in_proj_bias": rng.normal(0, 0.1, 3 * d),
        "out_proj.weight": rng.normal(0, d ** -0.5, (d, d)),
        "out_proj.bias": rng.normal(0, 0.1, d),
    }
    header, blobs, offset = {}, [], 0
    for name, values in tensors.items():
        blob = values.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(values.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as out:
        out.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))
    return {name: values.astype(np.float32).astype(np.float64)
            for name, values in tensors.items()}


def attention(weights, x, heads=HEADS):
    """softmax(Q K^T / sqrt(d/h)) V per head, concatenated, through W_out (fp64)."""
    x = x.astype(np.float64)
    d = x.shape[1]
    qkv = x @ weights["in_proj_weight"].T + weights["in_proj_bias"]
    q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(-1, heads, d // heads).transpose(1, 0, 2)
               for i in range(3))
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(d // heads)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    context = (scores / scores.sum(axis=-1, keepdims=True)) @ v
    context = context.transpose(1, 0, 2).reshape(-1, d)
    return context @ weights["out_proj.weight"].T + weights["out_proj.bias"]


def stage_version(repository, model, version, seed):
    """Writes version `version` of `model` beside the repository and renames it into
    place, so that the server never sees a half-written file."""
    staging = os.path.join(repository, f".staging-{model}-{version}")
    weights = write_weights(os.path.join(staging, "weights.safetensors"), seed)
    os.rename(staging, os.path.join(repository, model, str(version)))
    return weights


def infer(client, model, query):
    inputs = [triton.InferInput("query", list(query.shape), "FP32")]
    inputs[0].set_data_from_numpy(query)
    result = client.infer(model, inputs)
    return result.get_response().model_version, result.as_numpy("output")


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as status:
        return int(re.search(r"VmRSS:\s+(\d+) kB", status.read()).group(1)) * 1024


def await_true(condition, what, timeout=120):
    """Waits for `condition()` (an event the server makes visible), failing after
    `timeout` seconds."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class ExplicitControlTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repository = tempfile.TemporaryDirectory()
        root = cls.repository.name
        os.makedirs(os.path.join(root, "swap"))
        with open(os.path.join(root, "swap", "config.pbtxt"), "w") as config:
            config.write(f"d_model: {D}\nnum_heads: {HEADS}\n"
                         "batching { max_queue_delay_us: 500 }\n")
        cls.weights = {1: stage_version(root, "swap", 1, seed=1)}
        for name, d in (("big", 1024), ("ctl", 64)):
            os.makedirs(os.path.join(root, name))
            with open(os.path.join(root, name, "config.pbtxt"), "w") as config:
                config.write(f"d_model: {d}\nnum_heads: 8\ngenerated_weights: true\n")
        cls.log = tempfile.NamedTemporaryFile(suffix=".log")
        cls.server = stubs.Attnserve(SERVER, f"--model_repository={root}",
                                     "--model_control_mode=explicit",
                                     "--builtin_model=false", http=True,
                                     stderr=cls.log.name)
        cls.http = f"http://127.0.0.1:{cls.server.http_port}"

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0
        cls.repository.cleanup()

    def post(self, path, body=None):
        request = urllib.request.Request(
            self.http + path, method="POST",
            data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def log_count(self, line):
        with open(self.log.name) as log:
            return log.read().count(line)

    def await_log(self, line, count=1):
        await_true(lambda: self.log_count(line) >= count, f"log line {line!r} x{count}")

    def test_versions_swap_under_load_with_no_failed_call_and_no_mixed_answer(self):
        query = np.random.default_rng(9).uniform(-1, 1, (LENGTH, D)).astype(np.float32)
        expected = {1: attention(self.weights[1], query)}
        admin = triton.InferenceServerClient(url=self.server.target)
        self.assertEqual(admin.get_model_metadata("swap").versions, ["1"])

        # What 2 closed-loop clients get answered, then pace each to 80% of it.
        def closed_loop(count, done):
            client = triton.InferenceServerClient(url=self.server.target)
            for _ in range(count):
                infer(client, "swap", query)
            done.append(count)
        done, start = [], time.monotonic()
        threads = [threading.Thread(target=closed_loop, args=(40, done)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        capacity = sum(done) / (time.monotonic() - start)
        interval = 2 / (0.8 * capacity)  # between one client's request starts

        lock = threading.Condition()
        seen, failures, mixed, answers = {}, [], [], [0]
        stop = threading.Event()

        def client_loop():
            client = triton.InferenceServerClient(url=self.server.target)
            next_start = time.monotonic()
            while not stop.is_set():
                try:
                    version, output = infer(client, "swap", query)
                except InferenceServerException as error:
                    failures.append(str(error))
                    continue
                with lock:
                    reference = expected.get(int(version))
                    if reference is None or np.abs(output - reference).max() > 1e-4:
                        mixed.append(version)
                    seen[int(version)] = seen.get(int(version), 0) + 1
                    answers[0] += 1
                    lock.notify_all()
                next_start += interval
                time.sleep(max(0.0, next_start - time.monotonic()))

        clients = [threading.Thread(target=client_loop) for _ in range(2)]
        for thread in clients:
            thread.start()
        try:
            for version in range(2, 7):
                weights = stage_version(self.repository.name, "swap", version, seed=version)
                with lock:
                    expected[version] = attention(weights, query)
                admin.load_model("swap")
                self.assertEqual(admin.get_model_metadata("swap").versions, [str(version)])
                with lock:  # the clients' next answers come from the new version
                    self.assertTrue(lock.wait_for(lambda: seen.get(version, 0) >= 10,
                                                  timeout=120))
        finally:
            stop.set()
            for thread in clients:
                thread.join()
        print(f"\n{answers[0]} answers at {0.8 * capacity:.0f}/s (capacity "
              f"{capacity:.0f}/s), answers per version {sorted(seen.items())}",
              file=sys.stderr)
        self.assertEqual(failures, [])
        self.assertEqual(mixed, [])
        self.assertEqual(sorted(seen), [1, 2, 3, 4, 5, 6])
        for version in range(1, 6):
            self.await_log(f"event=model_freed model=swap version={version}\n")

    def test_http_repository_endpoints_and_unload_frees_the_memory(self):
        status, index = self.post("/v2/repository/index")
        self.assertEqual(status, 200)
        self.assertIn({"name": "big", "version": "1", "state": "READY"}, index)
        # Unloaded: refused by name, listed as unavailable, and its memory goes.
        freed = "event=model_freed model=big version=1\n"
        self.assertEqual(self.post("/v2/repository/models/big/unload"), (200, {}))
        self.await_log(freed, 1)
        admin = triton.InferenceServerClient(url=self.server.target)
        with self.assertRaises(InferenceServerException) as refused:
            infer(admin, "big", np.zeros((4, 1024), np.float32))
        self.assertIn("not served", str(refused.exception))
        status, index = self.post("/v2/repository/index", {"ready": False})
        self.assertIn({"name": "big", "version": "1", "state": "UNAVAILABLE",
                       "reason": "unloaded"}, index)
        status, ready = self.post("/v2/repository/index", {"ready": True})
        self.assertNotIn("big", [row["name"] for row in ready])

        before = rss_bytes(self.server.process.pid)
        # Loaded again, with a config given in the request.
        config = json.dumps({"d_model": 1024, "num_heads": 8, "generated_weights": True,
                             "seed": 4, "precision": "PRECISION_FP32"})
        self.assertEqual(self.post("/v2/repository/models/big/load",
                                   {"parameters": {"config": config}}), (200, {}))
        infer(admin, "big", np.ones((128, 1024), np.float32))
        loaded = rss_bytes(self.server.process.pid)
        self.assertEqual(self.post("/v2/repository/models/big/unload"), (200, {}))
        self.await_log(freed, 2)
        after = rss_bytes(self.server.process.pid)
        print(f"\nRSS before {before >> 20} MiB, loaded {loaded >> 20} MiB, after unload "
              f"{after >> 20} MiB", file=sys.stderr)
        if SANITIZERS:
            print(f"RSS not checked: built with {SANITIZERS}", file=sys.stderr)
        else:
            self.assertGreater(loaded - before, 16 << 20)  # at least the fp32 weights
            self.assertLess(after, before * 1.10)
        # Malformed requests name their field; the server keeps serving.
        for path, body, field in [
                ("/v2/repository/models/big/load", {"parameters": {"config": 7}},
                 "parameters.config"),
                ("/v2/repository/models/big/load", {"parameters": {"other": "x"}},
                 "unknown parameter"),
                ("/v2/repository/models/big/load", {"parameters": {"config": "{"}},
                 "config is not a ModelConfig in JSON"),
                ("/v2/repository/models/big/load", [1], "JSON object"),
                ("/v2/repository/models/big/unload", {"parameters": {"config": "{}"}},
                 "unload takes: unload_dependents"),
                ("/v2/repository/index", {"ready": "yes"}, "ready must be a boolean"),
                ("/v2/repository/models/.hidden/load", None, "must name a folder")]:
            status, body = self.post(path, body)
            self.assertEqual(status, 400, path)
            self.assertIn(field, body["error"])
        status, body = self.post("/v2/repository/models/nope/load")
        self.assertEqual(status, 404)
        self.assertIn("has no folder", body["error"])
        self.assertEqual(infer(admin, "swap", np.zeros((2, D), np.float32))[1].shape,
                         (2, D))


    def test_attnctl_lists_loads_and_unloads(self):
        def attnctl(*args):
            return subprocess.run([ATTNCTL, f"--target={self.server.target}", *args],
                                  capture_output=True, text=True, timeout=120)
        listed = attnctl("repository")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertRegex(listed.stdout, r"swap\s+\d+\s+READY")
        self.assertEqual(attnctl("unload", "ctl").stdout, "ctl: unloaded\n")
        self.assertRegex(attnctl("repository").stdout, r"ctl\s+1\s+UNAVAILABLE\s+unloaded")
        loaded = attnctl("load", "ctl", '--config={"d_model": 256, "num_heads": 4, '
                                        '"generated_weights": true}')
        self.assertEqual(loaded.stdout, "ctl: loaded\n", loaded.stderr)
        self.assertIn("d_model: 256", attnctl("model", "ctl").stdout)
        refused = attnctl("load", "nope")
        self.assertEqual(refused.returncode, 1)
        self.assertIn("NOT_FOUND", refused.stderr)


class PollControlTest(unittest.TestCase):
    def test_the_server_follows_the_repository_folder(self):
        with tempfile.TemporaryDirectory() as root:
            server = stubs.Attnserve(SERVER, f"--model_repository={root}",
                                     "--model_control_mode=poll",
                                     "--repository_poll_interval=50ms",
                                     "--builtin_model=false")
            try:
                client = triton.InferenceServerClient(url=server.target)
                query = np.random.default_rng(3).uniform(-1, 1, (5, D)).astype(np.float32)
                # A model folder renamed into place is loaded.
                staging = os.path.join(root, ".staging")
                with_weights = write_weights(os.path.join(staging, "weights.safetensors"), 1)
                with open(os.path.join(staging, "config.pbtxt"), "w") as config:
                    config.write(f"d_model: {D}\nnum_heads: {HEADS}\n")
                os.rename(staging, os.path.join(root, "polled"))
                await_true(lambda: client.is_model_ready("polled"), "polled to load")
                version, output = infer(client, "polled", query)
                self.assertEqual(version, "1")
                np.testing.assert_allclose(output, attention(with_weights, query), atol=1e-4)
                # A new version folder replaces it.
                weights = stage_version(root, "polled", 2, seed=2)
                await_true(lambda: client.get_model_metadata("polled").versions == ["2"],
                           "version 2 to load")
                version, output = infer(client, "polled", query)
                self.assertEqual(version, "2")
                np.testing.assert_allclose(output, attention(weights, query), atol=1e-4)
                # The API's loads are refused: the folder decides.
                with self.assertRaises(InferenceServerException) as refused:
                    client.load_model("polled")
                self.assertIn("--model_control_mode=explicit", str(refused.exception))
                # A removed folder is unloaded.
                os.rename(os.path.join(root, "polled"), os.path.join(root, ".gone"))
                await_true(lambda: not client.is_model_ready("polled"), "polled to unload")
            finally:
                self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
