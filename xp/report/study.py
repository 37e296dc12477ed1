"""A study's part of a report: its trials with the parameters searched, its registered model, and Optuna's own
plots of it (optimization history, parallel coordinates, parameter importances, one slice per parameter, drawn
with Optuna's matplotlib backend: log axes where the space is log).

The study is rebuilt in memory from its MLflow runs (each trial's parameters, state and objective values) and its
parent run's record of the search space (sweep.params.*): the report needs only the MLflow store, not the study's
storage, and shows the trials the report's tables show."""

from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xp.report.table import md_table, short, swept_columns
from xp.states import TrialState as Told  # (Optuna's TrialState is its own class)

FIELDS = ("type", "low", "high", "log", "step", "choices")  # a searched parameter's keys under sweep.params.NAME


@dataclass
class StudyParent:
    """What a report knows of a study's parent run: its name, its params (the search space: sweep.params.*) and
    the line on its registered model."""
    name: str = "study"
    params: dict[str, str] = field(default_factory=dict)
    registered: str | None = None
    changes: list[str] = field(default_factory=list)  # the changes of its question it was continued under
    answer: Any = None  # the study's answer as its search wrote it (xp.answers), None: none recorded


def objectives_of(parent_params: dict[str, str]) -> list[dict[str, Any]]:
    """A study's objectives as its parent run logged them (sweep.objectives); val_accuracy, maximized, if not."""
    return _value(parent_params.get("sweep.objectives", "")) or [{"metric": "val_accuracy", "direction": "maximize"}]


def first_objective(parent_params: dict[str, str]) -> tuple[str, bool]:
    """(its first objective's metric, whether it is maximized)."""
    first = objectives_of(parent_params)[0]
    return first["metric"], first["direction"] == "maximize"


def parents(client: Any, runs: list[Any]) -> dict[str | None, StudyParent]:
    """The parent run of each study whose trials are among `runs`, by its run id (one a store no longer has: known
    by its id only)."""
    out: dict[str | None, StudyParent] = {}
    for pid in {r.data.tags.get("mlflow.parentRunId") for r in runs if "optuna.trial_number" in r.data.tags}:
        try:
            parent = client.get_run(pid)
        except Exception:  # (deleted, or trials logged without one)
            out[pid] = StudyParent(name=str(pid))
            continue
        out[pid] = StudyParent(name=parent.data.tags.get("optuna.study") or parent.info.run_name or pid,
                               params=dict(parent.data.params), registered=registered(client, parent),
                               changes=[c for c in parent.data.tags.get("xp.study.changes", "").split("\n") if c],
                               answer=answer_of(client, pid))
    return out


def answer_of(client: Any, run_id: str) -> Any:
    """The answer a study's parent run holds (best_trial.json, or pareto_front.json), None if it holds none (a
    study stopped before its end, or run by an xp that wrote no answer)."""
    import json
    import tempfile

    from xp.answers import FILE, FRONT_FILE, Answer

    with tempfile.TemporaryDirectory(prefix="xp-answer-") as folder:
        for name in (FILE, FRONT_FILE):
            try:
                d = json.loads(Path(client.download_artifacts(run_id, name, folder)).read_text())
            except Exception:  # (not there)
                continue
            return Answer.from_dict(d) if "objectives" in d else None  # (an older xp's summary is no answer)
    return None


def sections(rows: list[dict[str, Any]], studies: dict[str | None, StudyParent], out: Path,
             files: list[Path]) -> list[str]:
    """A section per study among the rows (its trials: rows with a trial number, grouped by their parent run); the
    other rows are not a study's."""
    from xp.studies.confirm import SUFFIX

    groups: dict[str | None, list[dict[str, Any]]] = {}
    confirming: dict[str, list[dict[str, Any]]] = {}  # a study's runs that confirm its best, by the study's name
    for r in rows:  # a study's trials, whichever of its commands (parent runs) ran them
        if r["trial"] is not None and str(r.get("study") or "").endswith(SUFFIX):
            confirming.setdefault(str(r["study"])[:-len(SUFFIX)], []).append(r)
        elif r["trial"] is not None:
            groups.setdefault(studies[r["parent"]].name if r["parent"] in studies else None, []).append(r)
    lines = []
    for name, trials in sorted(groups.items(), key=lambda g: min(t["start_ms"] or 0 for t in g[1])):
        latest = max(trials, key=lambda t: t["start_ms"] or 0)["parent"]  # its search space and registered model
        parent = studies.get(latest) or StudyParent()
        pids = sorted({str(t["parent"]) for t in trials})
        one = len(groups) == 1
        title = "## Trials" if one else f"## Trials of {parent.name}" + (f" ({', '.join(pids)})" if name else "")
        prefix = "study_" if one else f"study_{re.sub(r'[^A-Za-z0-9]+', '-', parent.name)}_{str(latest)[:8]}_"
        commands = [f"Its trials were run by {len(pids)} commands (parent runs {', '.join(pids)})."] if len(pids) > 1 \
            else []
        commands += [f"**Not one question**: the study was {c}; its trials compare unlike settings." for c in
                     parent.changes]
        lines += section(trials, parent.params, out, files, parent.registered, title=title, prefix=prefix,
                         notes=commands, answer=parent.answer)
        lines += confirmation(parent.answer, confirming.get(str(name), []))
    return lines


