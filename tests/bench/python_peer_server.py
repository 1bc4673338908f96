#!/usr/bin/python3
"""The Python peer for `make bench-server`: a plain grpcio server running PyTorch's
nn.MultiheadAttention (d=512, h=8, eval, inference mode) behind attnserve's own proto,
one request at a time per worker thread, no batching. This is what a team would write
without attnserve; attnbench drives it exactly like attnserve.

usage: python_peer_server.py REPO_ROOT [--port 0] [--threads 16]
Prints "python peer listening on 127.0.0.1:PORT" once serving; stops on SIGTERM.
Run it with OpenBLAS (libopenblas0-pthread) and the tuned malloc environment that
tests/bench/server_bench.py sets (see the core benchmark).
"""
import argparse
import os
import signal
import sys
import threading
from concurrent import futures

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import stubs  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()
    stub_dir = stubs.generate_stubs(args.root)  # noqa: F841 (kept alive)
    import grpc
    from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2

    torch.set_num_threads(1)
    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(512, 8, batch_first=True).eval()

    class Peer(attention_pb2_grpc.AttentionServiceServicer):
        def Attend(self, request, context):
            query = request.query
            if query.dtype != tensor_pb2.DATA_TYPE_FP32 or list(query.shape)[-1] != 512:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "fp32 [L, 512] only")
            x = torch.from_numpy(
                np.frombuffer(query.raw, dtype="<f4").reshape(1, -1, 512).copy())
            with torch.inference_mode():
                y, _ = module(x, x, x, need_weights=False)
            return attention_pb2.AttendResponse(
                output=tensor_pb2.Tensor(dtype=tensor_pb2.DATA_TYPE_FP32,
                                         shape=list(query.shape),
                                         raw=y.numpy().astype("<f4").tobytes()),
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
    print(f"python peer listening on 127.0.0.1:{port}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    server.stop(grace=5).wait()


if __name__ == "__main__":
    main()
