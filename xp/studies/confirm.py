"""A study's best trial confirmed across seeds (`sweep.confirm=K`): a best trial is a claim, one draw of the
seed that fixes its initial weights and data order. After its trials, the study retrains its `confirm_top`
best complete trials with K other seeds (the config's seed + 1 ... + K), and its answer is the best by mean over
the K + 1 runs of each, with their spread; the summary says when the top two are within each other's noise.

The retrainings are the trials of a study of their own beside it, `NAME.confirm` in the same storage (its
parameters: the searched ones and the seed; no pruner, no sampler of consequence: each is enqueued), so they
run on the same slots, through the same scheduler or Hydra batches, as resumable as the study (the same command
again reruns none that finished), and never feed the study's sampler or its best trial. Their MLflow runs are
under the study's parent run, tagged optuna.study=NAME.confirm.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any

from xp.studies.study import Param, StudySpec

SUFFIX = ".confirm"  # the confirming study's name: the study's and this
SEEDS = 2 ** 31  # the seeds a confirming study's trials may have


def name_of(study_name: str) -> str:
    return study_name + SUFFIX


def seeds(spec: StudySpec, base_seed: int) -> list[int]:
    return [base_seed + i for i in range(1, spec.confirm + 1)]


def top(study: Any, spec: StudySpec) -> list[Any]:
    """The study's `confirm_top` best complete trials, one per parameter set (a reused result is its original's)."""
    from optuna.trial import TrialState

    from xp.studies.trial import DUPLICATE, INTERRUPTED

    maximize = spec.objectives[0].direction == "maximize"
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if DUPLICATE not in t.user_attrs and INTERRUPTED not in t.user_attrs
                and "reused_from_trial" not in t.user_attrs and t.values and math.isfinite(t.values[0])]
    complete.sort(key=lambda t: (-t.values[0] if maximize else t.values[0], t.number))
    out, seen = [], []
    for t in complete:
        if t.params not in seen:
            seen.append(t.params)
            out.append(t)
    return out[:spec.confirm_top]


def prepared(study: Any, spec: StudySpec, base_seed: int) -> tuple[Any, StudySpec] | None:
    """The confirming study and its spec, its retrainings not yet run enqueued (None: sweep.confirm=0, or no
    complete trial to confirm). Its n_trials: what it has finished and what it has to run."""
    if not spec.confirm or spec.multi_objective:
        return None
    best = top(study, spec)
    if not best:
        return None
    from optuna.trial import TrialState

    from xp.studies.trial import _counts, open_study

    wanted = [{**t.params, "seed": s} for t in best for s in seeds(spec, base_seed)]
    cspec = dataclasses.replace(
        spec, study_name=name_of(spec.study_name), pruner="none", sampler="random", register_model=None,
        params=(*spec.params, Param("seed", "int", 0, SEEDS - 1)),  # (one range whatever K: Optuna keeps a
        # parameter's distribution fixed in a study, and each retraining is enqueued with its seed)
        confirm=0, question=None)
    cstudy = open_study(cspec)
    have = [t.params for t in cstudy.get_trials(deepcopy=False) if t.state in (
        TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)]
    todo = [w for w in wanted if w not in have]
    for w in todo:
        cstudy.enqueue_trial(w)
    done, _ = _counts(cstudy)
    return cstudy, dataclasses.replace(cspec, n_trials=done + len(todo))


@dataclass
class Confirmed:
    """One of the study's top trials and the values of its runs across seeds (its own first)."""
    trial: int
    params: dict[str, Any]
    values: list[float]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float:
        return statistics.stdev(self.values) if len(self.values) > 1 else float("nan")

    def line(self, metric: str) -> str:
        spread = f" +- {self.std:.4f} (std), {min(self.values):.4f} - {max(self.values):.4f}" if len(
            self.values) > 1 else ""
        return f"trial {self.trial}: {metric} {self.mean:.4f}{spread} over {len(self.values)} seeds"


def results(study: Any, spec: StudySpec, base_seed: int) -> list[Confirmed]:
    """The top trials with their values across seeds (what the confirming study has finished), best mean first."""
    import optuna
    from optuna.trial import TrialState

    best = top(study, spec)
    if not spec.confirm or not best:
        return []
    try:
        cstudy = optuna.load_study(study_name=name_of(spec.study_name), storage=study._storage)
        runs = cstudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    except KeyError:
        runs = []
    out = []
    for t in best:
        values = [t.values[0]] + [r.values[0] for r in runs if r.values and math.isfinite(r.values[0])
                                  and {k: v for k, v in r.params.items() if k != "seed"} == t.params
                                  and r.params.get("seed") in seeds(spec, base_seed)]
        out.append(Confirmed(t.number, dict(t.params), values))
    maximize = spec.objectives[0].direction == "maximize"
    return sorted(out, key=lambda c: -c.mean if maximize else c.mean)


def within_noise(a: Confirmed, b: Confirmed) -> tuple[bool, float, float]:
    """Whether two trials' means differ by less than twice the standard error of their difference (Welch's), and
    that difference and threshold. Fewer than 2 values a trial: no spread, so no claim either way (True)."""
    if len(a.values) < 2 or len(b.values) < 2:
        return True, abs(a.mean - b.mean), float("nan")
    se = math.sqrt(a.std ** 2 / len(a.values) + b.std ** 2 / len(b.values))
    return abs(a.mean - b.mean) < 2 * se, abs(a.mean - b.mean), 2 * se


def said(confirmed: list[Confirmed], metric: str) -> list[str]:
    """The confirmation in lines: the best by mean, each top trial's spread, whether the top two are within noise."""
    if not confirmed:
        return []
    lines = [f"confirmed across seeds: best by mean is {confirmed[0].line(metric)}"]
    lines += [f"  {c.line(metric)}" for c in confirmed[1:]]
    if len(confirmed) > 1:
        close, diff, bar = within_noise(confirmed[0], confirmed[1])
        lines.append(f"  the top two (trials {confirmed[0].trial} and {confirmed[1].trial}) are "
                     + (f"within each other's noise (difference {diff:.4f} < {bar:.4f}, two standard errors): "
                        "either may be best" if close and math.isfinite(bar) else
                        "within each other's noise (too few seeds to tell)" if close else
                        f"apart (difference {diff:.4f} >= {bar:.4f}, two standard errors)"))
    return lines
