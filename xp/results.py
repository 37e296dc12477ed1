"""A run's summary: run-level figures from its epochs, and the comparison table (one row per run).

Used at the end of every run and by sweeps (no plotting, no MLflow import); the report (xp.report) builds
its tables from the same functions.
"""

from __future__ import annotations

import statistics
from typing import Any

from xp.states import RunStatus

COLUMNS = [
    ("run", "run", "{}"),
    ("model", "model", "{}"),
    ("batch", "batch", "{}"),
    ("devices", "devices", "{}"),
    ("val_accuracy", "val acc (last)", "{:.4f}"),
    ("best_val_accuracy", "best", "{:.4f}"),
    ("epochs", "epochs", "{}"),
    ("epoch_time_s", "s/epoch", "{:.2f}"),
    ("throughput", "samples/s", "{:.1f}"),
    ("gpu_utilization", "GPU util", "{:.0f}%"),
    ("cost_usd", "cost", "${:.4f}"),
    ("state", "state", "{}"),
]


def summarize(history: list[dict[str, float]], price_per_hour: float,
              throughput_key: str = "throughput_samples_per_s") -> dict[str, float]:
    """Run-level figures from per-epoch metrics.

    s/epoch: mean over epochs. samples/s: median over epochs (the first epoch
    carries graph compilation and allocation, which the warm-up batches only
    partly absorb). cost: training hours x price per hour. best_val_accuracy:
    the best epoch's (val_accuracy is the last epoch's).
    """
    times = [m["epoch_time_s"] for m in history if "epoch_time_s" in m]
    tputs = [m[throughput_key] for m in history if throughput_key in m]
    utils = [m["gpu_utilization_pct"] for m in history if "gpu_utilization_pct" in m]
    accs = [(m["val_accuracy"], i + 1) for i, m in enumerate(history) if "val_accuracy" in m]
    train_time = sum(times)
    reached = [m for m in history if "time_to_target_s" in m]
    best = max(accs, key=lambda a: (a[0], -a[1])) if accs else (None, None)  # the first epoch with the best
    out = {
        "val_accuracy": history[-1].get("val_accuracy") if history else None,
        "best_val_accuracy": best[0],
        "best_epoch": best[1],
        "epochs": len(history),
        "epoch_time_s": statistics.fmean(times) if times else None,
        "throughput": statistics.median(tputs) if tputs else None,
        "gpu_utilization": statistics.fmean(utils) if utils else None,
        "train_time_s": train_time,
        # the instance is paid for evaluation too: CostMeter's wall-clock figure where there is one
        "cost_usd": None if not price_per_hour else history[-1]["cost_usd"] if history and "cost_usd" in history[-1]
        else train_time / 3600.0 * price_per_hour,  # no price (local hardware): no cost, not $0
        "time_to_target_s": reached[0]["time_to_target_s"] if reached else None,
        "cost_to_target_usd": reached[0]["cost_to_target_usd"] if reached else None,
    }
    return {k: v for k, v in out.items() if v is not None}


# A summary's keys as MLflow params, named with their units (the per-epoch metrics keep the curves).
PARAM_NAMES = {"epochs": "epochs_completed", "gpu_utilization": "gpu_utilization_pct"}


def as_params(summary: dict[str, Any], throughput_name: str) -> dict[str, str]:
    """The run's one-number results as `summary.*` params: one block in MLflow's run page, not one-point
    charts beside the per-epoch curves."""
    names = {**PARAM_NAMES, "throughput": throughput_name}
    return {f"summary.{names.get(k, k)}": (f"{v:.6g}" if isinstance(v, float) else str(v))
            for k, v in summary.items() if k != "val_accuracy"}  # the last epoch's: the val_accuracy metric


def parent_params(rows: list[dict[str, Any]], children: list[Any]) -> dict[str, str]:
    """A sweep's (or study's) parent: how many runs, and the best of its children's best_val_accuracy (the
    same meaning as on a child: a best epoch's accuracy), with the run that reached it."""
    out = {"summary.runs": str(len(rows))}
    scored = [(r["best_val_accuracy"], c.info.run_id) for r, c in zip(rows, children)
              if r.get("best_val_accuracy") is not None]
    if scored:
        best, run_id = max(scored)
        out.update({"summary.best_val_accuracy": f"{best:.6g}", "summary.best_run_id": run_id})
    return out


def parent_tags(children: list[Any]) -> dict[str, str]:
    """A parent run's backend, model, data set, dtype and hardware: its children's (comma-separated if they vary)."""
    tags = {}
    for key in ("xp.backend", "xp.model", "xp.dataset", "xp.dtype", "xp.hardware"):
        values = sorted({c.data.tags[key] for c in children if key in c.data.tags})
        if values:
            tags[key] = ",".join(values)
    return tags


def best(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The n rows of the best best_val_accuracy, best first (rows without one last)."""
    return sorted(rows, key=lambda r: -r["best_val_accuracy"] if r.get("best_val_accuracy") is not None
                  else float("inf"))[:n]


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
    """A table row from an MLflow run logged by xp (its summary params; metrics for runs logged before them)."""
    p, m = run.data.params, run.data.metrics

    def result(name: str, *old: str) -> float | None:
        value = num(p.get(f"summary.{name}"))
        return value if value is not None else next((m[k] for k in old if k in m), None)

    epochs = result("epochs_completed", "epochs")
    return {
        "run": run.info.run_name,
        "model": p.get("model.name"),
        "batch": p.get("batch"),
        "devices": int(num(p.get("derived.num_devices")) or 1) * int(num(p.get("derived.workers")) or 1),
        "val_accuracy": m.get("val_accuracy"),
        "best_val_accuracy": result("best_val_accuracy", "best_val_accuracy"),
        "epochs": None if epochs is None else int(epochs),
        "epoch_time_s": result("epoch_time_s", "summary.epoch_time_s"),
        "throughput": result("throughput_samples_per_s", "summary.throughput")
        or result("io_throughput_samples_per_s", "summary.io_throughput"),
        "gpu_utilization": result("gpu_utilization_pct", "gpu_utilization"),
        "cost_usd": result("cost_usd", "cost_usd"),
        # a trial's state where its run finished (COMPLETE, PRUNED); else how the run ended (KILLED, FAILED)
        "state": run.data.tags.get("optuna.trial_state", run.info.status) if run.info.status == RunStatus.FINISHED
        else run.info.status,
    }


def num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None
