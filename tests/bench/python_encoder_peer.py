#!/usr/bin/env python3
"""The Python peer for `make bench-encoder`: a plain grpcio server answering attnserve's
own Encode RPC with the faster of ONNX Runtime (the exported model, graph optimizations
on) and sentence-transformers (PyTorch 2.x), one request at a time per worker thread,
no batching: what a team would write around the model without attnserve. Text comes in
as EncodeRequest.text and goes through Hugging Face's `tokenizers` (the model's
tokenizer.json, cut at 256 tokens as sentence-transformers does), texts of one request
padded together.

usage: python_encoder_peer.py REPO_ROOT MODEL_DIR ONNX_FILE --engine ort|torch
       [--port 0] [--threads 16]
Prints "python peer listening on 127.0.0.1:PORT" once serving; stops on SIGTERM.
"""
import argparse
import os
import signal
import sys
import threading
from concurrent import futures

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import stubs  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("model_dir")
    parser.add_argument("onnx")
    parser.add_argument("--engine", choices=("ort", "torch"), required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()
    stub_dir = stubs.generate_stubs(args.root)  # noqa: F841 (kept alive)
    import grpc
    from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2

    if args.engine == "ort":
        import onnxruntime
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(args.onnx, options,
                                               providers=["CPUExecutionProvider"])

        def embed(ids):
            return session.run(None, {"input_ids": ids,
                                      "attention_mask": np.ones_like(ids)})[0]
    else:
        import torch
        from sentence_transformers import SentenceTransformer
        torch.set_num_threads(1)
        model = SentenceTransformer(args.model_dir, device="cpu").eval()

        def embed(ids):
            ids = torch.from_numpy(ids)
            with torch.inference_mode():
                return model({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                              "token_type_ids": torch.zeros_like(ids)})[
                    "sentence_embedding"].numpy()

    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
    tokenizer.enable_truncation(256)
    tokenizer.no_padding()

    class Peer(attention_pb2_grpc.AttentionServiceServicer):
        def Encode(self, request, context):
            if request.text:
                encodings = tokenizer.encode_batch(list(request.text))
                longest = max(len(e.ids) for e in encodings)
                values = np.zeros((len(encodings), longest), dtype=np.int64)
                for i, e in enumerate(encodings):
                    values[i, :len(e.ids)] = e.ids
                if len(encodings) > 1:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "one text per request")
                embedding = embed(values).astype("<f4")
                return attention_pb2.EncodeResponse(
                    embedding=tensor_pb2.Tensor(dtype=tensor_pb2.DATA_TYPE_FP32,
                                                shape=list(embedding.shape),
                                                raw=embedding.tobytes()),
                    lengths=[longest], model="peer")
            ids = request.input_ids
            if ids.dtype != tensor_pb2.DATA_TYPE_INT64:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "INT64 input_ids only")
            values = np.frombuffer(ids.raw, dtype="<i8").reshape(1, -1)
            embedding = embed(values).astype("<f4")
            return attention_pb2.EncodeResponse(
                embedding=tensor_pb2.Tensor(dtype=tensor_pb2.DATA_TYPE_FP32,
                                            shape=list(embedding.shape),
                                            raw=embedding.tobytes()),
                lengths=[values.shape[1]], model="peer")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.threads))
    attention_pb2_grpc.add_AttentionServiceServicer_to_server(Peer(), server)
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    print(f"python peer listening on 127.0.0.1:{port}", flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    stopped.wait()
    server.stop(grace=1).wait()


if __name__ == "__main__":
    main()
