"""GPUs visible to this process, read through NVML (no framework import)."""

from __future__ import annotations

import os


def visible_gpus() -> int:
    """Number of GPUs this process may use: NVML's count, narrowed by CUDA_VISIBLE_DEVICES.

    0 when there is no NVIDIA driver (a CPU machine), never an exception.
    """
    return len(visible_gpu_ids())


def visible_gpu_ids() -> list[int]:
    """The NVML indices of the GPUs this process may use, in CUDA_VISIBLE_DEVICES order (indices or GPU-UUIDs);
    [] without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        count = pynvml.nvmlDeviceGetCount()
        mask = os.environ.get("CUDA_VISIBLE_DEVICES")
        if mask is None:
            return list(range(count))
        ids: list[int] = []
        for entry in (e.strip() for e in mask.split(",")):  # CUDA stops at the first invalid entry ("-1": none)
            if entry.isdigit() and int(entry) < count:
                ids.append(int(entry))
                continue
            try:  # a GPU's UUID
                ids.append(pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(entry)))
            except Exception:
                break
        return ids
    finally:
        pynvml.nvmlShutdown()


def describe_gpus(indices: list[int], nvml=None) -> list[tuple[int, str, tuple[int, int]]]:
    """(NVML index, name, compute capability) of these GPUs; [] without NVML."""
    try:
        if nvml is None:
            import pynvml

            nvml = pynvml
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