def confirmation(answer: Any, runs: list[dict[str, Any]]) -> list[str]:
    """sweep.confirm: each of the study's top trials with its runs at other seeds, best mean first, and whether the
    top two are within each other's noise: as the study's answer holds them (xp.answers)."""
    if answer is None or not answer.confirmed:
        return ["### The best, confirmed across seeds", "", f"{len(runs)} runs retrained the study's best with other "
                "seeds; the study wrote no answer (stopped before its end): run its command again to finish it.",
                ""] if runs else []
    searched = answer.searched
    rows = [{"trial": c["trial"], **{f"p:{k}": short(c["params"].get(k)) for k in searched},
             "seeds": " ".join(map(str, c.get("seeds") or [])), "n": len(c["values"]), "mean": c["mean"],
             "std": c.get("std"), "range": f"{min(c['values']):.4f} - {max(c['values']):.4f}"}
            for c in answer.confirmed]
    columns = [("trial", "trial", "{}"), *((f"p:{k}", k, "{}") for k in searched), ("seeds", "seeds", "{}"),
               ("n", "runs", "{}"), ("mean", f"{answer.metric}, mean", "{:.4f}"), ("std", "std", "{:.4f}"),
               ("range", "range", "{}")]
    return ["### The best, confirmed across seeds", "",
            f"The study's best trials retrained with other seeds (sweep.confirm): its answer is the best by mean, "
            f"trial {answer.confirmed[0]['trial']}.", "", md_table(rows, columns), "",
            *([f"Of the top two by mean, {answer.verdict[len('the top two '):]}.", ""] if answer.verdict else [])]


def int_or(text: str) -> tuple[int, str]:
    """A seed as a sort key: numbers in order, anything else after."""
    try:
        return (int(text), "")
    except ValueError:
        return (1 << 62, text)


def space(parent_params: dict[str, str], rows: list[dict[str, Any]], swept: list[str]) -> dict[str, Any]:
    """The Optuna distributions of the searched parameters: as the study file declared them (the parent run's
    sweep.params.*), else (a search space given on the command line) from the values the trials took."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    declared = declared_space(parent_params)
    out: dict[str, Any] = {}
    for name in swept:
        d = declared.get(name)
        seen = [r["settings"].get(name) for r in rows if r["settings"].get(name) is not None]
        if d and d.get("type") == "categorical" or not d and not all(_is_number(v) for v in seen):
            out[name] = CategoricalDistribution(d["choices"] if d else sorted(set(seen), key=str))
        elif d:
            if d.get("type") == "int":  # (an int's step is 1 unless given; a float's none)
                out[name] = IntDistribution(d["low"], d["high"], log=bool(d.get("log")), step=d.get("step") or 1)
            else:
                out[name] = FloatDistribution(d["low"], d["high"], log=bool(d.get("log")), step=d.get("step"))
        else:
            low, high = min(float(v) for v in seen), max(float(v) for v in seen)
            out[name] = FloatDistribution(low, high if high > low else low + 1, log=low > 0 and high / low >= 100)
    return out


def declared_space(parent_params: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The search space the study file declared, as its parent run logged it (sweep.params.NAME.FIELD)."""
    declared: dict[str, dict[str, Any]] = {}
    for key, value in parent_params.items():
        if key.startswith("sweep.params.") and key.rsplit(".", 1)[1] in FIELDS:
            name, field = key[len("sweep.params."):].rsplit(".", 1)
            declared.setdefault(name, {})[field] = _value(value)
    return declared


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _is_number(value: Any) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False


