"""What this CPU can run of MXNet's kernels (read from /proc/cpuinfo, without importing MXNet)."""

from __future__ import annotations

AVX512_CORE = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}  # what MKL-DNN's bfloat16 kernels need at least


def cpu_bfloat16() -> bool:
    """Whether this CPU runs MKL-DNN's bfloat16 kernels (AVX-512 core: emulated; avx512_bf16 or AMX: native).
    Without it MXNet fails mid-training ("could not create a primitive descriptor iterator")."""
    return AVX512_CORE <= set(_cpuinfo("flags").split())


def cpu_model() -> str:
    return _cpuinfo("model name") or "unknown"


def _cpuinfo(key: str) -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(key) and ":" in line:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
