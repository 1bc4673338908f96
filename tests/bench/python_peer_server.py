#!/usr/bin/python3
"""The Python peer for `make bench-server`: a plain grpcio server around one
multi-head attention layer (d=512, h=8, eval, inference mode, one compute thread) behind
attnserve's own proto, one request at a time per worker thread, no batching. This is
what a team would write without attnserve; attnbench drives it exactly like attnserve.

Backends (--backend), the ones users deploy today:
- torch-mha: PyTorch's nn.MultiheadAttention (its fast path);
- torch-sdpa: the same projections around F.scaled_dot_product_attention;
- ort: ONNX Runtime on the same module exported by torch.onnx (graph optimizations on).
  The exporter bakes the example's shape into the graph, so it serves L=128 only (what
  the bench sends) and refuses other lengths.

usage: python_peer_server.py REPO_ROOT [--port 0] [--threads 16] [--backend torch-mha]
Prints "python peer LIBRARY VERSION (BACKEND) listening on 127.0.0.1:PORT" once
serving; stops on SIGTERM. Run it with the tuned malloc environment that
tests/bench/server_bench.py sets (see the core benchmark).
"""
import argparse
import os
import signal
import sys
import tempfile
import threading
from concurrent import futures

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import stubs  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_mha  # noqa: E402

ORT_LENGTH = 128


def make_layer(backend, folder):
    """A function [1, L, 512] float32 array -> the same shape, and what it runs."""
    torch.set_num_threads(1)
    torch_mha.bound_blas_threads(1)  # Debian's PyTorch 1.13: OpenBLAS's own pool
    if backend == "ort":
        import onnxruntime
        session = torch_mha.ort_sessions(1, ORT_LENGTH, 512, 8, [1], folder)[1]

        def run_ort(x):
            if x.shape[1] != ORT_LENGTH:
                raise ValueError(f"this ONNX export serves L={ORT_LENGTH} only")
            return session.run(None, {"x": x})[0]
        return run_ort, f"ONNX Runtime {onnxruntime.__version__} ({backend})"
    mha = torch_mha.module(512, 8)
    # Both take the [1, L, 512] batch and return the same shape.
    layer = (torch_mha.SelfAttention(mha) if backend == "torch-mha"
             else torch_mha.SdpaAttention(mha))

    def run_torch(x):
        with torch.inference_mode():
            return layer(torch.from_numpy(x)).numpy()
    return run_torch, f"PyTorch {torch.__version__} ({backend})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--backend", choices=["torch-mha", "torch-sdpa", "ort"],
                        default="torch-mha")
    args = parser.parse_args()
    export_dir = tempfile.TemporaryDirectory()
    layer, name = make_layer(args.backend, export_dir.name)
    stub_dir = stubs.generate_stubs(args.root)  # noqa: F841 (kept alive)
    import grpc
    from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2

    class Peer(attention_pb2_grpc.AttentionServiceServicer):
        def Attend(self, request, context):
            query = request.query
            if query.dtype != tensor_pb2.DATA_TYPE_FP32 or list(query.shape)[-1] != 512:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "fp32 [L, 512] only")
            x = np.frombuffer(query.raw, dtype="<f4").reshape(1, -1, 512).copy()
            try:
                y = layer(x)
            except ValueError as error:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            return attention_pb2.AttendResponse(
                output=tensor_pb2.Tensor(dtype=tensor_pb2.DATA_TYPE_FP32,
                                         shape=list(query.shape),
                                         raw=y.astype("<f4").tobytes()),
                model="torch-peer", batch_size=1)

        def GetModel(self, request, context):
            return attention_pb2.GetModelResponse(model=attention_pb2.ModelInfo(
                name="torch-peer", d_model=512, num_heads=8, max_sequence_length=8192))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.threads),
                         options=[("grpc.max_receive_message_length", 64 << 20),
                                  ("grpc.max_send_message_length", 64 << 20)])
    attention_pb2_grpc.add_AttentionServiceServicer_to_server(Peer(), server)
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    print(f"python peer {name} listening on 127.0.0.1:{port}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    server.stop(grace=5).wait()


if __name__ == "__main__":
    main()