def rebuild(parent_params: dict[str, str], rows: list[dict[str, Any]], swept: list[str]) -> Any:
    """The study as an in-memory Optuna study of these trial rows (numbers kept: a trial not among them is a
    failed one here); None if the rows are not a study's trials."""
    import optuna
    from optuna.trial import TrialState, create_trial

    objectives = objectives_of(parent_params)
    trials = {r["trial"]: r for r in rows if r.get("trial") is not None}
    dists = space(parent_params, rows, swept)
    if not trials or not dists:
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=[o["direction"] for o in objectives])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (experimental in Optuna)
        study.set_metric_names([o["metric"] for o in objectives])
    for n in range(max(trials) + 1):
        r = trials.get(n)
        values = [r.get(o["metric"]) for o in objectives] if r else []
        if r is None or r["state"] != Told.COMPLETE or None in values or any(r["settings"].get(k) is None for k in dists):
            study.add_trial(create_trial(state=TrialState.PRUNED if r else TrialState.FAIL))
            continue
        params = {k: _cast(dists[k], r["settings"].get(k)) for k in dists}
        study.add_trial(create_trial(params=params, distributions=dists,
                                     values=[float(v) for v in values if v is not None]))
    return study


def _cast(dist: Any, value: Any) -> Any:
    """A run's parameter (MLflow keeps text) as its distribution holds it."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(dist, CategoricalDistribution):
        return next((c for c in dist.choices if str(c) == str(value)), dist.choices[0])
    return int(float(value)) if isinstance(dist, IntDistribution) else float(value)


PLOTS = (("optimization_history", "plot_optimization_history", "the objective of each complete trial and the best "
          "so far"),
         ("parallel_coordinate", "plot_parallel_coordinate", "each complete trial's parameters, coloured by its "
          "objective"),
         ("param_importances", "plot_param_importances", "how much of the objective's variation each parameter "
          "explains (fANOVA)"),
         ("slice", "plot_slice", "the objective against each parameter (log axes where the space is log)"))


# complete trials a plot needs (for p parameters) before it says more than noise
NEEDS = {"param_importances": lambda p: max(5, 2 * p), "parallel_coordinate": lambda p: 3, "slice": lambda p: 3}


def optuna_plots(study: Any, out: Path, files: list[Path], prefix: str = "study_") -> list[str]:
    """Optuna's four plots of the study as PNGs (matplotlib backend), the first objective's; a line for each
    that cannot be drawn (too few complete trials, one parameter...): none is drawn empty."""
    from optuna.trial import TrialState

    complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    if not complete:
        return ["Optuna's plots: not drawn (no complete trial among these runs).", ""]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as draw

    first = study.metric_names[0] if study.metric_names else "objective"
    kwargs = {"target_name": first, **({"target": lambda t: t.values[0]} if len(study.directions) > 1 else {})}
    lines = []
    params = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))[0].params)
    for name, function, what in PLOTS:
        need = NEEDS.get(name, lambda p: 1)(params)
        if complete < need:  # drawn from fewer, it is noise (importances of 1 trial: 1/3 each)
            lines.append(f"- Optuna's {name.replace('_', ' ')}: not drawn ({complete} complete trial(s); it needs "
                         f"{need} to mean something).")
            continue
        with warnings.catch_warnings(), matplotlib.rc_context():  # (it sets its own style: the report's stays)
            warnings.simplefilter("ignore")  # Optuna's matplotlib backend is marked experimental
            try:
                drawn = getattr(draw, function)(study, **kwargs)
            except Exception as e:  # e.g. importances of one complete trial
                lines.append(f"- Optuna's {name.replace('_', ' ')}: not drawn ({str(e).splitlines()[0][:160]}).")
                continue
            fig = (drawn.flatten()[0] if hasattr(drawn, "flatten") else drawn).figure
            _no_white(fig)
            if _empty(fig):
                plt.close(fig)
                lines.append(f"- Optuna's {name.replace('_', ' ')}: not drawn (nothing to draw: {complete} "
                             "complete trial(s)).")
                continue
            fig.savefig(out / f"{prefix}{name}.png", dpi=110, bbox_inches="tight")
            plt.close(fig)
        files.append(out / f"{prefix}{name}.png")
        lines.append(f"- Optuna's {name.replace('_', ' ')}: {what}.")
    return lines


def _no_white(fig: Any) -> None:
    """Optuna's colour scale (Blues) draws the worst trials nearly white on white: viridis, which has no white."""
    for ax in fig.axes:
        for coll in ax.collections:
            cmap = getattr(coll, "get_cmap", lambda: None)()
            if cmap is not None and cmap.name.startswith("Blues"):
                coll.set_cmap("viridis_r" if cmap.name.endswith("_r") else "viridis")


