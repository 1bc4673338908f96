#!/usr/bin/python3
"""Writes an attnserve model folder (config.pbtxt + weights.safetensors) from PyTorch's
nn.MultiheadAttention.

From a shell, with a module or a state_dict saved by torch.save:

  python3 client/python/attnserve_export.py --input mha.pt --out models/my-attn
  python3 client/python/attnserve_export.py --input encoder.pt \\
      --prefix encoder.layers.3.self_attn. --num_heads 8 --out models/enc-l3

From Python: export(module_or_state_dict, out_dir, num_heads=None, prefix="", ...).

Only what attnserve computes is exported; a module option that changes the answer and
that attnserve does not compute is refused by name (add_bias_kv, add_zero_attn,
bias=False, kdim/vdim), and so is any tensor under the prefix that is not one of the
four. The safetensors format is written by hand (8-byte little-endian header length,
JSON header, raw little-endian bytes), so nothing beyond torch is needed.
"""
import argparse
import json
import os
import struct
import sys

# The four tensors of nn.MultiheadAttention's state_dict that attnserve reads.
TENSORS = ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: torch.Tensor} as float32 safetensors (names sorted)."""
    import torch
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous().to(torch.float32).cpu()
        data = tensor.numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for blob in blobs:
            out.write(blob)


def check_module(module):
    """Raises ValueError naming the first option attnserve does not compute."""
    import torch
    if not isinstance(module, torch.nn.MultiheadAttention):
        raise ValueError(f"expected an nn.MultiheadAttention, got {type(module).__name__}; "
                         "pass a state_dict with --prefix to export one from a larger model")
    if module.bias_k is not None:
        raise ValueError("add_bias_kv is not supported: build the module with "
                         "add_bias_kv=False")
    if module.add_zero_attn:
        raise ValueError("add_zero_attn is not supported: build the module with "
                         "add_zero_attn=False")
    if not module._qkv_same_embed_dim:
        raise ValueError("kdim/vdim different from embed_dim is not supported: keys and "
                         "values must have embed_dim features")
    if module.in_proj_bias is None:
        raise ValueError("bias=False is not supported: build the module with bias=True")


def select_tensors(state_dict, prefix):
    """The four tensors under `prefix`, prefix stripped; ValueError naming what is
    missing, unsupported or unexpected."""
    if prefix and not prefix.endswith(".") and any(
            key.startswith(prefix + ".") for key in state_dict):
        raise ValueError(f"prefix {prefix!r} names a module, and the tensors under it "
                         f"start with its name and a dot: did you mean {prefix + '.'!r}?")
    found = {key[len(prefix):]: value for key, value in state_dict.items()
             if key.startswith(prefix)}
    if not found:
        raise ValueError(f"no tensor in the state_dict starts with prefix {prefix!r}")
    if "bias_k" in found or "bias_v" in found:
        raise ValueError("add_bias_kv is not supported (bias_k/bias_v present)")
    if any(name in found for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight")):
        raise ValueError("kdim/vdim different from embed_dim is not supported "
                         "(q_proj_weight/k_proj_weight/v_proj_weight present)")
    if "in_proj_weight" in found and "in_proj_bias" not in found:
        raise ValueError("bias=False is not supported (in_proj_bias missing)")
    unexpected = sorted(set(found) - set(TENSORS))
    if unexpected:
        raise ValueError(f"unexpected tensor {prefix}{unexpected[0]}: under the prefix "
                         f"there must be exactly {', '.join(TENSORS)}")
    missing = [name for name in TENSORS if name not in found]
    if missing:
        raise ValueError(f"missing tensor {prefix}{missing[0]}")
    return {name: found[name] for name in TENSORS}


def export(source, out_dir, num_heads=None, prefix="", name=None, precision="fp32",
           max_sequence_length=0, pruned_heads=()):
    """Writes out_dir/config.pbtxt and out_dir/weights.safetensors from an
    nn.MultiheadAttention or a state_dict (num_heads required for a state_dict)."""
    import torch
    if isinstance(source, torch.nn.Module):
        if prefix:
            source = source.get_submodule(prefix.rstrip("."))
            prefix = ""
        check_module(source)
        if num_heads is not None and num_heads != source.num_heads:
            raise ValueError(f"num_heads={num_heads} but the module has {source.num_heads}")
        num_heads = source.num_heads
        state_dict = source.state_dict()
    else:
        state_dict = source
        if num_heads is None:
            raise ValueError("num_heads is needed to export a state_dict")
    tensors = select_tensors(state_dict, prefix)
    d_model = tensors["out_proj.weight"].shape[0]
    expected = {"in_proj_weight": (3 * d_model, d_model), "in_proj_bias": (3 * d_model,),
                "out_proj.weight": (d_model, d_model), "out_proj.bias": (d_model,)}
    for tensor_name, shape in expected.items():
        if tuple(tensors[tensor_name].shape) != shape:
            raise ValueError(f"{prefix}{tensor_name} has shape "
                             f"{list(tensors[tensor_name].shape)}, expected {list(shape)}")
    if d_model % num_heads != 0:
        raise ValueError(f"num_heads={num_heads} does not divide d_model={d_model}")
    if precision not in ("fp32", "bf16", "int8"):
        raise ValueError(f"precision must be fp32, bf16 or int8, got {precision!r}")
    name = name or os.path.basename(os.path.normpath(out_dir))
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "weights.safetensors"), tensors)
    lines = [f'name: "{name}"', f"d_model: {d_model}", f"num_heads: {num_heads}"]
    if precision != "fp32":
        lines.append(f"precision: PRECISION_{precision.upper()}")
    if max_sequence_length:
        lines.append(f"max_sequence_length: {max_sequence_length}")
    if pruned_heads:
        lines.append(f"pruned_heads: [{', '.join(str(h) for h in sorted(pruned_heads))}]")
    with open(os.path.join(out_dir, "config.pbtxt"), "w") as config:
        config.write("\n".join(lines) + "\n")
    return out_dir


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True,
                        help="torch.save file: an nn.MultiheadAttention, a larger module, "
                             "or a state_dict")
    parser.add_argument("--out", required=True, help="model folder to write")
    parser.add_argument("--prefix", default="",
                        help="key prefix of the attention inside a larger state_dict or "
                             "module, e.g. encoder.layers.3.self_attn.")
    parser.add_argument("--num_heads", type=int, help="heads (required for a state_dict)")
    parser.add_argument("--name", help="model name (default: the folder name)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "int8"))
    parser.add_argument("--max_sequence_length", type=int, default=0)
    parser.add_argument("--pruned_heads", default="",
                        help="comma-separated heads to prune, e.g. 3,7")
    args = parser.parse_args()
    import torch
    source = torch.load(args.input, map_location="cpu")
    pruned = [int(h) for h in args.pruned_heads.split(",") if h]
    try:
        out = export(source, args.out, num_heads=args.num_heads, prefix=args.prefix,
                     name=args.name, precision=args.precision,
                     max_sequence_length=args.max_sequence_length, pruned_heads=pruned)
    except ValueError as error:
        print(f"attnserve_export: {error}", file=sys.stderr)
        return 1
    print(f"wrote {out}/config.pbtxt and {out}/weights.safetensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
