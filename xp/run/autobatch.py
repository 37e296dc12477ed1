"""batch=auto: the largest per-device batch that fits in memory.

Doubling from 1 until a batch does not fit, then bisecting between the last fit and the
first miss (seed: "by trial and error, the largest possible batch size is 1408"). Whether
a batch fits is the backend's call (Backend.fits): a real step with out-of-memory caught
on GPUs; on CPUs, the memory the framework plans for a step against auto_batch_memory_mb.
"""

from __future__ import annotations

from typing import Callable

from xp.errors import ConfigError


def largest_fitting(fits: Callable[[int], bool], limit: int) -> tuple[int, list[int]]:
    """(largest b in 1..limit with fits(b), the batches tried); assumes fitting is monotone in b."""
    tried: list[int] = []

    def check(b: int) -> bool:
        tried.append(b)
        return fits(b)

    if not check(1):
        raise ConfigError("batch=auto: not even batch=1 fits; raise auto_batch_memory_mb or use a smaller model")
    lo, hi = 1, None
    while hi is None:
        nxt = min(lo * 2, limit)
        if nxt == lo:
            return lo, tried
        if check(nxt):
            lo = nxt
        else:
            hi = nxt
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if check(mid):
            lo = mid
        else:
            hi = mid
    return lo, tried
