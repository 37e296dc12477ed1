"""The report's plots (matplotlib, imported only here). Each takes the report's rows and writes one PNG.

Accuracy is plotted honestly: every run's point carries its own epoch-to-epoch noise (the standard deviation of
its last epochs' val_accuracy) as a bar, and an axis narrower than that noise is widened, saying so.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path, files: list[Path]) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    files.append(path)


def _ticks(ax: Any, values: list[float], base: float, labelled: int = 6) -> None:
    """A log x axis labelled with the values the runs used, written plainly (64, not 2^6); with more than
    `labelled` different values (a study's sampled learning rates), the axis's own ticks, in 2 digits."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

    ax.set_xscale("log", base=base)
    few = len(set(values)) <= labelled
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(values))) if few else LogLocator(base=base))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}" if few else f"{v:.2g}"))
    ax.xaxis.set_minor_locator(NullLocator())


def scaling_plot(scale: list[dict[str, Any]], out: Path, files: list[Path]) -> None:
    fig, ax = _pyplot().subplots(figsize=(6.4, 4.4))
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


def accuracy_plot(rows: list[dict[str, Any]], out: Path, files: list[Path]) -> str:
    """Last-epoch val accuracy against global batch and learning rate; returns the note on its y axis."""
    acc = [r for r in rows if r.get("val_accuracy") is not None]
    fig, (a1, a2) = _pyplot().subplots(1, 2, figsize=(9.6, 4.2), sharey=True)
    for model in sorted({r["model"] for r in acc}, key=str):
        mine = [r for r in acc if r["model"] == model]
        bars = [r.get("noise") or 0.0 for r in mine]
        for ax, x in ((a1, "global_batch"), (a2, "lr")):
            ax.errorbar([r[x] for r in mine], [r["val_accuracy"] for r in mine], yerr=bars, fmt="o", capsize=3,
                        alpha=0.8, label=model)
            medians = _medians(mine, x)
            if medians:
                ax.scatter(*zip(*medians), marker="_", s=300, color="black", zorder=3,
                           label="median of repeats" if ax is a1 else None)
    _ticks(a1, [r["global_batch"] for r in acc], 2)
    _ticks(a2, [r["lr"] for r in acc], 10)
    a1.set_xlabel("global batch")
    a2.set_xlabel("effective learning rate")
    a1.set_ylabel("val accuracy, last epoch")
    for a in (a1, a2):
        a.grid(alpha=0.3)
    a1.legend(fontsize=8)
    note = _honest_range(a1, acc)
    fig.suptitle("Accuracy vs global batch and learning rate", fontsize=11)
    fig.text(0.5, 0.01, note, ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _save(fig, out / "accuracy.png", files)
    return note


def _medians(rows: list[dict[str, Any]], x: str) -> list[tuple[float, float]]:
    """(x, median val accuracy) of repeats: runs whose settings are all equal but their seed (runs that share
    only x, with other learning rates or momenta, are not repeats)."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[tuple(sorted((k, str(v)) for k, v in r["settings"].items() if k != "seed"))].append(r)
    return sorted((g[0][x], statistics.median(r["val_accuracy"] for r in g)) for g in groups.values() if len(g) > 1)


def _honest_range(ax: Any, acc: list[dict[str, Any]]) -> str:
    """Widen a y range tighter than the runs' own epoch-to-epoch noise to +-2 noise around its middle."""
    noises = [r["noise"] for r in acc if r.get("noise") is not None]
    if not noises:
        return "bars: none (runs of fewer than 3 epochs have no epoch-to-epoch noise to show)"
    noise = statistics.median(noises)
    values = [r["val_accuracy"] for r in acc]
    lo, hi = min(values) - max(noises), max(values) + max(noises)
    text = f"bars: each run's epoch-to-epoch noise (std of its last 3 epochs; median {noise:.4f})"
    if hi - lo < 4 * noise:
        mid = (lo + hi) / 2
        lo, hi = mid - 2 * noise, mid + 2 * noise
        text += "; y range widened to +-2x that noise: differences inside it are not differences"
    ax.set_ylim(max(0.0, lo), min(1.0, hi) if hi < 1.0 else 1.0 + 0.01 * (hi - lo))  # accuracy stops at 1
    return text


def throughput_plot(rows: list[dict[str, Any]], out: Path, files: list[Path]) -> bool:
    """samples/s against batch per device, where runs of one setting differ in their batch (median, min-max)."""
    groups: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("throughput") and r.get("batch"):
            groups[(r["model"], r["backend"], r["dtype"], r["devices"], r["infrastructure"])][r["batch"]].append(
                r["throughput"])
    groups = {k: v for k, v in groups.items() if len(v) >= 2}
    if not groups:
        return False
    fig, ax = _pyplot().subplots(figsize=(6.4, 4.2))
    for (model, backend, dtype, devices, _), by_batch in sorted(groups.items(), key=str):
        xs = sorted(by_batch)
        med = [statistics.median(by_batch[b]) for b in xs]
        err = [[m - min(by_batch[b]) for b, m in zip(xs, med)], [max(by_batch[b]) - m for b, m in zip(xs, med)]]
        ax.errorbar(xs, med, yerr=err, fmt="o-", capsize=3, label=f"{model}, {backend}, {dtype}, {devices} dev")
    _ticks(ax, [b for v in groups.values() for b in v], 2)
    ax.set_xlabel("batch per device")
    ax.set_ylabel("samples/s (median; bars: min-max of repeats)")
    ax.set_title("Throughput vs batch", fontsize=11)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, out / "throughput.png", files)
    return True


