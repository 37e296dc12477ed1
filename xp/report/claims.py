"""The report's seed-claims section: for each recipe's runs (sweeps/*.yaml with a `claim`; its trials carry the
tags xp.recipe and xp.claim), the figure the seed published, the figure measured here from the runs' own
metrics, and whether the claim's direction holds on this machine, with the reason when the figure cannot match.

- scaling: efficiency(N) = throughput(N) / (N x throughput(1)) and val accuracy per device count N; the claim's
  direction (accuracy holds as devices grow, with the linear scaling rule and warm-up) holds when accuracy at
  every N stays within the claim's accuracy_tolerance of N=1's.
- input_pipeline: throughput against decode threads (data_nthreads), the knee (the fewest threads within 5% of
  the best) and each point's diagnosis (diagnose=true: input-bound, compute-bound, ...); the direction (more
  decode threads lift an input-bound pipeline) holds when the best is faster than 1 thread and the pipeline is
  input-bound at 1 thread and not at the knee.
- batch: throughput and accuracy against the per-device batch up to batch=auto's largest; the direction (the
  largest batch that fits buys throughput) holds when it is faster than the smallest; how far accuracy holds.
- dynamic: the elastic run on a spot trace against the fixed on-demand run: accuracy, time and cost.
- finetune: accuracy per epoch of the trial fine-tuned from pretrained weights and the one from scratch.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from xp.report.table import COST

KNEE = 0.95  # the knee: the fewest threads reaching this share of the best throughput


def recipe_of(tags: dict[str, str]) -> dict[str, Any]:
    """What a run's tags say of its recipe (report_row's fields): its name, claim and where it ran."""
    if "xp.recipe" not in tags:
        return {}
    try:
        claim = json.loads(tags.get("xp.claim") or "{}")
    except ValueError:
        claim = {}
    return {"recipe": tags["xp.recipe"], "claim": claim, "cores": _count(tags.get("xp.cores", "")),
            "diagnosis": tags.get("xp.diagnosis")}


def _count(cores: str) -> int | None:
    """4 for "0-3"; 3 for "0,2-3"; None for nothing."""
    n = 0
    for part in filter(None, cores.split(",")):
        lo, _, hi = part.partition("-")
        if not lo.strip().isdigit() or (hi and not hi.strip().isdigit()):
            return None
        n += int(hi or lo) - int(lo) + 1
    return n or None


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def scaling(rows: list[dict[str, Any]], claim: dict[str, Any],
            history: Callable[[str, str], list[Any]] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per device count: median samples/s, efficiency against N=1, median val accuracy and its change from N=1;
    and the verdict."""
    by_n: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_n[int(r["devices"])].append(r)
    points: list[dict[str, Any]] = []
    for n in sorted(by_n):
        points.append({"devices": n, "throughput": _median(by_n[n], "throughput"),
                       "val_accuracy": _median(by_n[n], "val_accuracy"), "runs": len(by_n[n])})
    base = next((p for p in points if p["devices"] == 1), None)
    if base is None or not base["throughput"] or len(points) < 2:
        return points, {"holds": None, "measured": "-", "why": "needs runs at 1 device and at least one more count"}
    tol = float(claim.get("accuracy_tolerance", 0.01))
    for p in points:
        p["ideal"] = p["devices"] * base["throughput"]
        p["efficiency"] = p["throughput"] / p["ideal"] if p["throughput"] else None
        if p["val_accuracy"] is not None and base["val_accuracy"] is not None:
            p["accuracy_change"] = p["val_accuracy"] - base["val_accuracy"]
    top = points[-1]
    kind = {"gpu": "GPUs", "cpu": "CPU contexts"}.get(rows[0].get("device_type") or "", "devices")
    changes = [abs(p["accuracy_change"]) for p in points if p.get("accuracy_change") is not None]
    holds = bool(changes) and max(changes) <= tol
    cores = max((r.get("cores") or 0 for r in rows), default=0)
    why = (f"accuracy {'holds' if holds else 'does not hold'} with the linear scaling rule and warm-up: at most "
           f"{max(changes) * 100:.1f} points from 1 device's (tolerance {tol * 100:.1f})" if changes
           else "no accuracy to compare (synthetic data?)")
    if kind == "CPU contexts" and cores and top["devices"] >= cores:
        why += (f"; efficiency {top['efficiency']:.0%} at {top['devices']} CPU contexts: they share {cores} "
                f"core{'s' if cores > 1 else ''}, so more contexts add gradient aggregation, not compute "
                "(communication-bound: expected here, not a contradiction of the seed's GPU figure)")
    return points, {"holds": holds, "why": why,
                    "measured": f"{top['efficiency']:.0%} at {top['devices']} {kind}"}


