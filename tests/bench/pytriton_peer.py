#!/usr/bin/env python3
"""A real Triton server (PyTriton's bundled Triton 2.51: its HTTP and gRPC doors, its
dynamic batcher, its python backend) serving all-MiniLM-L6-v2 as users deploy an
embedder on Triton without a GPU: the tokenizer of the model's folder, ONNX Runtime on
the fused export (model.onnx), mean pooling and L2 normalization, in the callable that
PyTriton binds. `make bench-servers` starts it as one of attnserve's peers.

Model `minilm`: input `text` BYTES [n, 1], output `embedding` FP32 [n, 384]; KServe v2
over HTTP and gRPC, as attnserve's KServe doors take them.

usage: python pytriton_peer.py ONNX_FOLDER HTTP_PORT GRPC_PORT THREADS
"""
import os
import sys

import numpy as np
import onnxruntime
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers_bench import st_tokenizer  # noqa: E402

# Triton's dynamic batcher: as large a batch as is queued, no added wait (Triton's
# default), up to 128 texts (a request of 32 and c64's one-text requests both fit).
MAX_BATCH = 128


def main():
    folder, http_port, grpc_port, threads = sys.argv[1], *map(int, sys.argv[2:5])
    tokenizer = st_tokenizer(folder)
    tokenizer.enable_padding()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(os.path.join(folder, "model.onnx"), options,
                                           providers=["CPUExecutionProvider"])

    @batch
    def embed(text):
        encodings = tokenizer.encode_batch([t[0].decode("utf-8") for t in text])
        ids = np.asarray([e.ids for e in encodings], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encodings], dtype=np.int64)
        hidden = session.run(None, {"input_ids": ids, "attention_mask": mask,
                                    "token_type_ids": np.zeros_like(ids)})[0]
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return {"embedding": pooled.astype(np.float32)}

    config = TritonConfig(http_address="127.0.0.1", http_port=http_port,
                          grpc_address="127.0.0.1", grpc_port=grpc_port, metrics_port=0,
                          allow_metrics=False, exit_on_error=True)
    with Triton(config=config) as triton:
        triton.bind(model_name="minilm", infer_func=embed,
                    inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
                    outputs=[Tensor(name="embedding", dtype=np.float32, shape=(-1,))],
                    config=ModelConfig(max_batch_size=MAX_BATCH,
                                       batcher=DynamicBatcher(max_queue_delay_microseconds=0)))
        print(f"pytriton ready: HTTP {http_port}, gRPC {grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
