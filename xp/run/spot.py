"""Spot traces: how many instances a spot market offers over time, and at what price (Dynamic Training).

A trace is a CSV file with the header `t_s,hosts,spot_price_per_hour` and one row per change: from t_s seconds
after the job starts, `hosts` instances are available at `spot_price_per_hour` USD each; the last row holds to
the end. Lines starting with # are comments. Export yours from the cloud's spot-price history (AWS:
`aws ec2 describe-spot-price-history`, one row per price change; `hosts` is what your fleet got then). A bare
name (elastic.trace=spot-p3) is a trace xp ships, sweeps/traces/NAME.csv.

An elastic run with `elastic.trace=FILE` takes its members from the trace (the first `hosts` hosts of its pool,
one instance each) and bills every worker-second at the trace's price of that moment (cost_usd); the same
run with elastic.enabled=false is the fixed on-demand cluster of the trace's peak size. `elastic.trace_speed`
replays the trace faster than real time (trace seconds per second of the job).

The file is read again when it changes while the job runs: rows appended by a spot-price poller (t_s counted from
the job's start) move the members at the next poll, and each round after that bills at them, so a live feed works
as a replay does. A change that does not parse keeps the trace as it was, with one line.
"""

from __future__ import annotations

import math
from pathlib import Path

from xp.errors import ConfigError

HEADER = ("t_s", "hosts", "spot_price_per_hour")
Trace = tuple[tuple[float, int, float], ...]  # (t_s, hosts, spot price per hour), t_s rising from 0


def _file(path: str) -> Path:
    file = Path(path).expanduser()
    if not file.exists() and "/" not in path:  # a shipped trace by name (sweeps/traces/NAME.csv)
        from xp import shipped

        file = shipped("sweeps") / "traces" / f"{path.removesuffix('.csv')}.csv"
    return file


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = _file(path).stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class Feed:
    """A trace file as it is now: read again when it changes (a poller appending rows), kept as it was when the
    change does not parse (one line) or the file goes away."""

    def __init__(self, path: str, trace: Trace):
        self.path, self.trace, self.stamp = path, trace, _stamp(path)

    def now(self) -> Trace:
        stamp = _stamp(self.path)
        if stamp is not None and stamp != self.stamp:
            self.stamp = stamp
            try:
                self.trace = load(self.path)
            except ConfigError as e:
                print(f"xp: elastic: {e}; going on with the trace as it was", flush=True)
        return self.trace


def load(path: str) -> Trace:
    """The trace file's rows; one ConfigError line naming the file and line for anything malformed."""
    where = f"elastic.trace={path}"
    try:
        lines = _file(path).read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e.strerror})") from None
    rows: list[tuple[float, int, float]] = []
    header = None
    for n, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cells = [c.strip() for c in line.split(",")]
        if header is None:
            header = tuple(cells)
            if header != HEADER:
                raise ConfigError(f"{where}: line {n}: the header must be {','.join(HEADER)}")
            continue
        if len(cells) != 3:
            raise ConfigError(f"{where}: line {n}: 3 values expected (t_s,hosts,spot_price_per_hour), got {len(cells)}")
        try:
            t, hosts, price = float(cells[0]), int(cells[1]), float(cells[2])
        except ValueError:
            raise ConfigError(f"{where}: line {n}: {line.strip()!r}: t_s and the price are numbers, hosts an "
                              "integer") from None
        if not (math.isfinite(t) and math.isfinite(price)) or t < 0 or hosts < 0 or price < 0:
            raise ConfigError(f"{where}: line {n}: {line.strip()!r}: t_s, hosts and the price must be >= 0")
        if rows and t <= rows[-1][0]:
            raise ConfigError(f"{where}: line {n}: t_s={t:g} does not come after {rows[-1][0]:g}")
        if not rows and t != 0:
            raise ConfigError(f"{where}: line {n}: the first row must be at t_s=0 (what the job starts with)")
        rows.append((t, hosts, price))
    if not rows:
        raise ConfigError(f"{where}: no rows (header {','.join(HEADER)}, then one row per change)")
    if max(r[1] for r in rows) == 0:
        raise ConfigError(f"{where}: the trace never offers a host")
    return tuple(rows)


def at(trace: Trace, t: float) -> tuple[int, float]:
    """(hosts, spot price per hour) at trace time t (seconds)."""
    hosts, price = trace[0][1], trace[0][2]
    for t_s, h, p in trace:
        if t_s > t:
            break
        hosts, price = h, p
    return hosts, price


def peak(trace: Trace) -> int:
    return max(r[1] for r in trace)


def cost(trace: Trace, t0: float, t1: float, workers: int) -> float:
    """What `workers` instances cost from trace time t0 to t1 (seconds) at the trace's prices, USD."""
    total, edges = 0.0, [r[0] for r in trace[1:]] + [math.inf]
    for (start, _, price), end in zip(trace, edges):
        lo, hi = max(start, t0), min(end, t1)
        if hi > lo:
            total += (hi - lo) / 3600 * price * workers
    return total
