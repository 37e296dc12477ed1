"""Reports: the seeds' comparison table, scaling efficiency, accuracy and cost plots.

    python -m xp.report                         # every finished run of experiment xp
    python -m xp.report --parent RUN_ID         # the runs of one sweep or study
    python -m xp.report --filter "params.model.name = 'resnet18'" --out reports/r18

Writes report.md and PNG plots into --out and logs them to MLflow (on the sweep's
parent run, or on a new run tagged xp.report). matplotlib is imported only here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from xp.summary import num as _num, row_from_mlflow


# --- the report ------------------------------------------------------------------------

def report_row(run: Any) -> dict[str, Any]:
    """Everything the report needs from one xp run in MLflow."""
    p = run.data.params
    devices = int(_num(p.get("derived.num_devices")) or 1) * int(_num(p.get("derived.workers")) or 1)
    return {**row_from_mlflow(run), "infrastructure": p.get("hardware.name", "?"), "backend": p.get("backend.name"),
            "dataset": p.get("dataset.name"), "dtype": p.get("dtype.name"), "devices": devices,
            "global_batch": _num(p.get("derived.global_batch")), "lr": _num(p.get("derived.effective_lr")),
            "batch": _num(p.get("batch")), "run_id": run.info.run_id}


def scaling(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Scaling efficiency throughput(N) / (N x throughput(1)) within groups of runs that differ only
    in their number of devices x workers (same model, backend, data, dtype, per-device batch)."""
    groups: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("throughput"):
            key = (r["model"], r["backend"], r["dataset"], r["dtype"], r["batch"], r["infrastructure"])
            groups[key][r["devices"]].append(r["throughput"])
    out = []
    for key, by_n in groups.items():
        if 1 not in by_n or len(by_n) < 2:
            continue
        base = statistics.median(by_n[1])
        for n in sorted(by_n):
            t = statistics.median(by_n[n])
            out.append({"model": key[0], "backend": key[1], "batch": key[4], "infrastructure": key[5], "devices": n,
                        "throughput": t, "ideal": n * base, "efficiency": t / (n * base)})
    return out


