"""GPUs visible to this process, read through NVML (no framework import)."""

from __future__ import annotations

import os


def visible_gpus() -> int:
    """Number of GPUs this process may use: NVML's count, narrowed by CUDA_VISIBLE_DEVICES.

    0 when there is no NVIDIA driver (a CPU machine), never an exception.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return 0
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return count
    # CUDA stops at the first invalid entry, e.g. "-1" hides every GPU.
    n = 0
    for entry in (e.strip() for e in mask.split(",")):
        if not entry or (entry.isdigit() and int(entry) >= count) or entry.startswith("-"):
            break
        n += 1
    return min(n, count)


def describe_gpus(indices: list[int], nvml=None) -> list[tuple[int, str, tuple[int, int]]]:
    """(NVML index, name, compute capability) of these GPUs; [] without NVML."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception:
        return []
    try:
        out = []
        for i in indices:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(h)
            out.append((i, name.decode() if isinstance(name, bytes) else str(name),
                        tuple(nvml.nvmlDeviceGetCudaComputeCapability(h))))
        return out
    finally:
        nvml.nvmlShutdown()
