"""Writes the fuzzers' seed corpora under tests/fuzz/corpus/ (checked in): a few valid
inputs of each format, so the fuzzers start from the interesting paths.

usage: build/venv/bin/python tests/fuzz/make_seeds.py REPO_ROOT
"""
import io
import json
import os
import struct
import sys

import numpy as np

ROOT = sys.argv[1]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import stubs  # noqa: E402

OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")


def write(kind, name, data):
    os.makedirs(os.path.join(OUT, kind), exist_ok=True)
    with open(os.path.join(OUT, kind, name), "wb") as f:
        f.write(data)


def requests():
    keep = stubs.generate_stubs(ROOT)  # noqa: F841 (kept alive while used)
    from attnserve.v1 import attention_pb2, tensor_pb2
    rng = np.random.default_rng(0)

    def tensor(shape, dtype="fp32"):
        values = rng.uniform(-1, 1, shape).astype("<f4")
        if dtype == "bf16":
            raw = (values.view("<u4") >> 16).astype("<u2").tobytes()
            return tensor_pb2.Tensor(dtype=tensor_pb2.DATA_TYPE_BF16, shape=shape, raw=raw)
        return tensor_pb2.Tensor(dtype=tensor_pb2.DATA_TYPE_FP32, shape=shape,
                                 raw=values.tobytes())

    seeds = {
        "self": attention_pb2.AttendRequest(query=tensor([3, 8])),
        "batch_causal_mask": attention_pb2.AttendRequest(
            query=tensor([2, 4, 8]), causal=True, head_mask=[1.0, 0.0],
            return_attention=True, request_id="r1"),
        "cross_bf16": attention_pb2.AttendRequest(
            query=tensor([2, 8], "bf16"), memory=tensor([5, 8], "bf16")),
    }
    for name, message in seeds.items():
        write("request", name, message.SerializeToString())


def safetensors():
    def file(tensors):
        header, data = {"__metadata__": {"format": "pt"}}, b""
        for name, array in tensors.items():
            raw = array.astype("<f4").tobytes()
            header[name] = {"dtype": "F32", "shape": list(array.shape),
                            "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text + data

    d = 8
    write("safetensors", "mha_d8", file({
        "in_proj_weight": np.ones((3 * d, d)), "in_proj_bias": np.zeros(3 * d),
        "out_proj.weight": np.eye(d), "out_proj.bias": np.zeros(d)}))
    write("safetensors", "empty", file({}))


def configs():
    write("model_config", "full", b'name: "fuzz-model"\nd_model: 64\nnum_heads: 4\n'
          b'max_sequence_length: 128\nprecision: PRECISION_FP32\n'
          b'batching { max_batch_size: 8 max_queue_delay_us: 1000 }\n')
    write("model_config", "generated", b"d_model: 8 num_heads: 2 generated_weights: true "
          b"seed: 3\n")


def npys():
    for name, array in {"matrix": np.ones((2, 3), "<f4"),
                        "batch": np.arange(24, dtype="<f4").reshape(2, 3, 4)}.items():
        buffer = io.BytesIO()
        np.save(buffer, array)
        write("npy", name, buffer.getvalue())


if __name__ == "__main__":
    requests()
    safetensors()
    configs()
    npys()
