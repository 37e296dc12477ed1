"""A run's summary: run-level figures from its epochs, and the comparison table (one row per run).

Used at the end of every run and by sweeps (no plotting, no MLflow import); the report (xp.report) builds
its tables from the same functions.
"""

from __future__ import annotations

import statistics
from typing import Any

COLUMNS = [
    ("run", "run", "{}"),
    ("model", "model", "{}"),
    ("batch", "batch", "{}"),
    ("devices", "devices", "{}"),
    ("val_accuracy", "accuracy", "{:.4f}"),
    ("epochs", "epochs", "{}"),
    ("epoch_time_s", "s/epoch", "{:.2f}"),
    ("throughput", "samples/s", "{:.1f}"),
    ("gpu_utilization", "GPU util", "{:.0f}%"),
    ("cost_usd", "cost", "${:.4f}"),
    ("state", "state", "{}"),
]


def summarize(history: list[dict[str, float]], price_per_hour: float,
              throughput_key: str = "throughput") -> dict[str, float]:
    """Run-level figures from per-epoch metrics.

    s/epoch: mean over epochs. samples/s: median over epochs (the first epoch
    carries graph compilation and allocation, which the warm-up batches only
    partly absorb). cost: training hours x price per hour.
    """
    times = [m["epoch_time_s"] for m in history if "epoch_time_s" in m]
    tputs = [m[throughput_key] for m in history if throughput_key in m]
    train_time = sum(times)
    reached = [m for m in history if "time_to_target_s" in m]
    out = {
        "val_accuracy": history[-1].get("val_accuracy") if history else None,
        "best_val_accuracy": max((m.get("val_accuracy", 0.0) for m in history), default=None),
        "epochs": len(history),
        "epoch_time_s": statistics.fmean(times) if times else None,
        "throughput": statistics.median(tputs) if tputs else None,
        "train_time_s": train_time,
        # the instance is paid for evaluation too: CostMeter's wall-clock figure where there is one
        "cost_usd": history[-1]["cost_usd"] if history and "cost_usd" in history[-1]
        else train_time / 3600.0 * price_per_hour,
        "time_to_target_s": reached[0]["time_to_target_s"] if reached else None,
        "cost_to_target_usd": reached[0]["cost_to_target_usd"] if reached else None,
    }
    return {k: v for k, v in out.items() if v is not None}


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table; missing values print as '-'."""
    cells = [[title for _, title, _ in COLUMNS]]
    for row in rows:
        line = []
        for key, _, fmt in COLUMNS:
            v = row.get(key)
            text = "-" if v is None else fmt.format(v)
            # a long name keeps its start ("trial 12:") and its end
            line.append(text if len(text) <= 60 else text[:24] + "…" + text[-35:])
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    fmt_row = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([fmt_row(cells[0]), sep, *map(fmt_row, cells[1:])])


def row_from_mlflow(run: Any) -> dict[str, Any]:
    """A table row from an MLflow run logged by xp."""
    p, m = run.data.params, run.data.metrics
    return {
        "run": run.info.run_name,
        "model": p.get("model.name"),
        "batch": p.get("batch"),
        "devices": int(num(p.get("derived.num_devices")) or 1) * int(num(p.get("derived.workers")) or 1),
        "val_accuracy": m.get("val_accuracy"),
        "epochs": int(m["epochs"]) if "epochs" in m else None,
        "epoch_time_s": m.get("summary.epoch_time_s"),
        "throughput": m.get("summary.throughput", m.get("summary.io_throughput")),
        "gpu_utilization": m.get("gpu_utilization"),
        "cost_usd": m.get("cost_usd"),
        "state": run.data.tags.get("optuna.trial_state", run.info.status),
    }



def num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None