def _empty(fig: Any) -> bool:
    """A figure whose axes hold no data (Optuna draws empty axes where it has nothing, with a warning)."""
    return not any(ax.lines or ax.collections or ax.patches or ax.images for ax in fig.axes)


def section(rows: list[dict[str, Any]], parent_params: dict[str, str] | None, out: Path, files: list[Path],
            registered_line: str | None = None, title: str = "## Trials", prefix: str = "study_",
            notes: list[str] | None = None, answer: Any = None) -> list[str]:
    """A study's trials: the parameters it searched as columns, each trial's state, pruned trials apart (stopped
    early, at a lower accuracy than they would have reached: not comparable with complete ones), its registered
    model, Optuna's plots of it. Nothing for runs that are not a study's trials."""
    rows = [r for r in rows if r["trial"] is not None]
    if not rows:
        return []
    declared = sorted(k for k in declared_space(parent_params or {})  # (less what the command line fixed)
                      if answer is None or k in answer.searched)
    if declared:  # what the study file searched, as its parent run logged it
        for r in rows:
            r.update({f"swept:{k}": short(r["settings"].get(k)) for k in declared})
        searched = [(f"swept:{k}", k, "{}") for k in declared]
    else:  # a search space given on the command line: what its trials varied
        searched = swept_columns(rows)
    columns = [("trial", "trial", "{}"), ("state", "state", "{}"), *searched,
               ("val_accuracy", "val acc (last epoch)", "{:.4f}"), ("best_val_accuracy", "val acc (best epoch)", "{:.4f}"),
               ("epochs", "epochs", "{}"), ("run_id", "run id", "{}"), ("logged_model", "model", "{}")]
    complete = sorted((r for r in rows if r["state"] != Told.PRUNED), key=lambda r: r["trial"] or 0)
    pruned = sorted((r for r in rows if r["state"] == Told.PRUNED), key=lambda r: r["trial"] or 0)
    lines = [title, "", f"Searched: {', '.join(t for _, t, _ in searched) or '-'}. {len(complete)} complete, "
             f"{len(pruned)} pruned.", "", *(f"{n}\n" for n in notes or []), *answer_lines(answer),
             md_table(complete, columns), "", *([registered_line, ""] if registered_line else [])]
    if pruned:
        lines += ["### Pruned trials", "", "Stopped early by the pruner: their accuracy is that of the epoch they "
                  "stopped at, not comparable with complete trials (left out of the table above and the plots).", "",
                  md_table(pruned, columns), ""]
    try:  # the study's own parameters (a study file's), else what its runs varied
        study = rebuild(parent_params or {}, rows, declared or [k.split(":", 1)[1] for k, _, _ in searched])
    except Exception as e:  # runs of a study this xp cannot read back: the tables stand
        return [*lines, f"Optuna's plots: not drawn (the study could not be rebuilt: {str(e)[:160]}).", ""]
    if answer is not None and answer.schedule:  # (its answer is a lineage: its trials are a population's intervals)
        return [*lines, "Its trials are the intervals of a population (search=pbt): the population's section "
                "draws them.", ""]
    if study is not None:
        plots: list[Path] = []
        lines += ["### The study, as Optuna draws it", "", *optuna_plots(study, out, plots, prefix), ""]
        lines += [f"![{f.stem}]({f.name})\n" for f in plots]
    return lines


def answer_lines(answer: Any) -> list[str]:
    """The study's answer, as its search wrote it (the console and its parent run say the same)."""
    if answer is None:
        return ["The study wrote no answer (stopped before its end, or run by an older xp).", ""]
    said = answer.best_lines() + ([answer.schedule_line()] if answer.schedule else [])
    return [f"**Its answer** ({answer.search}; {answer.rule.split('; a tie')[0]}):", "",
            *(f"- {line.strip()}" for line in said),
            *(f"- Fixed on the command line (not searched): {', '.join(answer.fixed)}" for _ in answer.fixed[:1]),
            *(f"- {line}" for line in answer.lacking), ""]


def registered(client: Any, parent: Any) -> str | None:
    """A study's registered best (sweep.register_model, as its parent run's tag says), in a line; None if none."""
    from mlflow.exceptions import MlflowException

    name = parent.data.tags.get("xp.register_model")
    try:
        version = client.get_model_version_by_alias(name, "best") if name else None
    except MlflowException:
        return None
    return version and (f"Registered: `models:/{name}@best` is version {version.version}, trial "
                        f"{version.tags.get('trial', '?')} (run {version.run_id}, model {version.source}).")
