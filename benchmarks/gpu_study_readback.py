"""Step 4 of gpu_session.sh: what the studies on GPU slots recorded, read back from MLflow.

For each study: each trial run's slot, its GPUs and cores (xp.slot.*), its state, time span and NVML figures,
and how many seconds trials of different slots ran at once; then from nvidia-smi's compute-apps samples, how
many processes held the GPU at once.

    python benchmarks/gpu_study_readback.py SMI_APPS_CSV STUDY [STUDY ...]   (MLFLOW_TRACKING_URI set)
"""

from __future__ import annotations

import csv
import math
import sys


def main() -> int:
    import mlflow

    apps_csv, studies = sys.argv[1], sys.argv[2:]
    runs = mlflow.search_runs(search_all_experiments=True)
    for study in studies:
        if "tags.optuna.study" not in runs or "tags.xp.slot" not in runs:
            print(f"{study}: no trial runs")
            continue
        rows = runs[(runs["tags.optuna.study"] == study) & runs["tags.xp.slot"].notna()]
        print(f"{study}: {len(rows)} trial runs")
        spans = []
        for _, r in rows.sort_values("start_time").iterrows():
            t0 = r["start_time"].timestamp()
            t1 = r["end_time"].timestamp() if r["end_time"] == r["end_time"] else math.nan
            spans.append((r["tags.xp.slot"], t0, t1))
            util = r.get("metrics.gpu_utilization_pct", math.nan)
            mem = r.get("metrics.gpu_memory_mb", math.nan)
            own = r.get("metrics.gpu_process_memory_mb", math.nan)
            print(f"  trial {r.get('tags.optuna.trial_number')}: slot {r['tags.xp.slot']} "
                  f"gpus {r['tags.xp.slot.gpus']} cores {r['tags.xp.slot.cores']} {r['status']:9} "
                  f"{t1 - t0:5.1f} s  GPU util {util:5.1f}%  GPU memory {mem:6.0f} MB, the trial's own {own:6.0f} MB")
        overlap = sum(max(0.0, min(a[2], b[2]) - max(a[1], b[1]))
                      for i, a in enumerate(spans) for b in spans[i + 1:] if a[0] != b[0])
        print(f"  seconds that trials of two slots ran at once: {overlap:.1f}")
    at: dict[str, set[str]] = {}
    for r in csv.reader(open(apps_csv)):
        if len(r) >= 3 and r[1].strip().isdigit():
            at.setdefault(r[0], set()).add(r[1].strip())
    print(f"nvidia-smi compute apps: at most {max((len(v) for v in at.values()), default=0)} processes on the GPU "
          f"at once; {len({p for v in at.values() for p in v})} distinct over the studies")
    return 0


if __name__ == "__main__":
    sys.exit(main())
