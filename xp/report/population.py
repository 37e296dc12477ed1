"""A population-based study (sweep.search=pbt, xp.studies.pbt) in the report: its members, the winner's lineage,
and two plots: the population's objective over epochs (each member a line; a dashed jump where it took another's
weights) and the schedule the winner's weights followed (each hyperparameter over epochs, along its lineage)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from xp.report.plots import _pyplot, _save


@dataclass
class Interval:
    trial: int
    member: int
    start: int  # its first epoch is start + 1
    end: int
    start_from: int | None  # the interval whose commit it started from
    donor: int | None  # the member it took the weights of (an exploit), else None
    run_id: str
    curve: dict[int, float]  # epoch -> the objective
    hyper: dict[str, dict[int, float]]  # hp.KEY -> epoch -> value


def intervals(runs: list[Any], history: Callable[[str, str], list[Any]],
              metric_of: Callable[[Any], str]) -> dict[str, list[Interval]]:
    """The members' intervals among `runs`, by study; each one's curve: its study's objective (metric_of(run))."""
    out: dict[str, list[Interval]] = {}
    for r in runs:
        t = r.data.tags
        if "xp.pbt.member" not in t or "optuna.trial_number" not in t:
            continue
        first, _, last = t.get("xp.pbt.epochs", "0-0").partition("-")

        def per_epoch(key: str) -> dict[int, float]:
            return {m.step: m.value for m in sorted(history(r.info.run_id, key), key=lambda m: m.timestamp)}

        out.setdefault(t.get("optuna.study", "?"), []).append(Interval(
            int(t["optuna.trial_number"]), int(t["xp.pbt.member"]), int(first) - 1, int(last),
            int(t["xp.pbt.from_trial"]) if t.get("xp.pbt.from_trial") else None,
            int(t["xp.pbt.donor_member"]) if t.get("xp.pbt.donor_member") else None, r.info.run_id,
            per_epoch(metric_of(r)), {k: per_epoch(k) for k in r.data.metrics if k.startswith("hp.")}))
    return out


def lineage(winner: Interval, by_trial: dict[int, Interval]) -> list[Interval]:
    """The intervals whose training the winner's weights went through, first to last."""
    chain: list[Interval] = []
    at: Interval | None = winner
    while at is not None:
        chain.append(at)
        at = by_trial.get(at.start_from) if at.start_from is not None else None
    return chain[::-1]


def section(runs: list[Any], history: Callable[[str, str], list[Any]], out: Path, files: list[Path],
            parents: dict[str | None, Any]) -> list[str]:
    """A section per population-based study among the runs, ranked by its objective (`parents`: the studies'
    parent runs, xp.report.study.parents); nothing where there is none."""
    from xp.report.study import first_objective

    def objective(r: Any) -> tuple[str, bool]:
        parent = parents.get(r.data.tags.get("mlflow.parentRunId"))
        return first_objective(parent.params if parent is not None else {})

    lines: list[str] = []
    for name, found in sorted(intervals(runs, history, lambda r: objective(r)[0]).items()):
        by_trial = {i.trial: i for i in found}
        first = next(r for r in runs if r.info.run_id == found[0].run_id)
        metric, maximize = objective(first)
        end = max(i.end for i in found)
        finals = [i for i in found if i.end == end and i.curve.get(end) is not None]
        parent = parents.get(first.data.tags.get("mlflow.parentRunId"))
        answer = getattr(parent, "answer", None)  # (the study's winner, as its search wrote it: not picked again)
        winner = by_trial.get(answer.first.trial) if answer is not None and answer.first is not None else None
        if not finals or winner is None or winner not in finals:
            lines += [f"## Population of {name}", "", f"{len({i.member for i in found})} members, {len(found)} "
                      "intervals; the study wrote no answer (stopped before its end): no winner to draw.", ""]
            continue
        chain = lineage(winner, by_trial)
        slug = "".join(c if c.isalnum() else "-" for c in name)
        pop, sched = out / f"pbt_{slug}_population.png", out / f"pbt_{slug}_schedule.png"
        drawn: list[Path] = []  # (shown here, beside its section, not again with the report's other plots)
        _population_plot(found, by_trial, metric, pop, drawn)
        _schedule_plot(chain, winner, sched, drawn)
        lines += [f"## Population of {name}", "",
                  f"{len({i.member for i in found})} members, {len(found)} intervals up to epoch {end}; "
                  f"{sum(1 for i in found if i.donor is not None)} exploits (a member took another's weights). "
                  f"The winner: member {winner.member} (trial {winner.trial}, {metric} {winner.curve[end]:.4f}), "
                  "the study's answer.",
                  "", "| member | trial | " + metric + " | exploits |", "|---|---|---|---|"]
        for i in sorted(finals, key=lambda i: (i.trial != winner.trial, -i.curve[end] if maximize else i.curve[end],
                                               i.trial)):  # (the answer first; ties as the study broke them)
            took = sum(1 for j in found if j.member == i.member and j.donor is not None)
            lines.append(f"| {i.member} | {i.trial} | {i.curve[end]:.4f} | {took} |")
        lines += ["", "The winner's weights went through: " + "; ".join(
            f"epochs {c.start + 1}-{c.end} as member {c.member} (trial {c.trial}, "
            + ", ".join(f"{k[3:]}={next(iter(v.values())):.4g}" for k, v in sorted(c.hyper.items()) if v) + ")"
            for c in chain) + ".", "", f"![{pop.stem}]({pop.name})", "", f"![{sched.stem}]({sched.name})", ""]
    return lines


def _population_plot(found: list[Interval], by_trial: dict[int, Interval], metric: str, path: Path,
                     files: list[Path]) -> None:
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    colours = plt.get_cmap("tab10")
    for member in sorted({i.member for i in found}):
        colour = colours(member % 10)
        for n, i in enumerate(sorted((i for i in found if i.member == member), key=lambda i: i.start)):
            steps = sorted(i.curve)
            ax.plot(steps, [i.curve[s] for s in steps], "-o", color=colour, ms=3,
                    label=f"member {member}" if n == 0 else None)
            source = by_trial.get(i.start_from) if i.start_from is not None else None
            if source is not None and source.curve and steps:  # where its weights came from
                s = max(source.curve)
                ax.plot([s, steps[0]], [source.curve[s], i.curve[steps[0]]], "--" if i.donor is not None else "-",
                        color=colour, lw=1.2 if i.donor is not None else 1.0)
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.set_title("The population (dashed: a member took another's weights)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path, files)


def _schedule_plot(chain: list[Interval], winner: Interval, path: Path, files: list[Path]) -> None:
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    keys = sorted({k for c in chain for k in c.hyper})
    fig, axes = plt.subplots(max(1, len(keys)), 1, figsize=(7.5, 2.2 + 1.6 * len(keys)), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        points = sorted((s, v) for c in chain for s, v in c.hyper.get(key, {}).items())
        ax.step([s for s, _ in points], [v for _, v in points], "-o", where="pre", ms=3, color="tab:blue")
        if key == "hp.lr":
            ax.set_yscale("log")
        ax.set_ylabel(key[3:])
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("epoch (each value holds through that epoch)")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0, 0].set_title(f"The winner's schedule (member {winner.member}, trial {winner.trial})")
    _save(fig, path, files)
