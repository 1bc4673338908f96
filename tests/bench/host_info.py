"""The CPU a benchmark ran on, for its report: model name and the ISA flags that decide
which kernels oneDNN and PyTorch pick."""

WANTED = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


def cpu_description():
    flags, model = set(), "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            elif line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
    return f"{model}; " + (" ".join(f for f in WANTED if f in flags) or "no AVX2")
