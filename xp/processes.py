"""A process known by its id and its start time: a process id alone may be reused by another process once the
first is gone (a run's tags, a spool's run.json and a trial's scheduler say both)."""

from __future__ import annotations


def started(pid: int) -> float:
    """When process `pid` started (seconds since the epoch, to 0.01 s), or 0.0 if there is none."""
    import psutil

    try:
        return round(psutil.Process(pid).create_time(), 2) if pid else 0.0
    except psutil.Error:
        return 0.0


def same_process(pid: int, started_at: float | str | None) -> bool:
    """Process `pid` lives and is the one that started at `started_at` (None: any), not a reuse of its pid."""
    now = started(pid)
    return bool(now) and (started_at is None or abs(now - float(started_at)) < 1.0)