def cost_plot(costed: list[dict[str, Any]], out: Path, files: list[Path]) -> None:
    fig, ax = _pyplot().subplots(figsize=(6.4, 4.4))
    for infra in sorted({r["infrastructure"] for r in costed}):
        mine = [r for r in costed if r["infrastructure"] == infra]
        ax.scatter([r["cost_usd"] for r in mine], [r["val_accuracy"] for r in mine], label=infra)
    ax.set_xlabel("cost (billed from the job's start), USD")
    ax.set_ylabel("val accuracy, last epoch")
    accs = [r["val_accuracy"] for r in costed]
    pad = 0.05 * (max(accs) - min(accs) or 0.1)
    ax.set_ylim(max(0.0, min(accs) - pad), min(1.0, max(accs) + pad))  # accuracy lies within [0, 1]
    ax.set_title("Cost vs accuracy", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title="infrastructure")
    _save(fig, out / "cost.png", files)


def timeline_plot(timeline: list[dict[str, Any]], out: Path, files: list[Path]) -> None:
    fig, ax = _pyplot().subplots(figsize=(6.4, 3.6))
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


def backends_plot(side: list[dict[str, Any]], out: Path, files: list[Path]) -> None:
    groups = sorted({(g["model"], g["dtype"], g["batch"], g["devices"]) for g in side}, key=str)
    names = sorted({g["backend"] for g in side})
    fig, ax = _pyplot().subplots(figsize=(6.4, 3.6))
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


def efficiency_plot(name: str, points: list[dict[str, Any]], seed: float, at: str, seed_at: int | None, out: Path,
                    files: list[Path]) -> None:
    """A scaling recipe: efficiency against devices, the ideal (100%) and the seed's published point."""
    pts = [p for p in points if p.get("efficiency") is not None]
    fig, ax = _pyplot().subplots(figsize=(6.4, 4.2))
    ns = [p["devices"] for p in pts]
    ax.plot(ns, [p["efficiency"] for p in pts], "o-", label="measured here")
    for p in pts:
        ax.annotate(f"{p['efficiency']:.0%}", (p["devices"], p["efficiency"]), textcoords="offset points",
                    xytext=(6, 6), fontsize=8)
    top = max([*ns, seed_at or 0])
    ax.plot([1, top], [1, 1], "--", color="grey", label="ideal (linear)")
    if seed_at:
        ax.plot([seed_at], [seed], "*", markersize=12, color="tab:red", label=f"seed: {seed:.0%} at {at}")
    ax.set_xlabel("devices")
    ax.set_ylabel("scaling efficiency")
    ax.set_ylim(0, 1.1)
    ax.set_xticks(sorted({*ns, *([seed_at] if seed_at else [])}))
    ax.set_title(f"{name}: throughput(N) / (N x throughput(1))", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, out / f"claim_{name}.png", files)


