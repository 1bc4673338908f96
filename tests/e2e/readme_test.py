#!/usr/bin/python3
"""Runs the README's snippets as a reader copies them: every fenced block preceded by a
`<!-- readme_test -->` line, in order, verbatim, in one scratch folder laid out like a
checkout (the README's, then those of docs/api.md and docs/models.md, each page from a
fresh quick-start server). A block fails the test if any of its commands fails.

Nothing in a block is rewritten. What the test does around them:
- it runs in a network namespace of its own (tests/e2e/in_netns.sh), so the server
  listens on the default ports the blocks name (:50051, :8000, :8080) beside anything
  else on this machine;
- a `make run [ARGS="..."]` line, the quick start's terminal 1, (re)starts the binary
  `make run` runs with those flags in the background, as a second terminal would have
  it; the Makefile's `run` target must build every binary the README calls
  (checked: the quick start once called an attnctl that `make run` had not built);
- the scratch folder holds the checkout's Makefile, deploy/, proto/ and client/, and a
  build/ whose client/, server/ and venv/ are this build's and this test's virtualenv
  (a sanitizer build folder has no venv of its own), so paths read as from a checkout
  after `make run` and `make client`;
- a Python block runs with the interpreter its first line names (`# build/venv/bin/python`,
  optionally with environment settings before it): a block that names none fails.

usage: in_netns.sh python3 readme_test.py REPO_ROOT BUILD_DIR
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
# A Python block's first line: "# [VAR=value ...] path/to/python".
INTERPRETER = re.compile(r"#\s*((?:\w+=\S+\s+)*\S*python3?)\s*$")
# What `make run` serves on (the server's own defaults), in this namespace.
DEFAULT_PORTS = ["--port=50051", "--http_port=8000", "--metrics_port=8080",
                 "--host=0.0.0.0", "--metrics_host=0.0.0.0"]


def tested_blocks(text):
    """(language, code, line) of each block right after a marker line."""
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
        for name in ("Makefile", "deploy", "proto", "client"):
            os.symlink(os.path.join(ROOT, name), os.path.join(cwd, name))
        os.mkdir(os.path.join(cwd, "build"))
        for name, target in (("client", os.path.join(BUILD, "client")),
                             ("server", os.path.join(BUILD, "server")),
                             ("venv", sys.prefix)):
            os.symlink(target, os.path.join(cwd, "build", name))
        cls.server = None

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop() if cls.server is not None else 0
        cls.dir.cleanup()
        assert code == 0, f"attnserve exited with {code}"

    @classmethod
    def make_run(cls, args):
        """What `make run ARGS=...` starts, replacing the running server (Ctrl-C)."""
        if cls.server is not None:
            assert cls.server.stop() == 0
        cls.server = stubs.Attnserve(os.path.join(BUILD, "server", "attnserve"),
                                     *DEFAULT_PORTS, *args, metrics=True, http=True,
                                     cwd=cls.dir.name)

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
        result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", "\n".join(lines)],
                                cwd=self.dir.name, capture_output=True, text=True,
                                timeout=300)
        self.assertEqual(result.returncode, 0,
                         f"{where}:\n{chr(10).join(lines)}\n{result.stderr}")
        return result.stdout

    def run_python(self, code, where):
        first = code.splitlines()[0] if code else ""
        match = INTERPRETER.fullmatch(first.strip())
        self.assertIsNotNone(match, f"{where}: a Python block's first line must name its "
                             f"interpreter (# build/venv/bin/python), got {first!r}")
        result = subprocess.run(["bash", "-c", f"{match.group(1)} -"], input=code,
                                cwd=self.dir.name, capture_output=True, text=True,
                                timeout=300)
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
