"""Reports: the seeds' comparison table, scaling efficiency, accuracy and cost plots.

    python -m xp.report                         # every finished run of experiment xp
    python -m xp.report --parent RUN_ID         # the runs of one sweep or study
    python -m xp.report --filter "params.model.name = 'resnet18'" --out reports/r18

Writes report.md and PNG plots (xp.report.plots) into --out and logs them to MLflow on the sweep's or study's
parent run (--parent), or on the run --run names (a whole experiment's report is not logged otherwise), where
report.html shows the report with its plots inside it (MLflow's artifact view shows it as it is), and report.md's
images point at the MLflow UI given (--ui-url, $XP_UI_URL, an http tracking URI: MLflow's Markdown preview shows
only absolute image links), else beside it, as on disk. A study's trials are shown as its study (each
study apart, with its parent's search space), every other run as a run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from xp.report import claims, plots, population, study
from xp.states import RunStatus, TrialState
from xp.report.table import COST, COST_NOTE, md_table, swept_columns
from xp.tracking.models import RUN_TAG
from xp.results import num as _num, row_from_mlflow


# --- the report ------------------------------------------------------------------------

# params that say where or how a run was tracked or launched, not what it trained
NOT_SETTINGS = ("derived.", "version.", "summary.", "diagnosis.", "sweep.", "optuna.", "hydra.", "tracking_uri",
                "experiment", "run_name", "launcher.", "host_ip", "checkpoint_dir", "resume", "save_params")
SETTING = ("launcher.name",)  # which launcher is a setting a comparison may vary; its hosts and keys are not


def report_row(run: Any) -> dict[str, Any]:
    """Everything the report needs from one xp run in MLflow."""
    p, tags = run.data.params, run.data.tags
    devices = int(_num(p.get("derived.num_devices")) or 1) * int(_num(p.get("derived.workers")) or 1)
    kind = str(p.get("derived.devices") or "")[:3] or None  # "gpu(0),gpu(1)" -> gpu
    row = {**row_from_mlflow(run), "infrastructure": p.get("hardware.name", "?"), "backend": p.get("backend.name"),
           "dataset": p.get("dataset.name"), "dtype": p.get("dtype.name"), "devices": devices,
           "device_type": kind if kind in ("gpu", "cpu") else None,
           "global_batch": _num(p.get("derived.global_batch")), "lr": _num(p.get("derived.effective_lr")),
           "batch": _num(p.get("batch")), "seed": p.get("seed"), "run_id": run.info.run_id,
           "start_ms": run.info.start_time, "end_ms": run.info.end_time,
           "trial": int(tags["optuna.trial_number"]) if "optuna.trial_number" in tags else None,
           "parent": tags.get("mlflow.parentRunId"), "study": tags.get("optuna.study"),
           "logged_model": tags.get(RUN_TAG, "-"),  # model.log: its model's URI
           "settings": {k: v for k, v in p.items() if k in SETTING or not k.startswith(NOT_SETTINGS)}, **claims.recipe_of(tags)}
    if _num(p.get("derived.cost_per_hour")) == 0:
        row["cost_usd"] = None  # hardware without a price: no cost, not $0
    from xp.studies.confirm import SUFFIX

    confirming = str(row["study"] or "").endswith(SUFFIX)  # a run that confirms a study's best (its own numbering)
    row["trial_cell"] = None if row["trial"] is None else f"confirm {row['trial']}" if confirming else row["trial"]
    return row


def repeated(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs whose settings are the same but for their seed: median and spread (min-max) per group."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[tuple(sorted((k, v) for k, v in r["settings"].items() if k != "seed"))].append(r)
    out = []
    for runs in groups.values():
        if len(runs) < 2:
            continue
        first = runs[0]
        out.append({"model": first["model"], "backend": first["backend"], "batch": first["batch"],
                    "devices": first["devices"], "lr": first["lr"], "runs": len(runs),
                    "seeds": " ".join(sorted(str(r["seed"]) for r in runs)),
                    **_spread(runs, "val_accuracy", "{:.4f}"), **_spread(runs, "throughput", "{:.1f}")})
    return out


def _spread(runs: list[dict[str, Any]], key: str, fmt: str) -> dict[str, Any]:
    vals = sorted(r[key] for r in runs if r.get(key) is not None)
    if not vals:
        return {}
    return {f"{key}_median": statistics.median(vals), f"{key}_range": f"{fmt.format(vals[0])} - {fmt.format(vals[-1])}"}


def epoch_noise(history: Callable[[str, str], list[Any]], run_id: str, last: int = 3) -> float | None:
    """How much a run's val_accuracy moves from epoch to epoch at its end: the standard deviation of its last
    `last` epochs (None with fewer)."""
    values = [m.value for m in sorted(history(run_id, "val_accuracy"), key=lambda m: m.step)][-last:]
    return statistics.stdev(values) if len(values) >= last else None


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


def _but_backend(r: dict[str, Any]) -> tuple:
    """A run's settings but its backend's own and its seed (repeats): what runs compared across backends share."""
    return (r["infrastructure"], r["devices"], r["global_batch"], r["lr"],
            tuple(sorted((k, str(v)) for k, v in r["settings"].items() if not k.startswith("backend.") and k != "seed")))


def backends(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same experiment on different backends, side by side: groups of runs that differ only in their
    backend (every other setting the same: model, data, dtype, batch, devices, epochs, lr... and infrastructure;
    the seed aside), medians per backend, samples/s relative to the group's fastest backend."""
    groups: dict[tuple, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("backend"):
            groups[_but_backend(r)][r["backend"]].append(r)
    out = []
    for by_backend in groups.values():
        if len(by_backend) < 2:
            continue
        group = []
        for backend, runs in sorted(by_backend.items()):
            def median(k: str) -> float | None:
                vals = [r[k] for r in runs if r.get(k) is not None]
                return statistics.median(vals) if vals else None

            first = runs[0]
            group.append({"model": first["model"], "dataset": first["dataset"], "dtype": first["dtype"],
                          "batch": first["batch"], "devices": first["devices"],
                          "infrastructure": first["infrastructure"], "backend": backend, "runs": len(runs),
                          "epochs": first["settings"].get("epochs"), "lr": first["lr"],
                          "throughput": median("throughput"), "val_accuracy": median("val_accuracy"),
                          "epoch_time_s": median("epoch_time_s")})
        fastest = max((g["throughput"] or 0.0) for g in group)
        for g in group:
            g["relative"] = g["throughput"] / fastest if g["throughput"] and fastest else None
        out += group
    return out


def backends_unlike(rows: list[dict[str, Any]]) -> list[str]:
    """Where runs of several backends are in the report but none differs from another only in its backend: the
    settings that differ between the backends' runs (so the reader knows why they are not compared)."""
    by_backend: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("backend"):
            by_backend[r["backend"]].append(r)
    if len(by_backend) < 2 or backends(rows):
        return []
    keys = sorted({k for r in rows for k in r["settings"] if not k.startswith("backend.") and k != "seed"})
    values = {b: {k: {str(r["settings"].get(k)) for r in runs} for k in keys} for b, runs in by_backend.items()}
    differ = [k for k in keys if len({frozenset(v[k]) for v in values.values()}) > 1]
    return [f"Backends side by side: not compared. The runs of {', '.join(sorted(by_backend))} differ in more "
            f"than their backend ({', '.join(differ[:8]) or 'their infrastructure'}); run the same settings on each "
            "backend to compare them.", ""]


def seed_columns(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The classic table's columns; the devices column says what the devices are (GPUs on GPU runs)."""
    kinds = {str(r.get("device_type")) for r in rows}
    devices = {frozenset({"gpu"}): "GPUs", frozenset({"cpu"}): "CPU devices"}.get(frozenset(kinds), "devices")
    return [("infrastructure", "infrastructure", "{}"), ("model", "model", "{}"), ("backend", "backend", "{}"),
            ("batch", "batch/device", "{:g}"), ("global_batch", "global batch", "{:g}"),
            ("devices_cell" if devices == "devices" else "devices", devices, "{}"),
            ("val_accuracy", "val acc (last epoch)", "{:.4f}"), ("best_val_accuracy", "val acc (best epoch)", "{:.4f}"),
            ("epochs", "epochs", "{}"), ("epoch_time_s", "s/epoch", "{:.2f}"), ("throughput", "samples/s", "{:.1f}"),
            ("gpu_utilization", "GPU util", "{:.0f}%"), COST, ("run_id", "run id", "{}")]


# settings the classic table has columns for (epochs: the epochs trained, which a finished run's setting is)
SHOWN = ("batch", "model.name", "backend.name", "hardware.name", "epochs")


def with_swept(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The classic table's columns with the settings these runs varied (a sweep's, a study's parameters) after
    the batch's, a study's trial number first: rows that differ tell how."""
    at = next(i for i, c in enumerate(columns) if c[0] == "global_batch") + 1
    trial = [("trial_cell", "trial", "{}")] if any(r["trial"] is not None for r in rows) else []
    return [*trial, *columns[:at], *swept_columns(rows, SHOWN), *columns[at:]]


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
                    "cost_usd": m.get("cost_usd"), "cost_on_demand_usd": m.get("cost_on_demand_usd"),
                    "val_accuracy": m.get("val_accuracy")})
    return out


ACCURACY_NOTE = ("val acc (last epoch) is the accuracy the run ended with; val acc (best epoch) the highest any "
                 "of the epochs it trained reached (best_val_accuracy; a run that started from another's commit, a "
                 "PBT interval: of its own epochs; on a sweep's parent, the highest of its runs').")


def build_report(runs: list[Any], out: Path, title: str, history: Callable[[str, str], list[Any]] | None = None,
                 studies: dict[str | None, study.StudyParent] | None = None) -> Path:
    """Write report.md and the plots for these MLflow runs into `out`; return report.md's path.
    `history(run_id, key)` (MlflowClient.get_metric_history) adds each run's epoch-to-epoch noise and elastic
    runs' worker counts over time; `studies`: what the report knows of the parent run of each study whose trials
    are among the runs (its search space, its registered model), by the parent's run id (None: trials whose
    parent is not known). A study's trials get a section of their own; the other runs are runs."""
    out.mkdir(parents=True, exist_ok=True)
    rows = sorted((report_row(r) for r in runs), key=lambda r: (r["model"] or "", r["devices"], r["batch"] or 0,
                                                                   r["trial"] or 0))
    for r in rows:
        r["devices_cell"] = f"{r['devices']} {r['device_type'] or ''}".strip()
        r["noise"] = epoch_noise(history, r["run_id"]) if history else None
    done = [r for r in rows if r["state"] != TrialState.PRUNED]
    pruned = len(rows) - len(done)
    counts = f"{len(rows)} runs" + (f" ({len(done)} in the table below, {pruned} pruned trials under their study's "
                                    "Trials)" if pruned else "")
    lines = [f"# {title}", "", f"{counts}, written {time.strftime('%Y-%m-%d %H:%M')}. {ACCURACY_NOTE}", "",
             md_table(done, with_swept(done, seed_columns(done))), "",
             *([COST_NOTE, ""] if any(r.get("cost_usd") is not None for r in done) else [])]
    files: list[Path] = []
    lines += claims.section(done, out, files, md_table, history)
    lines += study.sections(rows, studies or {}, out, files) + _repeats(done)
    lines += population.section(runs, history, out, files, studies or {}) if history else []
    lines += _scaling_and_backends(done, out, files)
    lines += _elastic(runs, history, out, files) if history else []
    lines += _plots(done, out, files)
    for f in files:
        lines += [f"![{f.stem}]({f.name})", ""]
    md = out / "report.md"
    md.write_text("\n".join(lines))
    return md


def _repeats(rows: list[dict[str, Any]]) -> list[str]:
    groups = repeated(rows)
    if not groups:
        return []
    return ["## Repeated settings", "", "Runs with the same settings but their seed: median and range (min - max).", "",
            md_table(groups, [("model", "model", "{}"), ("backend", "backend", "{}"), ("batch", "batch/device", "{:g}"),
                               ("devices", "devices", "{}"), ("lr", "effective lr", "{:.4g}"), ("runs", "runs", "{}"),
                               ("seeds", "seeds", "{}"), ("val_accuracy_median", "val acc (last), median", "{:.4f}"),
                               ("val_accuracy_range", "range", "{}"),
                               ("throughput_median", "samples/s, median", "{:.1f}"),
                               ("throughput_range", "range", "{}")]), ""]


def _scaling_and_backends(rows: list[dict[str, Any]], out: Path, files: list[Path]) -> list[str]:
    scale, side, lines = scaling(rows), backends(rows), []
    if scale:
        plots.scaling_plot(scale, out, files)
        lines += ["## Scaling", "", "Efficiency = throughput(N) / (N x throughput(1)).", "",
                  md_table(scale, [("model", "model", "{}"), ("backend", "backend", "{}"), ("batch", "batch/device", "{:g}"),
                                    ("devices", "devices", "{}"), ("throughput", "samples/s", "{:.1f}"),
                                    ("ideal", "ideal", "{:.1f}"), ("efficiency", "efficiency", "{:.1%}")]), ""]
    if side:
        plots.backends_plot(side, out, files)
        lines += ["## Backends side by side", "",
                  "Runs that differ only in their backend (every other setting the same; medians of its runs, "
                  "whatever their seeds); relative = samples/s against the fastest backend of the group.", "",
                  md_table(side, [("model", "model", "{}"), ("dtype", "dtype", "{}"), ("batch", "batch/device", "{:g}"),
                                   ("devices", "devices", "{}"), ("epochs", "epochs", "{}"), ("lr", "effective lr",
                                                                                               "{:.4g}"),
                                   ("backend", "backend", "{}"), ("runs", "runs", "{}"),
                                   ("throughput", "samples/s", "{:.1f}"), ("relative", "relative", "{:.0%}"),
                                   ("val_accuracy", "val acc (last epoch)", "{:.4f}"),
                                   ("epoch_time_s", "s/epoch", "{:.2f}")]), ""]
    return lines + backends_unlike(rows)


def _elastic(runs: list[Any], history: Callable[[str, str], list[Any]], out: Path, files: list[Path]) -> list[str]:
    timeline = elastic_timeline(runs, history)
    if not timeline:
        return []
    plots.timeline_plot(timeline, out, files)
    return ["## Elastic runs", "", "Workers per epoch; worker-hours of training; cost (billed) as everywhere (every "
            "worker an instance, at a spot trace's prices where it has one), and the same instance time at on-demand "
            "prices.", "",
            md_table([{**t, "workers": " ".join(f"{w:g}" for w in t["workers"])} for t in timeline],
                      [("run", "run", "{}"), ("workers", "workers per epoch", "{}"),
                       ("worker_hours", "worker-hours", "{:.4f}"), COST,
                       ("cost_on_demand_usd", "at on-demand prices", "${:.4f}"),
                       ("val_accuracy", "val acc (last epoch)", "{:.4f}")]),
            ""]


def _plots(rows: list[dict[str, Any]], out: Path, files: list[Path]) -> list[str]:
    """Accuracy, throughput against batch, and cost where there is a price; the notes that go with them."""
    lines = []
    if any(r.get("val_accuracy") is not None for r in rows):
        lines += ["## Plots", "", f"Accuracy: {plots.accuracy_plot(rows, out, files)}.", ""]
    if plots.throughput_plot(rows, out, files):
        lines += ["Throughput against batch per device: median of the runs at each batch, bars their range.", ""]
    costed = [r for r in rows if r.get("cost_usd") is not None and r.get("val_accuracy") is not None]
    if costed:
        plots.cost_plot(costed, out, files)
    else:
        lines += ["Cost: no plot; these runs ran on hardware without a price (hardware.price_per_hour=0, e.g. "
                  "hardware=local). Choose an instance (hardware=p3.8xlarge) or set hardware.price_per_hour=USD.", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    from xp.errors import XPError, one_line
    from xp.tracking.stores import resolve_uri

    ap = argparse.ArgumentParser(prog="python -m xp.report", description="Tables and plots from xp's MLflow runs.")
    ap.add_argument("--experiment", default="xp", help="MLflow experiment (default: xp)")
    ap.add_argument("--parent", help="only the runs of this sweep or study (its parent run id)")
    ap.add_argument("--filter", default="", help="an MLflow filter string, e.g. \"params.model.name = 'lenet'\"")
    ap.add_argument("--run", help="log the report on this run (default: on --parent's; without either it stays in "
                                  "--out only)")
    ap.add_argument("--out", help="output folder (default: reports/<time>)")
    ap.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI or mlruns/mlflow.db)")
    ap.add_argument("--ui-url", help="the logged report.md's images link to this MLflow UI (default: $XP_UI_URL, an "
                                     "http tracking URI; report.html shows them without it)")
    args = ap.parse_args(argv)
    try:
        from xp.tracking.stores import open_client

        uri = resolve_uri(args.tracking_uri)
        client = open_client(uri)
        exp = client.get_experiment_by_name(args.experiment)
        if exp is None:
            raise XPError(f"--experiment {args.experiment}: no such experiment in {uri}")
        runs = _finished_runs(client, exp.experiment_id, args)
        out = Path(args.out or f"reports/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
        parent = client.get_run(args.parent) if args.parent else None
        title = f"xp report: {args.experiment}" + (f", {parent.info.run_name} ({args.parent})" if parent else "")
        md = build_report(runs, out, title, history=client.get_metric_history, studies=study.parents(client, runs))
        ui = args.ui_url or os.environ.get("XP_UI_URL") or (uri if uri.startswith(("http://", "https://")) else "")
        target = args.run or args.parent
        if target:
            from xp.report.publish import publish

            publish(client, target, out, ui)
    except XPError as e:
        print(f"xp.report: error: {one_line(e)}", file=sys.stderr)
        return 2
    where = (f"logged to MLflow run {target} under report/ (report.html: the report with its plots)" if target else
             "not logged to MLflow (--parent RUN_ID logs a sweep's or study's report on its parent, --run RUN_ID on "
             "a run you name)")
    print(f"{md} ({len(runs)} runs); {where}")
    return 0


def _of_parent(client: Any, parent: str) -> list[str]:
    """The filters of a parent's runs: a sweep's children, or a study's trials and the runs that confirm its best
    (xp.studies.confirm), whichever command of the study ran them (a resumed study's parent has only its own
    command's; the study's answer is all of them)."""
    from xp.studies.confirm import name_of

    try:
        name = client.get_run(parent).data.tags.get("optuna.study")
    except Exception:  # (no such run: the search says there are no runs)
        name = None
    if not name:
        return [f"tags.mlflow.parentRunId = '{parent}'"]
    return [f"tags.`optuna.study` = '{name}'", f"tags.`optuna.study` = '{name_of(name)}'"]


def _finished_runs(client: Any, experiment_id: str, args: Any) -> list[Any]:
    from xp.errors import XPError, one_line
    from xp.readback.work import search_all

    runs: dict[str, Any] = {}
    for by in _of_parent(client, args.parent) if args.parent else [""]:
        filters = [f for f in (args.filter, by) if f]
        try:
            runs.update({r.info.run_id: r for r in search_all(client, [experiment_id], " and ".join(filters))})
        except Exception as e:
            raise XPError(f"--filter {args.filter!r}: MLflow cannot use it ({one_line(e)[:200]})") from e
    found = [r for r in runs.values() if r.info.status == RunStatus.FINISHED and "xp.sweep" not in r.data.tags
             and "xp.report" not in r.data.tags and "derived.global_batch" in r.data.params]
    if not found:
        raise XPError(f"no finished xp runs match in experiment {args.experiment} ({client.tracking_uri})")
    return found


if __name__ == "__main__":
    sys.exit(main())