def threads_plot(name: str, points: list[dict[str, Any]], out: Path, files: list[Path]) -> None:
    """An input-pipeline recipe: samples/s against decode threads, each point's diagnosis, the knee marked."""
    fig, ax = _pyplot().subplots(figsize=(6.4, 4.2))
    ts = [p["threads"] for p in points]
    ax.plot(ts, [p["throughput"] for p in points], "o-")
    for p in points:
        ax.annotate(f"{p['diagnosis']}{' (knee)' if p.get('knee') else ''}", (p["threads"], p["throughput"]),
                    textcoords="offset points", xytext=(6, -12), fontsize=8)
    _ticks(ax, ts, 2)
    ax.set_xlabel("decode threads (data_nthreads)")
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{name}: throughput against decode threads", fontsize=11)
    ax.margins(x=0.15)
    ax.grid(alpha=0.3)
    _save(fig, out / f"claim_{name}.png", files)


def batch_plot(name: str, points: list[dict[str, Any]], seed: float, out: Path, files: list[Path]) -> None:
    """A batch recipe: samples/s and val accuracy against the per-device batch (log2 axis), the largest marked."""
    fig, ax = _pyplot().subplots(figsize=(6.4, 4.2))
    bs = [p["batch"] for p in points]
    ax.plot(bs, [p["throughput"] for p in points], "o-", color="tab:blue", label="samples/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(bs)
    ax.set_xticklabels([str(b) for b in bs])
    ax.set_xlabel(f"batch per device (the largest, {bs[-1]}, is batch=auto's; the seed's: {seed:g})")
    ax.set_ylabel("samples/s", color="tab:blue")
    ax.set_ylim(bottom=0)
    acc = [(p["batch"], p["val_accuracy"]) for p in points if p.get("val_accuracy") is not None]
    if acc:
        a2 = ax.twinx()
        a2.plot(*zip(*acc), "s--", color="tab:orange", label="val accuracy")
        a2.set_ylabel("val accuracy (last epoch)", color="tab:orange")
        a2.set_ylim(0, 1.02)
    ax.set_title(f"{name}: throughput and accuracy against batch (linear lr rule)", fontsize=11)
    ax.grid(alpha=0.3)
    _save(fig, out / f"claim_{name}.png", files)


def finetune_plot(name: str, points: list[dict[str, Any]], seed: float, at: str, out: Path,
                  files: list[Path]) -> None:
    """A fine-tune recipe: val accuracy per epoch, fine-tuned against from scratch, and the seed's published point."""
    fig, ax = _pyplot().subplots(figsize=(6.4, 4.2))
    for p in points:
        if p["per_epoch"]:
            ax.plot(range(1, len(p["per_epoch"]) + 1), p["per_epoch"], "o-", label=p["run"],
                    color="tab:green" if p["run"] == "fine-tuned" else "tab:grey")
    epochs = max((len(p["per_epoch"]) for p in points), default=1)
    ax.axhline(seed, linestyle=":", color="tab:red", label=f"seed: {seed:.1%} at {at} (its own data set)")
    ax.set_xticks(range(1, epochs + 1))
    ax.set_xlabel("epoch")
    ax.set_ylabel("val accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{name}: fine-tuned from pretrained weights against from scratch", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    _save(fig, out / f"claim_{name}.png", files)


def dynamic_plot(name: str, points: list[dict[str, Any]], out: Path, files: list[Path]) -> None:
    """The dynamic-training recipe: cost and wall time of the elastic (spot trace) and the fixed (on-demand) run."""
    pts = [p for p in points if p.get("cost_usd") is not None and p.get("time_s") is not None]
    if not pts:
        return
    fig, (a1, a2) = _pyplot().subplots(1, 2, figsize=(8.4, 3.8))
    labels = [p["run"] for p in pts]
    for ax, key, unit in ((a1, "cost_usd", "cost (billed from the job's start), USD"),
                          (a2, "time_s", "wall time from the job's start, s")):
        bars = ax.bar(labels, [p[key] for p in pts], color=["tab:green" if p["elastic"] else "tab:grey" for p in pts])
        for b, p in zip(bars, pts):
            ax.annotate(f"{p[key]:.4f}" if key == "cost_usd" else f"{p[key]:.1f}", (b.get_x() + b.get_width() / 2,
                        b.get_height()), ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(unit)
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{name}: elastic on the spot trace against fixed on-demand (same accuracy)", fontsize=10)
    _save(fig, out / f"claim_{name}.png", files)
