#!/usr/bin/python3
"""Writes golden outputs of PyTorch's nn.MultiheadAttention for tests/core/golden_test.

Run with Debian's python3-torch: /usr/bin/python3 tests/tools/make_golden.py tests/data
The device check (tests/gpu/device_check.sh) runs it with --device cuda into a scratch
folder, so that the CUDA backend is compared with PyTorch on the same GPU (TF32 off).
For each case it writes <case>.weights.safetensors (the module's state_dict, the file a
user would hand to attnserve) and <case>.io.safetensors (inputs, outputs, per-head
attention weights, and the case's settings as metadata), <case>.bf16.safetensors (the
same module and inputs computed by PyTorch in bfloat16), with the exporter's own
safetensors writer (client/python/attnserve_export.py), so that no package beyond torch
is needed.
"""
import copy
import os
import sys
import zlib

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "client", "python"))
from attnserve_export import write_safetensors  # noqa: E402

CASES = [
    # name, d_model, heads, batch, query length, memory length (None: self), causal
    ("self_d64_h4", 64, 4, 2, 9, None, False),
    ("cross_d96_h6", 96, 6, 2, 7, 12, False),
    ("causal_d64_h4", 64, 4, 1, 13, None, True),
    ("self_d120_h6", 120, 6, 3, 5, None, False),
]


def make_case(directory, name, d_model, heads, batch, length, memory_length, causal,
              device="cpu"):
    torch.manual_seed(zlib.crc32(name.encode()))
    module = torch.nn.MultiheadAttention(d_model, heads, batch_first=True).eval()
    with torch.no_grad():
        # PyTorch starts biases at zero; random ones make the test exercise them.
        module.in_proj_bias.uniform_(-0.2, 0.2)
        module.out_proj.bias.uniform_(-0.2, 0.2)
    query = torch.rand(batch, length, d_model) * 2 - 1
    memory = query if memory_length is None else torch.rand(batch, memory_length, d_model) * 2 - 1
    mask = None
    if causal:
        mask = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
    module = module.to(device)
    query, memory = query.to(device), memory.to(device)
    if mask is not None:
        mask = mask.to(device)
    with torch.inference_mode():
        output, attention = module(
            query, memory, memory, attn_mask=mask, need_weights=True,
            average_attn_weights=False)
    state = {key: value.cpu() for key, value in module.state_dict().items()}
    query, memory, output, attention = (t.cpu() for t in (query, memory, output, attention))
    write_safetensors(
        os.path.join(directory, name + ".weights.safetensors"),
        {key: state[key] for key in
         ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")})
    io = {"query": query, "output": output, "attention": attention}
    if memory_length is not None:
        io["memory"] = memory
    write_safetensors(
        os.path.join(directory, name + ".io.safetensors"), io,
        {"d_model": d_model, "num_heads": heads, "causal": int(causal),
         "torch": torch.__version__})
    # The same module and inputs in bf16 (weights and activations rounded, as the core's
    # bf16 precision does): PyTorch's own bf16 answer, stored as float32.
    bf16 = copy.deepcopy(module).to(torch.bfloat16)
    q16, m16 = query.to(device).bfloat16(), memory.to(device).bfloat16()
    with torch.inference_mode():
        output16, attention16 = bf16(
            q16, m16, m16, attn_mask=mask, need_weights=True, average_attn_weights=False)
    output16, attention16 = output16.cpu(), attention16.cpu()
    write_safetensors(
        os.path.join(directory, name + ".bf16.safetensors"),
        {"output": output16.float(), "attention": attention16.float()},
        {"torch": torch.__version__})


def main():
    args = [arg for arg in sys.argv[1:] if not arg.startswith("--device=")]
    device = next((arg.split("=", 1)[1] for arg in sys.argv[1:]
                   if arg.startswith("--device=")), "cpu")
    if device != "cpu":
        # fp32 goldens in true fp32: no TF32 tensor cores.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    directory = args[0] if args else "tests/data"
    os.makedirs(directory, exist_ok=True)
    for case in CASES:
        make_case(directory, *case, device=device)
        print("wrote", case[0], "on", device)


if __name__ == "__main__":
    main()
