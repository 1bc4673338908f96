#!/usr/bin/env python3
"""The core benchmark's peers over its grid, one engine after another:
- "mha": PyTorch's nn.MultiheadAttention (its fast path in PyTorch 2.x);
- "sdpa": F.scaled_dot_product_attention between the same module's projections
  (PyTorch 2.x; its CPU flash kernel);
- "ort": ONNX Runtime on the same module exported by torch.onnx, graph optimizations on.

Prints one JSON object per line: first {"torch", "blas", "onnxruntime"}, then
per engine, shape and thread count {"engine", "B", "L", "d", "h", "threads", "ms"
(median), "cpu_per_wall" (CPU seconds per second while timed), "gflops"}. Each engine's
thread count bounds OpenBLAS's own pool too (bound_blas_threads). Run through `make bench-core` (tests/bench/compare_core.py), which
runs Debian's PyTorch 1.13 (OpenBLAS) with --engines=mha and the peers venv's PyTorch 2.x
and ONNX Runtime with --engines=mha,sdpa,ort, all with the core's allocator settings and
without OPENBLAS_CORETYPE overrides.
"""
import argparse
import ctypes
import json
import os
import re
import statistics
import tempfile
import time
import warnings

import torch

GRID = [(1, 128, 512, 8), (8, 128, 512, 8), (32, 128, 512, 8), (8, 512, 768, 12),
        (1, 2048, 1024, 16), (64, 64, 256, 4), (1, 4096, 1024, 16)]


def openblas_core():
    for name in ("libblas.so.3", "libopenblas.so.0"):
        try:
            lib = ctypes.CDLL(name)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
        except (OSError, AttributeError):
            continue
    return "not OpenBLAS"


def bound_blas_threads(threads):
    """torch.set_num_threads bounds PyTorch's own pool, not OpenBLAS's: Debian's PyTorch
    1.13 calls libblas.so.3 (OpenBLAS's pthread build), whose pool takes every core
    unless told otherwise (measured: 1.97 CPU-seconds per second in a "1 thread" run).
    Returns whether an OpenBLAS was found and bounded."""
    for name in ("libblas.so.3", "libopenblas.so.0"):
        try:
            ctypes.CDLL(name).openblas_set_num_threads(ctypes.c_int(threads))
            return True
        except (OSError, AttributeError):
            continue
    return False


def flops(batch, length, d_model):
    return 8.0 * batch * length * d_model ** 2 + 4.0 * batch * length ** 2 * d_model


def module(d_model, heads):
    torch.manual_seed(0)
    return torch.nn.MultiheadAttention(d_model, heads, batch_first=True).eval()


class SelfAttention(torch.nn.Module):
    """nn.MultiheadAttention(x, x, x) without weights: what is exported to ONNX."""

    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


class SdpaAttention(torch.nn.Module):
    """The same projections around F.scaled_dot_product_attention."""

    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, x):
        batch, length, d_model = x.shape
        heads = self.mha.num_heads
        qkv = torch.nn.functional.linear(x, self.mha.in_proj_weight, self.mha.in_proj_bias)
        q, k, v = qkv.view(batch, length, 3, heads, d_model // heads).permute(2, 0, 3, 1, 4)
        context = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.mha.out_proj(context.transpose(1, 2).reshape(batch, length, d_model))


def median_ms(run, min_seconds):
    """(median ms per run, CPU seconds per wall second over the timed runs): the second
    shows a peer that used more cores than its thread count says."""
    for _ in range(2):
        run()
    times = []
    start = time.perf_counter()
    cpu_start = time.process_time()
    while len(times) < 3 or time.perf_counter() - start < min_seconds:
        begin = time.perf_counter()
        run()
        times.append(time.perf_counter() - begin)
    cpu_per_wall = (time.process_time() - cpu_start) / (time.perf_counter() - start)
    return statistics.median(times) * 1e3, cpu_per_wall


def ort_sessions(batch, length, d_model, heads, threads_list, folder):
    """Sessions per thread count on the module exported for this exact shape: the
    TorchScript exporter bakes nn.MultiheadAttention's reshapes to the example's shape,
    and a static shape is ORT's best case anyway."""
    import onnxruntime
    path = os.path.join(folder, f"mha_{batch}_{length}_{d_model}_{heads}.onnx")
    x = torch.rand(batch, length, d_model)
    torch.onnx.export(SelfAttention(module(d_model, heads)), (x,), path, input_names=["x"],
                      output_names=["y"], opset_version=17, dynamo=False)
    sessions = {}
    for threads in threads_list:
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        sessions[threads] = onnxruntime.InferenceSession(path, options,
                                                         providers=["CPUExecutionProvider"])
    return sessions


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--engines", default="mha")
    parser.add_argument("--min-seconds", type=float, default=0.5)
    args = parser.parse_args()
    engines = args.engines.split(",")
    threads_list = [int(t) for t in args.threads.split(",")]
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    blas = blas.group(1) if blas else "unknown"
    if blas in ("open", "openblas", "blas", "generic"):
        # Debian's build calls whatever libblas.so.3 the system's alternatives select.
        blas = f"libblas.so.3: {openblas_core()}"
    info = {"torch": torch.__version__, "blas": blas}
    if "ort" in engines:
        import onnxruntime
        info["onnxruntime"] = onnxruntime.__version__
    print(json.dumps(info), flush=True)
    # The legacy exporter is the one that exports nn.MultiheadAttention as one graph.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    folder = tempfile.TemporaryDirectory()
    sessions = {}
    for engine in engines:
        for threads in threads_list:
            torch.set_num_threads(threads)
            bound_blas_threads(threads)
            for batch, length, d_model, heads in GRID:
                x = torch.rand(batch, length, d_model)
                if engine == "ort":
                    shape = (batch, length, d_model, heads)
                    if shape not in sessions:
                        sessions[shape] = ort_sessions(*shape, threads_list, folder.name)
                    session = sessions[shape][threads]
                    feed = {"x": x.numpy()}

                    def run():
                        session.run(None, feed)
                else:
                    mha = module(d_model, heads)
                    peer = mha if engine == "mha" else SdpaAttention(mha).eval()

                    def run():
                        with torch.inference_mode():
                            if engine == "mha":
                                peer(x, x, x, need_weights=False)
                            else:
                                peer(x)
                ms, cpu_per_wall = median_ms(run, args.min_seconds)
                print(json.dumps({"engine": engine, "B": batch, "L": length, "d": d_model,
                                  "h": heads, "threads": threads, "ms": ms,
                                  "cpu_per_wall": cpu_per_wall,
                                  "gflops": flops(batch, length, d_model) / ms / 1e6}),
                      flush=True)


if __name__ == "__main__":
    main()
