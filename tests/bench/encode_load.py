#!/usr/bin/env python3
"""Closed-loop load on an Encode server for `make bench-encoder`: CONCURRENCY calls in
flight (grpc.aio), each one sentence of the corpus as INT64 input_ids [1, L], cycling
through it; WARMUP seconds not counted, then WINDOW seconds measured. Prints one JSON
line: sentences/s, p50 and p99 latency (ms), and the median batch size the server
reported (attnserve's EncodeResponse.batch_size; 0 for a peer that does not say).

usage: encode_load.py REPO_ROOT TARGET NPZ --concurrency 16 [--warmup 2] [--window 8]
"""
import argparse
import asyncio
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import stubs  # noqa: E402


async def run(args):
    import grpc
    from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2
    golden = np.load(args.npz)
    offsets = np.concatenate([[0], np.cumsum(golden["lengths"])])
    requests = []
    for i in range(len(golden["lengths"])):
        ids = golden["ids"][offsets[i]:offsets[i + 1]].astype("<i8").reshape(1, -1)
        requests.append(attention_pb2.EncodeRequest(input_ids=tensor_pb2.Tensor(
            dtype=tensor_pb2.DATA_TYPE_INT64, shape=list(ids.shape), raw=ids.tobytes())))
    async with grpc.aio.insecure_channel(args.target) as channel:
        stub = attention_pb2_grpc.AttentionServiceStub(channel)
        start = time.monotonic()
        begin, end = start + args.warmup, start + args.warmup + args.window
        latencies, batches, counter = [], [], [0]

        async def worker(index):
            while True:
                request = requests[counter[0] % len(requests)]
                counter[0] += 1
                sent = time.monotonic()
                if sent >= end:
                    return
                response = await stub.Encode(request, timeout=60)
                done = time.monotonic()
                if sent >= begin and done <= end:
                    latencies.append(done - sent)
                    batches.append(response.batch_size)

        await asyncio.gather(*(worker(i) for i in range(args.concurrency)))
    latencies.sort()
    print(json.dumps({
        "sentences_per_s": len(latencies) / args.window,
        "p50_ms": 1e3 * latencies[len(latencies) // 2],
        "p99_ms": 1e3 * latencies[int(len(latencies) * 0.99)],
        "batch_median": float(np.median(batches)) if batches else 0.0}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("target")
    parser.add_argument("npz")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=8.0)
    args = parser.parse_args()
    keep = stubs.generate_stubs(args.root)  # noqa: F841
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
