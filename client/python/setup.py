"""Builds the package with its gRPC stubs generated from ../../proto (or
$ATTNSERVE_PROTO_DIR) by grpc_tools, so that `pip install client/python` is all a user
runs. Needs grpcio-tools at build time (Debian: python3-grpc-tools). The stubs are
generated before setuptools looks for the attnserve.v1 package (metadata needs it)."""
import os

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = ["attnserve/v1/tensor.proto", "attnserve/v1/attention.proto"]


def generate_stubs():
    from grpc_tools import protoc
    proto_dir = os.environ.get("ATTNSERVE_PROTO_DIR", os.path.join(HERE, "..", "..", "proto"))
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    os.makedirs(os.path.join(HERE, "attnserve", "v1"), exist_ok=True)
    open(os.path.join(HERE, "attnserve", "v1", "__init__.py"), "a").close()
    code = protoc.main(["protoc", f"-I{proto_dir}", f"-I{include}", f"--python_out={HERE}",
                        f"--grpc_python_out={HERE}", *PROTOS])
    if code != 0:
        raise RuntimeError(f"protoc failed on {PROTOS} in {proto_dir}")


generate_stubs()
setup()
