"""One run's start-up: `python -m xp epochs=1` (the default experiment: LeNet on the digits, one epoch, logged to a
new SQLite store with its model) against a bare hand-written hybridized Gluon script of the same network and data
(benchmarks/startup_bare.py), whole processes from exec to exit, paired A B A B, medians of the pairs' ratios.
Target (issue 58): at most 1.5x the wall and the CPU.

    .venv/bin/python benchmarks/startup.py [--reps 5] [-- EXTRA XP OVERRIDES]

Each xp run has its own new folder (its store ./mlruns/mlflow.db and its state folder): nothing is shared between
runs but the operating system's file cache, as a user's second command would have it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def timed(cmd: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of the command and the children it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"startup.py: {' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "startup.json"))
    ap.add_argument("overrides", nargs="*", help="more xp overrides (after --)")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "XP_"))}
    xp_cmd = [PYTHON, "-m", "xp", "epochs=1", *args.overrides]
    bare_cmd = [PYTHON, str(ROOT / "benchmarks" / "startup_bare.py")]
    rows: dict[str, list[tuple[float, float]]] = {"xp": [], "bare": []}
    with tempfile.TemporaryDirectory(prefix="xp-startup-") as top:
        for i in range(args.reps + 1):  # the first pair warms the file cache and is not counted
            here = Path(top) / f"run{i}"
            here.mkdir()
            xp = timed(xp_cmd, str(here), {**env, "XP_STATE_DIR": str(here / "state")})
            bare = timed(bare_cmd, str(here), env)
            if i:
                rows["xp"].append(xp)
                rows["bare"].append(bare)
    ratios = {k: statistics.median(x[j] / b[j] for x, b in zip(rows["xp"], rows["bare"])) for j, k in ((0, "wall"), (1, "cpu"))}
    med = {w: {k: statistics.median(r[j] for r in rows[w]) for j, k in ((0, "wall"), (1, "cpu"))} for w in rows}
    print(f"start-up, {args.reps} paired runs, medians: {' '.join(xp_cmd[1:])} against {Path(bare_cmd[1]).name}")
    print("| way | wall s | CPU s |\n|---|---|---|")
    for w in rows:
        print(f"| {w} | {med[w]['wall']:.2f} | {med[w]['cpu']:.2f} |")
    print(f"| xp / bare (median of pairs) | {ratios['wall']:.2f}x | {ratios['cpu']:.2f}x |")
    ok = ratios["wall"] <= 1.5 and ratios["cpu"] <= 1.5
    print(f"target 1.5x: {'met' if ok else 'NOT met'}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": xp_cmd[1:], "runs": rows, "medians": med, "ratios": ratios,
                                          "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
