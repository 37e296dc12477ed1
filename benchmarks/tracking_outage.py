"""Training through a tracking outage: the default experiment (LeNet on the digits) against an MLflow server
that is killed for --outage seconds mid-run and started again (issue 29's proof).

Reads the run's own per-epoch throughput lines and compares the epochs trained while the server was away with
those before it went (target: within 5%); then checks that the server holds every epoch's metrics exactly
once and the run FINISHED.

    .venv/bin/python benchmarks/tracking_outage.py [--outage 60] [--before 10] [--after 10]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import ROOT

from mlflow_server import MlflowServer  # tests/, on the path through common


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--outage", type=float, default=60.0, help="seconds the server is away")
    ap.add_argument("--before", type=float, default=10.0, help="seconds of training before the outage")
    ap.add_argument("--after", type=float, default=10.0, help="seconds of training after the server is back")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="xp-bench-outage-"))
    server = MlflowServer(work)
    server.start()
    epochs = int((args.before + args.outage + args.after) / 0.05) + 50  # an epoch takes 0.06-0.09 s on 2 cores
    cmd = [sys.executable, "-m", "xp", f"epochs={epochs}", f"tracking_uri={server.uri}", f"hydra.run.dir={work}/run"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**__import__("os").environ, "PYTHONUNBUFFERED": "1", "XP_STATE_DIR": str(work)})
    t0, lines = time.monotonic(), []
    threading.Thread(target=lambda: [lines.append((time.monotonic() - t0, ln.rstrip())) for ln in proc.stdout],
                     daemon=True).start()
    try:
        while not any(re.match(r"epoch +\d+/", ln) for _, ln in lines):
            time.sleep(0.1)
        time.sleep(args.before)
        down = time.monotonic() - t0
        server.kill()
        time.sleep(args.outage)
        up = time.monotonic() - t0
        server.start()
        proc.wait(timeout=epochs * 1.0 + 600)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.kill() if proc.returncode != 0 else None
    rates = [(t, float(m.group(1))) for t, ln in lines if (m := re.search(r"throughput_samples_per_s=([0-9.]+)", ln))]
    before = [r for t, r in rates if t < down]
    during = [r for t, r in rates if down <= t < up]
    after = [r for t, r in rates if t >= up]
    run_id = next(m.group(1) for _, ln in lines if (m := re.search(r"MLflow run +([0-9a-f]{32})", ln)))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server.uri)
    run = client.get_run(run_id)
    steps = [m.step for m in client.get_metric_history(run_id, "val_accuracy")]
    server.kill()
    med = {k: statistics.median(v) if v else 0.0 for k, v in (("before", before), ("during", during), ("after", after))}
    ratio = med["during"] / med["before"]
    exact = sorted(steps) == list(range(1, epochs + 1))
    print(f"outage of {args.outage:.0f} s from t={down:.1f} s to t={up:.1f} s; {epochs} epochs in all")
    print(f"  epochs trained: {len(before)} before, {len(during)} during, {len(after)} after the outage")
    print(f"  samples/s (median of epochs): before {med['before']:.0f}, during {med['during']:.0f}, after "
          f"{med['after']:.0f} (0: no epoch in that window)")
    print(f"  during / before = {ratio:.3f} (target >= 0.95: {'met' if ratio >= 0.95 else 'NOT met'})")
    print(f"  server: run {run.info.status}, val_accuracy at {len(steps)} steps, each epoch exactly once: {exact}")
    print("  the run said: " + " | ".join(ln for _, ln in lines if "is away" in ln or "is back" in ln))
    out = ROOT / "benchmarks" / "results" / "tracking_outage.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"outage_s": args.outage, "before": before, "during": during, "after": after,
                               "ratio": ratio, "status": run.info.status, "exactly_once": exact,
                               "when": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1))
    return 0 if ratio >= 0.95 and exact and run.info.status == "FINISHED" and proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