def backends(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same experiment on different backends, side by side: groups of runs that differ only in their
    backend (same model, data, dtype, per-device batch, devices, infrastructure), medians per backend,
    samples/s relative to the group's fastest backend."""
    groups: dict[tuple, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("backend"):
            key = (r["model"], r["dataset"], r["dtype"], r["batch"], r["devices"], r["infrastructure"])
            groups[key][r["backend"]].append(r)
    out = []
    for key, by_backend in groups.items():
        if len(by_backend) < 2:
            continue
        group = []
        for backend, runs in sorted(by_backend.items()):
            def median(k: str) -> float | None:
                vals = [r[k] for r in runs if r.get(k) is not None]
                return statistics.median(vals) if vals else None

            group.append({"model": key[0], "dataset": key[1], "dtype": key[2], "batch": key[3], "devices": key[4],
                          "infrastructure": key[5], "backend": backend, "runs": len(runs),
                          "throughput": median("throughput"), "val_accuracy": median("val_accuracy"),
                          "epoch_time_s": median("epoch_time_s")})
        fastest = max((g["throughput"] or 0.0) for g in group)
        for g in group:
            g["relative"] = g["throughput"] / fastest if g["throughput"] and fastest else None
        out += group
    return out


def _save(fig: Any, path: Path, files: list[Path]) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    files.append(path)


def _plots(rows: list[dict[str, Any]], scale: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    if scale:
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        groups = defaultdict(list)
        for s in scale:
            groups[(s["model"], s["backend"], s["batch"])].append(s)
        for (model, backend, batch), pts in groups.items():
            ns = [p["devices"] for p in pts]
            line, = ax.plot(ns, [p["throughput"] for p in pts], "o-", label=f"{model}, {backend}, batch {batch:g}/device")
            ax.plot(ns, [p["ideal"] for p in pts], "--", color=line.get_color(), alpha=0.5, label="ideal (linear)")
            for p in pts:
                ax.annotate(f"{p['efficiency']:.0%}", (p["devices"], p["throughput"]), textcoords="offset points",
                            xytext=(6, -12), fontsize=8)
        ax.set_xlabel("devices x workers")
        ax.set_ylabel("samples/s")
        ax.set_title("Throughput vs devices (labels: scaling efficiency)", fontsize=11)
        ax.margins(x=0.12, y=0.08)
        ax.set_xticks(sorted({s["devices"] for s in scale}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        _save(fig, out / "scaling.png", files)
    acc = [r for r in rows if r.get("val_accuracy") is not None]
    if acc:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9.6, 4.0), sharey=True)
        for model in sorted({r["model"] for r in acc}):
            mine = [r for r in acc if r["model"] == model]
            a1.scatter([r["global_batch"] for r in mine], [r["val_accuracy"] for r in mine], label=model)
            a2.scatter([r["lr"] for r in mine], [r["val_accuracy"] for r in mine], label=model)
        a1.set_xscale("log", base=2)
        a2.set_xscale("log")
        a1.set_xlabel("global batch")
        a2.set_xlabel("effective learning rate")
        a1.set_ylabel("validation accuracy")
        for a in (a1, a2):
            a.grid(alpha=0.3)
        a1.legend(fontsize=8)
        fig.suptitle("Accuracy vs global batch and learning rate")
        _save(fig, out / "accuracy.png", files)
        costed = [r for r in acc if r.get("cost_usd") is not None]
        if costed:
            fig, ax = plt.subplots(figsize=(6.4, 4.4))
            for infra in sorted({r["infrastructure"] for r in costed}):
                mine = [r for r in costed if r["infrastructure"] == infra]
                ax.scatter([r["cost_usd"] for r in mine], [r["val_accuracy"] for r in mine], label=infra)
            ax.set_xlabel("cost (USD)")
            ax.set_ylabel("validation accuracy")
            ax.set_title("Cost vs accuracy")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, title="infrastructure")
            _save(fig, out / "cost.png", files)
    return files


SEED_COLUMNS = [("infrastructure", "infrastructure", "{}"), ("model", "model", "{}"), ("backend", "backend", "{}"),
                ("batch", "batch/device", "{:g}"), ("global_batch", "global batch", "{:g}"), ("devices", "GPUs", "{}"),
                ("val_accuracy", "val accuracy", "{:.4f}"), ("epochs", "epochs", "{}"),
                ("epoch_time_s", "s/epoch", "{:.2f}"), ("throughput", "samples/s", "{:.1f}"),
                ("gpu_utilization", "GPU util", "{:.0f}%"), ("cost_usd", "cost", "${:.4f}")]


def _md_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(t for _, t, _ in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join("-" if r.get(k) is None else f.format(r[k]) for k, _, f in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def elastic_timeline(runs: list[Any], history: Callable[[str, str], list[Any]]) -> list[dict[str, Any]]:
    """For runs whose workers changed count (elastic): workers per epoch against the time trained, and the bill."""
    out = []
    for r in runs:
        if "worker_hours" not in r.data.metrics:
            continue

        def per_step(key: str) -> dict[int, float]:
            return {m.step: m.value for m in sorted(history(r.info.run_id, key), key=lambda m: m.timestamp)}

        workers, elapsed = per_step("workers"), per_step("elapsed_s")
        steps = sorted(workers)
        m = r.data.metrics
        out.append({"run": r.info.run_name, "epochs": steps, "workers": [workers[s] for s in steps],
                    "elapsed_s": [elapsed.get(s) for s in steps], "worker_hours": m.get("worker_hours"),
                    "cost_on_demand_usd": m.get("cost_on_demand_usd"), "cost_spot_usd": m.get("cost_spot_usd"),
                    "val_accuracy": m.get("val_accuracy")})
    return out


def _timeline_plot(timeline: list[dict[str, Any]], out: Path, files: list[Path]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for t in timeline:
        xs = [e if e is not None else i for i, e in zip(t["epochs"], t["elapsed_s"])]
        ax.step(xs, t["workers"], where="pre", marker="o", label=t["run"][:40])
    ax.set_xlabel("time trained (s, at each epoch's end)")
    ax.set_ylabel("workers")
    ax.set_title("Workers over time (elastic runs)", fontsize=11)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, out / "workers.png", files)


def _backends_plot(side: list[dict[str, Any]], out: Path, files: list[Path]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(g["model"], g["dtype"], g["batch"], g["devices"]) for g in side}, key=str)
    names = sorted({g["backend"] for g in side})
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        heights = [next((g["throughput"] or 0.0 for g in side if (g["model"], g["dtype"], g["batch"], g["devices"]) == k
                         and g["backend"] == name), 0.0) for k in groups]
        ax.bar([i + j * width for i in range(len(groups))], heights, width, label=name)
    ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"{m}\n{d}, b{b:g} x{n}" for m, d, b, n in groups], fontsize=8)
    ax.set_ylabel("samples/s")
    ax.set_title("Backends side by side", fontsize=11)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, title="backend")
    _save(fig, out / "backends.png", files)


