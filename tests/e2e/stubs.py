"""Shared helpers of the Python end-to-end tests: Python stubs generated from proto/
at test time (grpc_tools from Debian's python3-grpc-tools), and a running attnserve."""
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile


def post_json(url, body, timeout=60, headers=None):
    """(HTTP status, parsed JSON answer) of a POST of `body` (bytes as they are, or a
    JSON value) to `url` with `headers`; an HTTP error status is returned, not raised."""
    import json
    import urllib.error
    import urllib.request
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def get_json(url, timeout=60):
    """(HTTP status, parsed JSON answer) of a GET of `url`; an HTTP error status is
    returned, not raised."""
    import json
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def read_safetensors(path):
    """A safetensors file as (tensors, metadata): name -> (dtype, shape, raw bytes), in
    the file's order of names; metadata the header's __metadata__ (or None)."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    metadata = header.pop("__metadata__", None)
    tensors = {name: (entry["dtype"], list(entry["shape"]),
                      data[entry["data_offsets"][0]:entry["data_offsets"][1]])
               for name, entry in sorted(header.items())}
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None):
    """Writes `tensors` (name -> (dtype, shape, raw bytes)) as a safetensors file, in
    their order, the header padded to 8 bytes."""
    header, offset = {}, 0
    for name, (dtype, shape, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, blob in tensors.values():
            f.write(blob)


def generate_stubs(root):
    """Generates stubs for proto/ and tests/e2e/reflection.proto into a temporary folder,
    puts it on sys.path and returns the TemporaryDirectory (keep it alive)."""
    from grpc_tools import protoc
    out = tempfile.TemporaryDirectory()
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    for proto_dir, files in (
        (os.path.join(root, "proto"),
         ["attnserve/v1/tensor.proto", "attnserve/v1/attention.proto"]),
        (os.path.join(root, "tests", "e2e"), ["reflection.proto"]),
    ):
        code = protoc.main(["protoc", f"-I{proto_dir}", f"-I{include}",
                            f"--python_out={out.name}", f"--grpc_python_out={out.name}",
                            *files])
        if code != 0:
            raise RuntimeError(f"protoc failed for {files}")
    sys.path.insert(0, out.name)
    return out


class Attnserve:
    """attnserve on 127.0.0.1 with free ports; `target` and `metrics_port` are read from
    the lines it prints at start-up."""

    def __init__(self, binary, *flags, metrics=False, http=False, stderr=None, cwd=None):
        args = [binary, "--host=127.0.0.1", "--port=0", "--metrics_host=127.0.0.1",
                f"--metrics_port={0 if metrics else -1}",
                f"--http_port={0 if http else -1}", *flags]
        # `stderr`: a file to write the server's log to. Without one the log goes to a
        # temporary file whose tail is printed when the server ends badly, so that a
        # sanitizer report or a crash shows in the test's own output.
        self._log = None
        if stderr is None:
            self._log = tempfile.NamedTemporaryFile("w+", prefix="attnserve-",
                                                    suffix=".log")
            log_file = self._log
        else:
            log_file = open(stderr, "w")
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=cwd,
                                        stderr=log_file)
        line = self.process.stdout.readline()
        if "listening on" not in line:
            self.process.kill()
            self.process.wait()
            self.print_log_tail()
            raise RuntimeError(f"attnserve did not start: {line!r}")
        self.target = line.strip().rsplit(" ", 1)[1]
        self.metrics_port = None
        if metrics:
            self.metrics_port = int(self.process.stdout.readline().strip().rsplit(":", 1)[1])
        self.http_port = None
        if http:
            self.http_port = int(self.process.stdout.readline().strip().rsplit(":", 1)[1])

    def stop(self):
        """SIGTERM, then the exit code."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        self.process.stdout.close()
        if code != 0:
            self.print_log_tail()
        return code

    def print_log_tail(self, lines=200):
        """The end of the server's log on stderr, when this object holds it."""
        if self._log is None:
            return
        self._log.seek(0)
        tail = self._log.read().splitlines()[-lines:]
        print(f"--- attnserve log (last {len(tail)} lines) ---", file=sys.stderr)
        print("\n".join(tail), file=sys.stderr)
