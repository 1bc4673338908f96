#!/usr/bin/python3
"""Runs the README's snippets against real processes: every fenced block preceded by a
`<!-- readme_test -->` line, in order, in one scratch folder (the README's, then those of
docs/api.md and docs/models.md, each page from a fresh quick-start server), against an
attnserve on 127.0.0.1 (free ports). A block fails the test if any of its commands fails.

What is changed before running, and nothing else:
- a `make run [ARGS="..."]` line (re)starts the binary `make run` runs, with those
  flags and free ports, in the scratch folder (so `--model_repository=models` means the
  folder an earlier snippet wrote); the Makefile's `run` target must build every binary
  the README calls before its first `make deps` (checked: the quick start used to call
  an attnctl that `make run` had not built);
- `localhost:50051` / `localhost:8080` / `localhost:8000` (and the Kubernetes DNS
  target) become the server's real addresses, and `attnctl` gets `--target` when a line
  has none;
- `attnctl` and `build/...` resolve to this build, and `build/venv/` to the venv this
  test runs in (a sanitizer build folder has none of its own); `proto`, `client` and `build` in the
  scratch folder link to the repository's, so the paths read as from a checkout.
The inputs the snippets name (x.npy, encoder.pt) are made first.

usage: readme_test.py REPO_ROOT BUILD_DIR
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT, BUILD = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import stubs  # noqa: E402

MARKER = "<!-- readme_test -->"


def tested_blocks(text):
    """(language, code) of each block right after a marker line."""
    blocks = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        fence = lines[i + 1]
        match = re.fullmatch(r"```(\w+)", fence.strip())
        if not match:
            raise AssertionError(f"README line {i + 2}: a marker must precede a fenced block")
        end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
        blocks.append((match.group(1), "\n".join(lines[i + 2:end]), i + 2))
    return blocks


class ReadmeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cwd = cls.dir.name
        for name, target in (("proto", os.path.join(ROOT, "proto")),
                             ("client", os.path.join(ROOT, "client")), ("build", BUILD)):
            os.symlink(target, os.path.join(cwd, name))
        cls.make_inputs(cwd)
        cls.server = None

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop() if cls.server is not None else 0
        cls.dir.cleanup()
        assert code == 0, f"attnserve exited with {code}"

    @classmethod
    def make_run(cls, args):
        """What `make run ARGS=...` does, on free ports, replacing the running server."""
        if cls.server is not None:
            assert cls.server.stop() == 0
        cls.server = stubs.Attnserve(os.path.join(BUILD, "server", "attnserve"), *args,
                                     metrics=True, http=True, cwd=cls.dir.name)

    @staticmethod
    def make_inputs(cwd):
        script = """
import numpy as np, torch
np.save("x.npy", np.random.default_rng(0).uniform(-1, 1, (3, 512)).astype("<f4"))
torch.save(torch.nn.MultiheadAttention(64, 4), "mha.pt")
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(64, 8), num_layers=4)
torch.save(Model().state_dict(), "encoder.pt")
"""
        subprocess.run(["/usr/bin/python3", "-c", script], cwd=cwd, check=True, timeout=120)

    def rewrite(self, line):
        target = self.server.target
        metrics = f"127.0.0.1:{self.server.metrics_port}"
        http = f"127.0.0.1:{self.server.http_port}"
        line = line.replace("dns:///attnserve-headless:50051", target)
        line = line.replace("localhost:50051", target).replace("localhost:8080", metrics)
        line = line.replace("localhost:8000", http)
        # The project venv is where this test's Python runs, whatever the build folder.
        line = line.replace("build/venv/", os.path.dirname(os.path.dirname(sys.executable)) + "/")
        match = re.match(r"(\s*)(build/client/attnctl|attnctl)(\s)", line)
        if match:
            binary = os.path.join(BUILD, "client", "attnctl")
            extra = "" if "--target=" in line else f" --target={target}"
            line = match.group(1) + binary + extra + line[match.end(2):]
        return line

    def run_sh(self, code, where):
        script = []
        for line in code.replace("\\\n", " ").splitlines():
            run = re.match(r"\s*make run\b(?:\s+ARGS=\"([^\"]*)\")?", line)
            if run:
                if script:
                    self.run_script(script, where)
                    script = []
                self.make_run((run.group(1) or "").split())
                continue
            script.append(line)
        return self.run_script(script, where)

    def run_script(self, lines, where):
        script = [self.rewrite(line) for line in lines]
        result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", "\n".join(script)],
                                cwd=self.dir.name, capture_output=True, text=True,
                                timeout=300)
        self.assertEqual(result.returncode, 0,
                         f"{where}:\n{chr(10).join(script)}\n{result.stderr}")
        return result.stdout

    def run_python(self, code, where):
        env = dict(os.environ, PYTHONPATH=os.path.join(self.dir.name, "stubs"))
        result = subprocess.run([sys.executable, "-c", self.rewrite(code)],
                                cwd=self.dir.name, capture_output=True, text=True,
                                timeout=300, env=env)
        self.assertEqual(result.returncode, 0, f"{where}:\n{result.stderr}")
        return result.stdout

    def test_make_run_builds_what_the_quick_start_calls(self):
        with open(os.path.join(ROOT, "Makefile")) as makefile:
            targets = re.search(r"^RUN_TARGETS := (.*)$", makefile.read(), re.M).group(1)
        with open(os.path.join(ROOT, "README.md")) as readme:
            _, quick_start, _ = tested_blocks(readme.read())[0]
        used = set(re.findall(r"build/\w+/(\w+)", quick_start))
        self.assertTrue(used, "the quick start calls no built binary")
        self.assertLessEqual(used, set(targets.split()),
                             f"the quick start calls {sorted(used)}; make run builds {targets}")

    def test_snippets(self):
        blocks = []
        for page in ("README.md", "docs/api.md", "docs/models.md"):
            with open(os.path.join(ROOT, page)) as text:
                blocks += [(page, *block) for block in tested_blocks(text.read())]
        self.assertGreaterEqual(len(blocks), 10, "the marked blocks went missing")
        self.assertEqual(blocks[0][2].split()[:2], ["make", "run"],
                         "the README's first tested line must start the server")
        outputs = []
        page_started = None
        for page, language, code, where in blocks:
            if page != page_started and page != "README.md":
                # Each page in docs/ starts from the quick start's server.
                self.make_run([])
            page_started = page
            with self.subTest(page=page, line=where):
                print(f"{page} line {where}: {language}", flush=True)
                if language == "sh":
                    outputs.append(self.run_sh(code, f"{page}:{where}"))
                elif language == "python":
                    outputs.append(self.run_python(code, f"{page}:{where}"))
                else:
                    self.fail(f"{page} line {where}: no runner for {language}")
        text = "\n".join(outputs)
        # What the quick start and the calls promise to show.
        self.assertIn("SERVING", text)
        self.assertRegex(text, r"attnserve_requests_total\{[^}]*code=\"OK\"")
        self.assertIn("output_shape=[16, 512]", text)
        self.assertIn('"model_name":"mha-base"', text)
        self.assertIn("(16, 512)", text)
        self.assertIn("output_shape=[8, 64]", text)
        self.assertIn("(8, 64)", text)

if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