def build_report(runs: list[Any], out: Path, title: str,
                 history: Callable[[str, str], list[Any]] | None = None) -> Path:
    """Write report.md and the plots for these MLflow runs into `out`; return report.md's path.
    `history(run_id, key)` (MlflowClient.get_metric_history) adds elastic runs' worker counts over time."""
    out.mkdir(parents=True, exist_ok=True)
    rows = sorted((report_row(r) for r in runs), key=lambda r: (r["model"] or "", r["devices"], r["batch"] or 0))
    scale = scaling(rows)
    side = backends(rows)
    files = _plots(rows, scale, out)
    if side:
        _backends_plot(side, out, files)
    timeline = elastic_timeline(runs, history) if history else []
    if timeline:
        _timeline_plot(timeline, out, files)
    lines = [f"# {title}", "", f"{len(rows)} runs, written {time.strftime('%Y-%m-%d %H:%M')}.", "",
             _md_table(rows, SEED_COLUMNS), ""]
    if scale:
        lines += ["## Scaling", "", "Efficiency = throughput(N) / (N x throughput(1)).", "",
                  _md_table(scale, [("model", "model", "{}"), ("backend", "backend", "{}"), ("batch", "batch/device", "{:g}"),
                                    ("devices", "devices", "{}"), ("throughput", "samples/s", "{:.1f}"),
                                    ("ideal", "ideal", "{:.1f}"), ("efficiency", "efficiency", "{:.1%}")]), ""]
    if side:
        lines += ["## Backends side by side", "",
                  "The same model, data, precision, batch and devices on each backend (medians of its runs); "
                  "relative = samples/s against the fastest backend of the group.", "",
                  _md_table(side, [("model", "model", "{}"), ("dtype", "dtype", "{}"), ("batch", "batch/device", "{:g}"),
                                   ("devices", "devices", "{}"), ("backend", "backend", "{}"), ("runs", "runs", "{}"),
                                   ("throughput", "samples/s", "{:.1f}"), ("relative", "relative", "{:.0%}"),
                                   ("val_accuracy", "val accuracy", "{:.4f}"), ("epoch_time_s", "s/epoch", "{:.2f}")]),
                  ""]
    if timeline:
        lines += ["## Elastic runs", "", "Workers per epoch (every worker an instance: worker-hours x price).", "",
                  _md_table([{**t, "workers": " ".join(f"{w:g}" for w in t["workers"])} for t in timeline],
                            [("run", "run", "{}"), ("workers", "workers per epoch", "{}"),
                             ("worker_hours", "worker-hours", "{:.4f}"),
                             ("cost_on_demand_usd", "cost on-demand", "${:.4f}"),
                             ("cost_spot_usd", "cost spot", "${:.4f}"), ("val_accuracy", "val accuracy", "{:.4f}")]),
                  ""]
    for f in files:
        lines += [f"![{f.stem}]({f.name})", ""]
    md = out / "report.md"
    md.write_text("\n".join(lines))
    return md


def main(argv: list[str] | None = None) -> int:
    from xp.errors import XPError, one_line
    from xp.tracking import resolve_uri

    ap = argparse.ArgumentParser(prog="python -m xp.report", description="Tables and plots from xp's MLflow runs.")
    ap.add_argument("--experiment", default="xp", help="MLflow experiment (default: xp)")
    ap.add_argument("--parent", help="only the runs of this sweep or study (its parent run id)")
    ap.add_argument("--filter", default="", help="an MLflow filter string, e.g. \"params.model.name = 'lenet'\"")
    ap.add_argument("--out", help="output folder (default: reports/<time>)")
    ap.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI or mlruns/mlflow.db)")
    args = ap.parse_args(argv)
    try:
        from mlflow.tracking import MlflowClient

        uri = resolve_uri(args.tracking_uri)
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(args.experiment)
        if exp is None:
            raise XPError(f"--experiment {args.experiment}: no such experiment in {uri}")
        filters = [f for f in (args.filter, f"tags.mlflow.parentRunId = '{args.parent}'" if args.parent else "") if f]
        try:
            runs = client.search_runs([exp.experiment_id], " and ".join(filters), max_results=5000)
        except Exception as e:
            raise XPError(f"--filter {args.filter!r}: MLflow cannot use it ({one_line(e)[:200]})") from e
        runs = [r for r in runs if r.info.status == "FINISHED" and "xp.sweep" not in r.data.tags
                and "xp.report" not in r.data.tags and "derived.global_batch" in r.data.params]
        if not runs:
            raise XPError(f"no finished xp runs match in experiment {args.experiment} ({uri})")
        out = Path(args.out or f"reports/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
        md = build_report(runs, out, f"xp report: {args.experiment}" + (f", sweep {args.parent}" if args.parent else ""),
                          history=client.get_metric_history)
        target = args.parent or client.create_run(exp.experiment_id, run_name="report", tags={"xp.report": "true"}).info.run_id
        client.log_artifacts(target, str(out), "report")
        if not args.parent:
            client.set_terminated(target, "FINISHED")
    except XPError as e:
        print(f"xp.report: error: {one_line(e)}", file=sys.stderr)
        return 2
    print(f"{md} ({len(runs)} runs); logged to MLflow run {target} under report/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
