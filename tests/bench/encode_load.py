#!/usr/bin/env python3
"""Closed-loop load on an Encode server for `make bench-encoder`: CONCURRENCY calls in
flight, each one sentence of the corpus, cycling through it; WARMUP seconds not counted,
then WINDOW seconds measured. Prints one JSON line: sentences/s, p50 and p99 latency
(ms), and the median batch size the server reported (attnserve's
EncodeResponse.batch_size; 0 for a peer or a door that does not say).

--mode ids: gRPC Encode (grpc.aio) with INT64 input_ids [1, L] (the npz's tokens);
--mode text: gRPC Encode with the sentence as text (sentences.en.txt beside the npz);
--mode openai: POST /v1/embeddings {"model", "input": sentence} over keep-alive
  HTTP/1.1 connections, one per call in flight; TARGET is host:port of the HTTP door.

usage: encode_load.py REPO_ROOT TARGET NPZ --concurrency 16 [--mode ids]
       [--warmup 2] [--window 8]
"""
import argparse
import asyncio
import json
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import stubs  # noqa: E402


class HttpConnection:
    """One keep-alive HTTP/1.1 connection that POSTs JSON and reads the answer."""

    def __init__(self, reader, writer, host):
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, target):
        host, port = target.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, host)

    async def post(self, path, body):
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
        payload = await self.reader.readexactly(length)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {payload[:200]!r}")
        return payload


async def run(args):
    import grpc
    from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2
    golden = np.load(args.npz)
    offsets = np.concatenate([[0], np.cumsum(golden["lengths"])])
    with open(os.path.join(os.path.dirname(args.npz), "sentences.en.txt"),
              encoding="utf-8") as f:
        sentences = [line.rstrip("\n") for line in f]
    requests = []
    for i in range(len(golden["lengths"])):
        if args.mode == "ids":
            ids = golden["ids"][offsets[i]:offsets[i + 1]].astype("<i8").reshape(1, -1)
            requests.append(attention_pb2.EncodeRequest(input_ids=tensor_pb2.Tensor(
                dtype=tensor_pb2.DATA_TYPE_INT64, shape=list(ids.shape), raw=ids.tobytes())))
        elif args.mode == "text":
            requests.append(attention_pb2.EncodeRequest(text=[sentences[i]]))
        else:
            requests.append(json.dumps({"model": "minilm", "input": sentences[i],
                                        "encoding_format": "float"}).encode())
    start = time.monotonic()
    begin, end = start + args.warmup, start + args.warmup + args.window
    latencies, batches, counter = [], [], [0]

    async def worker(call):
        while True:
            request = requests[counter[0] % len(requests)]
            counter[0] += 1
            sent = time.monotonic()
            if sent >= end:
                return
            batch = await call(request)
            done = time.monotonic()
            if sent >= begin and done <= end:
                latencies.append(done - sent)
                batches.append(batch)

    if args.mode == "openai":
        connections = [await HttpConnection.open(args.target)
                       for _ in range(args.concurrency)]

        def caller(connection):
            async def call(body):
                await connection.post("/v1/embeddings", body)
                return 0
            return call

        await asyncio.gather(*(worker(caller(c)) for c in connections))
        for connection in connections:
            connection.writer.close()
    else:
        async with grpc.aio.insecure_channel(args.target) as channel:
            stub = attention_pb2_grpc.AttentionServiceStub(channel)

            async def call(request):
                return (await stub.Encode(request, timeout=60)).batch_size

            await asyncio.gather(*(worker(call) for _ in range(args.concurrency)))
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
    parser.add_argument("--mode", choices=("ids", "text", "openai"), default="ids")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=8.0)
    args = parser.parse_args()
    keep = stubs.generate_stubs(args.root)  # noqa: F841
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