def input_pipeline(rows: list[dict[str, Any]], claim: dict[str, Any], history: Callable[[str, str], list[Any]] | None
                   = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per decode-thread count: median samples/s, its ratio to 1 thread, the diagnosis; the knee and the verdict."""
    by_t: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        threads = r["settings"].get("data_nthreads")
        if str(threads).isdigit():
            by_t[int(threads)].append(r)
    points: list[dict[str, Any]] = [
        {"threads": t, "throughput": _median(by_t[t], "throughput"), "runs": len(by_t[t]),
         "diagnosis": statistics.mode([r.get("diagnosis") or "-" for r in by_t[t]])} for t in sorted(by_t)]
    points = [p for p in points if p["throughput"]]
    if len(points) < 2:
        return points, {"holds": None, "measured": "-", "why": "needs runs at two decode-thread counts at least"}
    first, best = points[0], max(points, key=lambda p: p["throughput"])
    knee = next(p for p in points if p["throughput"] >= KNEE * best["throughput"])
    for p in points:
        p["speedup"] = p["throughput"] / first["throughput"]
        p["knee"] = "knee" if p is knee else ""
    speedup = best["throughput"] / first["throughput"]
    holds = speedup > 1 and first["diagnosis"] == "input-bound" and knee["diagnosis"] != "input-bound"
    why = (f"{first['threads']} thread{'s' if first['threads'] > 1 else ''}: {first['diagnosis']}; the knee at "
           f"{knee['threads']} threads: {knee['diagnosis']}")
    cores = max((r.get("cores") or 0 for r in rows), default=0)
    if cores and knee["threads"] >= cores:
        why += f"; this machine has {cores} cores: decoding and training share them beyond that"
    return points, {"holds": holds, "why": why,
                    "measured": f"{speedup:.2f}x from {first['threads']} to {best['threads']} threads"}


def dynamic(rows: list[dict[str, Any]], claim: dict[str, Any],
            history: Callable[[str, str], list[Any]] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The elastic run on a spot trace against the fixed on-demand one: accuracy, wall time and cost, to the end
    and to the target (the lower of the two final accuracies: the first epoch reaching it). Each run's figures are
    its own metrics at each epoch: elapsed_s (the job's wall clock from its start: start-up and, elastic, every
    relaunch included) and cost_usd (xp's one cost: that time billed for every instance, the elastic run's at the
    trace's spot prices of each moment, the fixed run's at the on-demand price)."""
    points: list[dict[str, Any]] = []
    for r in sorted(rows, key=lambda r: str(r["settings"].get("elastic.enabled")) != "True"):
        elastic = str(r["settings"].get("elastic.enabled")) == "True"

        def per_step(key: str) -> dict[int, float]:
            return {m.step: m.value for m in history(r["run_id"], key)} if history else {}

        acc, clock, bill = per_step("val_accuracy"), per_step("elapsed_s"), per_step("cost_usd")
        workers = int(float(r["settings"].get("workers") or 1))
        price = ("the trace's spot prices" if elastic else
                 f"{workers} x ${float(r['settings'].get('hardware.price_per_hour') or 0.0):.2f}/h on-demand")
        points.append({"run": "elastic, spot trace" if elastic else "fixed, on-demand", "elastic": elastic,
                       "val_accuracy": r.get("val_accuracy"), "acc": acc, "clock": clock, "bill": bill,
                       "time_s": clock[max(clock)] if clock else None, "cost_usd": bill[max(bill)] if bill else None,
                       "prices": price})
    both = [p for p in points if p["val_accuracy"] is not None]
    if len({p["elastic"] for p in both}) < 2:
        return points, {"holds": None, "measured": "-", "why": "needs the elastic run and the fixed run"}
    target = min(p["val_accuracy"] for p in both)
    for p in both:
        step = next((s for s in sorted(p["acc"]) if p["acc"][s] >= target), None)
        p["target_time_s"] = p["clock"].get(step) if step is not None else None
        p["target_cost_usd"] = p["bill"].get(step) if step is not None else None
    el, fx = (next(p for p in both if p["elastic"] is e) for e in (True, False))
    tol = float(claim.get("accuracy_tolerance", 0.01))
    agree = abs(el["val_accuracy"] - fx["val_accuracy"]) <= tol
    saving = 1 - el["cost_usd"] / fx["cost_usd"] if el["cost_usd"] and fx["cost_usd"] else None
    holds = agree and saving is not None and saving > 0
    why = (f"accuracy {el['val_accuracy']:.4f} elastic against {fx['val_accuracy']:.4f} fixed "
           f"({'within' if agree else 'outside'} {tol * 100:.1f} points); cost ${el['cost_usd']:.4f} at "
           f"{el['prices']} against ${fx['cost_usd']:.4f} at {fx['prices']}; time {el['time_s']:.1f} s against "
           f"{fx['time_s']:.1f} s (each membership change relaunches the job: seconds here)")
    for p in points:
        p.pop("acc"), p.pop("clock"), p.pop("bill")
    return points, {"holds": holds, "why": why, "target": target,
                    "measured": f"{saving:.0%} cheaper" if saving is not None else "-"}


def batch(rows: list[dict[str, Any]], claim: dict[str, Any],
          history: Callable[[str, str], list[Any]] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per per-device batch: median samples/s and its ratio to the smallest batch, the effective lr, median val
    accuracy and its change from the smallest batch's. The largest batch is the ladder's top (batch=auto's). The
    direction (the largest batch that fits buys throughput) holds when the largest is faster than the smallest;
    the accuracy found alongside is said in `why`: the largest batch still within accuracy_tolerance."""
    by_b: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("batch"):
            by_b[int(r["batch"])].append(r)
    points: list[dict[str, Any]] = [
        {"batch": b, "throughput": _median(by_b[b], "throughput"), "lr": _median(by_b[b], "lr"),
         "val_accuracy": _median(by_b[b], "val_accuracy"), "runs": len(by_b[b])} for b in sorted(by_b)]
    points = [p for p in points if p["throughput"]]
    if len(points) < 2:
        return points, {"holds": None, "measured": "-", "why": "needs runs at two batches at least"}
    first, top = points[0], points[-1]
    tol = float(claim.get("accuracy_tolerance", 0.01))
    for p in points:
        p["speedup"] = p["throughput"] / first["throughput"]
        if p["val_accuracy"] is not None and first["val_accuracy"] is not None:
            p["accuracy_change"] = p["val_accuracy"] - first["val_accuracy"]
    kept = [p for p in points if p.get("accuracy_change") is not None and p["accuracy_change"] >= -tol]
    fastest = max(points, key=lambda p: p["throughput"])
    why = (f"batch {top['batch']}: {top['speedup']:.2f}x the throughput of batch {first['batch']}; the fastest is "
           f"batch {fastest['batch']}")
    if kept:
        why += (f"; accuracy stays within {tol * 100:.1f} points of batch {first['batch']}'s up to batch "
                f"{max(p['batch'] for p in kept)} with the linear scaling rule and warm-up")
        if top not in kept and top.get("val_accuracy") is not None:
            why += (f"; at batch {top['batch']} (lr {top['lr']:g}) it reaches {top['val_accuracy']:.4f} in the same "
                    "epochs: fewer, larger steps than the rule carries here")
    return points, {"holds": top["speedup"] > 1, "why": why,
                    "measured": f"{top['batch']} per device, {top['speedup']:.2f}x the throughput of {first['batch']}"}


def finetune(rows: list[dict[str, Any]], claim: dict[str, Any],
             history: Callable[[str, str], list[Any]] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The fine-tuned trial (pretrained=weights) against the one from scratch (pretrained=none): val accuracy after
    each epoch (the runs' logged history). The direction (pretrained weights buy accuracy at equal epochs) holds
    when the fine-tuned run is ahead after the first epoch and after the last."""
    points: list[dict[str, Any]] = []
    for r in sorted(rows, key=lambda r: str(r["settings"].get("pretrained")) not in ("none", "None", "")):
        weights = str(r["settings"].get("pretrained") or "none")
        per_epoch = {m.step: m.value for m in history(r["run_id"], "val_accuracy")} if history else {}
        points.append({"run": "from scratch" if weights in ("none", "None") else "fine-tuned", "weights": weights,
                       "per_epoch": [per_epoch[k] for k in sorted(per_epoch)], "val_accuracy": r.get("val_accuracy")})
    scratch = next((p for p in points if p["run"] == "from scratch" and p["per_epoch"]), None)
    tuned = next((p for p in points if p["run"] == "fine-tuned" and p["per_epoch"]), None)
    if scratch is None or tuned is None:
        return points, {"holds": None, "measured": "-", "why": "needs a fine-tuned and a from-scratch run"}
    n = min(len(scratch["per_epoch"]), len(tuned["per_epoch"]))
    first, last = (tuned["per_epoch"][i] - scratch["per_epoch"][i] for i in (0, n - 1))
    for p in points:
        p.update({f"epoch {i + 1}": p["per_epoch"][i] for i in range(min(n, len(p["per_epoch"])))})
    holds = first > 0 and last > 0
    why = (f"fine-tuned {tuned['per_epoch'][n - 1]:.4f} against {scratch['per_epoch'][n - 1]:.4f} from scratch after "
           f"{n} epoch{'s' if n > 1 else ''} ({last * 100:+.1f} points; {first * 100:+.1f} after the first)")
    return points, {"holds": holds, "why": why, "epochs": n,
                    "measured": f"{tuned['per_epoch'][n - 1]:.1%} fine-tuned, {scratch['per_epoch'][n - 1]:.1%} "
                                f"from scratch at {n} epochs"}


KINDS = {"scaling": scaling, "input_pipeline": input_pipeline, "dynamic": dynamic, "batch": batch,
         "finetune": finetune}


def section(rows: list[dict[str, Any]], out: Path, files: list[Path], md_table: Callable[..., str],
            history: Callable[[str, str], list[Any]] | None = None) -> list[str]:
    """The seed-claims section of report.md (empty without recipe runs), its plots added to `files`."""
    from xp.report import plots

    recipes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("recipe") and r.get("claim", {}).get("kind") in KINDS:
            recipes[r["recipe"]].append(r)
    if not recipes:
        return []
    summary, detail = [], []
    for name, mine in sorted(recipes.items()):
        claim = mine[-1]["claim"]
        kind = claim["kind"]
        points, verdict = KINDS[kind](mine, claim, history)
        figure = claim["figure"]
        seed = {"input_pipeline": f"{figure:g}x", "batch": f"{figure:g}", "finetune": f"{figure:.1%}"}.get(
            kind, f"{figure:.0%}")
        seed = (claim.get("at", seed) if kind == "dynamic" else f"{seed} per device ({claim.get('at', '?')})"
                if kind == "batch" else f"{seed} at {claim.get('at', '?')}")
        summary.append({"recipe": name, "seed": seed, "here": verdict["measured"],
                        "holds": {True: "holds", False: "does not hold", None: "-"}[verdict["holds"]],
                        "source": claim.get("source", "")})
        detail += [f"### {name}", "", f"Seed: {claim.get('source', '')}: {seed}. "
                   f"Here: {verdict['measured']}. Direction: {summary[-1]['holds']} ({verdict['why']}).", ""]
        if claim["kind"] == "scaling":
            detail += [md_table(points, [("devices", "devices", "{}"), ("throughput", "samples/s", "{:.1f}"),
                                          ("ideal", "ideal", "{:.1f}"), ("efficiency", "efficiency", "{:.1%}"),
                                          ("val_accuracy", "val acc (last epoch)", "{:.4f}"),
                                          ("accuracy_change", "vs 1 device", "{:+.4f}"), ("runs", "runs", "{}")]), ""]
            plots.efficiency_plot(name, points, figure, str(claim.get("at", "")), _number(claim.get("at")), out,
                                  files)
        elif claim["kind"] == "dynamic":
            detail += [md_table(points, [("run", "run", "{}"), ("val_accuracy", "val acc (last epoch)", "{:.4f}"),
                                         ("time_s", "wall time, s", "{:.1f}"), COST,
                                         ("target_time_s", f"time to {verdict.get('target', 0):.4f}, s", "{:.1f}"),
                                         ("target_cost_usd", "cost (billed) to it", "${:.4f}"), ("prices", "prices", "{}")]),
                       ""]
            plots.dynamic_plot(name, points, out, files)
        elif claim["kind"] == "finetune":
            epochs = [(f"epoch {i + 1}", f"epoch {i + 1}", "{:.4f}") for i in range(verdict.get("epochs", 0))]
            detail += [md_table(points, [("run", "run", "{}"), *epochs, ("weights", "weights", "{}")]), ""]
            plots.finetune_plot(name, points, figure, str(claim.get("at", "")), out, files)
        elif claim["kind"] == "batch":
            detail += [md_table(points, [("batch", "batch/device", "{}"), ("lr", "effective lr", "{:.4g}"),
                                         ("throughput", "samples/s", "{:.1f}"), ("speedup", "vs smallest", "{:.2f}x"),
                                         ("val_accuracy", "val acc (last epoch)", "{:.4f}"),
                                         ("accuracy_change", "vs smallest", "{:+.4f}"), ("runs", "runs", "{}")]), ""]
            plots.batch_plot(name, points, figure, out, files)
        else:
            detail += [md_table(points, [("threads", "decode threads", "{}"), ("throughput", "samples/s", "{:.1f}"),
                                          ("speedup", "vs fewest threads", "{:.2f}x"), ("knee", "", "{}"),
                                          ("diagnosis", "diagnosis", "{}"), ("runs", "runs", "{}")]), ""]
            plots.threads_plot(name, points, out, files)
    return ["## Seed claims", "", "Each recipe's published figure beside the one measured here from its runs' "
            "own metrics; the direction says whether the claim's effect shows on this machine.", "",
            md_table(summary, [("recipe", "recipe", "{}"), ("seed", "seed", "{}"), ("here", "here", "{}"),
                                ("holds", "direction", "{}"), ("source", "source", "{}")]), "", *detail]


def _number(text: Any) -> int | None:
    m = re.match(r"\s*(\d+)", str(text or ""))
    return int(m.group(1)) if m else None
