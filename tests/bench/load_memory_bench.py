#!/usr/bin/python3
"""Peak memory of attnserve loading and serving a big-vocabulary encoder: an
XLM-RoBERTa checkpoint of multilingual-e5-small's shape (250,002 x 384 embedding table,
12 layers of 384 with 12 heads, FFN 1536, 514 positions; about 118 M parameters, 96 M of
them the table), seeded values, written as fp32 safetensors into a temporary folder,
served at fp32 and at bf16.

For each precision: the server's peak resident memory (VmHWM) once it is listening
(every model loaded), and after 64 requests of mixed lengths; beside the checkpoint's
size and the weights' size at the precision's storage. The target: loading holds the
weights about once, not the file and the weights (peak after load <= weights + file/4 +
200 MiB of runtime and arenas).

usage: load_memory_bench.py BUILD_DIR REPO_ROOT
"""
import json
import os
import sys
import tempfile

import grpc
import numpy as np

BUILD, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import stubs  # noqa: E402
from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2  # noqa: E402
from host_info import cpu_description  # noqa: E402

VOCAB, D, LAYERS, HEADS, FFN, POSITIONS = 250002, 384, 12, 12, 1536, 514
MIB = 1 << 20


def checkpoint(folder):
    """Writes config.json and model.safetensors; returns the parameter count."""
    rng = np.random.default_rng(7)
    tensors = {}

    def add(name, *shape):
        tensors[name] = rng.standard_normal(shape, dtype=np.float32) * 0.05

    add("embeddings.word_embeddings.weight", VOCAB, D)
    add("embeddings.position_embeddings.weight", POSITIONS, D)
    add("embeddings.token_type_embeddings.weight", 1, D)
    add("embeddings.LayerNorm.weight", D)
    add("embeddings.LayerNorm.bias", D)
    for n in range(LAYERS):
        at = f"encoder.layer.{n}."
        for part in ("query", "key", "value"):
            add(at + f"attention.self.{part}.weight", D, D)
            add(at + f"attention.self.{part}.bias", D)
        add(at + "attention.output.dense.weight", D, D)
        add(at + "attention.output.dense.bias", D)
        add(at + "attention.output.LayerNorm.weight", D)
        add(at + "attention.output.LayerNorm.bias", D)
        add(at + "intermediate.dense.weight", FFN, D)
        add(at + "intermediate.dense.bias", FFN)
        add(at + "output.dense.weight", D, FFN)
        add(at + "output.dense.bias", D)
        add(at + "output.LayerNorm.weight", D)
        add(at + "output.LayerNorm.bias", D)
    stubs.write_safetensors(
        os.path.join(folder, "model.safetensors"),
        {name: ("F32", list(a.shape), a.tobytes()) for name, a in tensors.items()}, {})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "xlm-roberta", "hidden_size": D, "num_attention_heads": HEADS,
                   "num_hidden_layers": LAYERS, "intermediate_size": FFN,
                   "max_position_embeddings": POSITIONS, "vocab_size": VOCAB,
                   "type_vocab_size": 1, "pad_token_id": 1, "layer_norm_eps": 1e-5,
                   "hidden_act": "gelu"}, f)
    return sum(a.size for a in tensors.values())


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def main():
    print(f"# load memory: {cpu_description()}")
    server_binary = os.path.join(BUILD, "server", "attnserve")
    with tempfile.TemporaryDirectory() as repository:
        source = os.path.join(repository, "source")
        os.mkdir(source)
        params = checkpoint(source)
        file_bytes = os.path.getsize(os.path.join(source, "model.safetensors"))
        print(f"checkpoint: {params / 1e6:.1f} M parameters, {file_bytes / MIB:.0f} MiB "
              f"fp32 ({VOCAB * D / 1e6:.1f} M in the embedding table)")
        rows = []
        for precision, element in (("FP32", 4), ("BF16", 2)):
            models = os.path.join(repository, precision.lower())
            os.mkdir(models)
            folder = os.path.join(models, "e5")
            os.mkdir(folder)
            for name in ("config.json", "model.safetensors"):
                os.symlink(os.path.join(source, name), os.path.join(folder, name))
            with open(os.path.join(folder, "config.pbtxt"), "w") as f:
                f.write(f"precision: PRECISION_{precision}\nencoder {{ pooling: POOLING_MEAN }}\n")
            server = stubs.Attnserve(server_binary, f"--model_repository={models}",
                                     "--model_control_mode=explicit",
                                     "--builtin_model=false", "--max_queue_delay=1ms",
                                     "--intra_op_threads=1")
            pid = server.process.pid
            loaded = status_kib(pid, "VmHWM") * 1024
            channel = grpc.insecure_channel(server.target)
            stub = attention_pb2_grpc.AttentionServiceStub(channel)
            rng = np.random.default_rng(1)
            for i in range(64):
                length = int(rng.integers(8, 256))
                ids = rng.integers(5, VOCAB, size=(1, length)).astype("<i8")
                stub.Encode(attention_pb2.EncodeRequest(
                    model="e5", input_ids=tensor_pb2.Tensor(
                        dtype=tensor_pb2.DATA_TYPE_INT64, shape=[1, length],
                        raw=ids.tobytes())), timeout=120)
            served = status_kib(pid, "VmHWM") * 1024
            rss = status_kib(pid, "VmRSS") * 1024
            channel.close()
            assert server.stop() == 0
            # Every weight at the precision (a bf16 model keeps its table in bf16 too).
            weights = params * element
            rows.append((precision, weights, loaded, served, rss))
        target_note = "peak after load <= weights + file/4 + 200 MiB"
        print(f"| precision | weights (MiB) | peak after load (MiB) | peak after 64 requests "
              f"(MiB) | resident then (MiB) | target: {target_note} |")
        print("| --- | --- | --- | --- | --- | --- |")
        for precision, weights, loaded, served, rss in rows:
            bound = weights + file_bytes / 4 + 200 * MIB
            verdict = "PASS" if loaded <= bound else "FAIL"
            print(f"| {precision} | {weights / MIB:.0f} | {loaded / MIB:.0f} | "
                  f"{served / MIB:.0f} | {rss / MIB:.0f} | <= {bound / MIB:.0f} "
                  f"({verdict}) |")


if __name__ == "__main__":
    main()
