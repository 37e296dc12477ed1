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
import logging
import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xp.studies.study import Param, StudySpec

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import Trial

    from xp.studies.search import Search


log = logging.getLogger("xp")

SUFFIX = ".confirm"  # the confirming study's name: the study's and this
SEEDS = 2 ** 31  # the seeds a confirming study's trials may have


def name_of(study_name: str) -> str:
    return study_name + SUFFIX


def study_of(name: str) -> str:
    """The study a study's runs answer for: its own name, or (a confirming study's) the study it confirms."""
    return name[:-len(SUFFIX)] if name.endswith(SUFFIX) else name


def seeds(spec: StudySpec, base_seed: int) -> list[int]:
    return [base_seed + i for i in range(1, spec.confirm + 1)]


def top(study: Study, spec: StudySpec) -> list[Any]:
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


def prepared(study: Study, spec: StudySpec, base_seed: int) -> tuple[Any, StudySpec] | None:
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
    seeds: list[int] = dataclasses.field(default_factory=list)  # each value's seed, in the same order

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


def results(study: Study, spec: StudySpec, base_seed: int) -> list[Confirmed]:
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
        again = [r for r in runs if r.values and math.isfinite(r.values[0])
                 and {k: v for k, v in r.params.items() if k != "seed"} == t.params
                 and r.params.get("seed") in seeds(spec, base_seed)]
        out.append(Confirmed(t.number, dict(t.params), [t.values[0], *(r.values[0] for r in again)],
                             [base_seed, *(int(r.params["seed"]) for r in again)]))
    maximize = spec.objectives[0].direction == "maximize"
    return sorted(out, key=lambda c: (-c.mean if maximize else c.mean, c.trial))  # (ties: the first reached)


def within_noise(a: Confirmed, b: Confirmed) -> tuple[bool, float, float]:
    """Whether two trials' means differ by less than twice the standard error of their difference (Welch's), and
    that difference and threshold. Fewer than 2 values a trial: no spread, so no claim either way (True)."""
    if len(a.values) < 2 or len(b.values) < 2:
        return True, abs(a.mean - b.mean), float("nan")
    se = math.sqrt(a.std ** 2 / len(a.values) + b.std ** 2 / len(b.values))
    return abs(a.mean - b.mean) < 2 * se, abs(a.mean - b.mean), 2 * se


def verdict(confirmed: list[Confirmed]) -> str:
    """Whether the top two are within each other's noise, in a line ('' with fewer than two)."""
    if len(confirmed) < 2:
        return ""
    close, diff, bar = within_noise(confirmed[0], confirmed[1])
    return (f"the top two (trials {confirmed[0].trial} and {confirmed[1].trial}) are "
            + (f"within each other's noise (difference {diff:.4f} < {bar:.4f}, two standard errors): "
               "either may be best" if close and math.isfinite(bar) else
               "within each other's noise (too few seeds to tell)" if close else
               f"apart (difference {diff:.4f} >= {bar:.4f}, two standard errors)"))


class Confirmation:
    """A search around another (xp.studies.search): the inner search runs its budget; then its `confirm_top` best
    trials are retrained with `confirm` other seeds, as the trials of the confirming study, on the same slots; its
    answer is the best by mean over each one's runs, with their spread. Its leader, before any retraining ends, is
    the inner search's."""

    def __init__(self, inner: Search, study: Study, spec: StudySpec, base_seed: int):
        self.inner, self.study, self.spec, self.base_seed = inner, study, spec, base_seed
        self.confirming: tuple[Any, StudySpec] | None = None  # (its study, its spec), once the inner search is done

    def label(self, trial: Trial) -> str:
        return "confirm" if self._mine(trial) else str(self.inner.label(trial))

    def describe(self) -> str:
        k = self.spec.confirm
        return f"{self.inner.describe()}; its {self.spec.confirm_top} best confirmed with {k} more seed{'s' * (k > 1)}"

    def _started(self) -> tuple[Any, StudySpec] | None:
        """The confirming study, made (its retrainings enqueued) once the inner search has nothing left or running."""
        from optuna.trial import TrialState

        if self.confirming is None and self.inner.remaining() <= 0 and not self.study.get_trials(
                deepcopy=False, states=(TrialState.RUNNING,)):
            self.confirming = prepared(self.study, self.spec, self.base_seed)
            from xp.studies.trial import _counts

            done, running = _counts(self.confirming[0]) if self.confirming is not None else (0, 0)
            if self.confirming is not None and (todo := self.confirming[1].n_trials - done - running) > 0:
                k = self.spec.confirm
                log.info(f"study {self.spec.study_name}: its {self.spec.confirm_top} best trials retrained with {k} "
                         f"other seed{'s' * (k > 1)} each ({self.confirming[1].study_name}: {todo} runs to go)")
        return self.confirming

    def remaining(self) -> int:
        """The inner search's, then the retrainings' (before they are made: as many as there may be)."""
        from xp.studies.trial import _counts

        left, most = self.inner.remaining(), self.spec.confirm * self.spec.confirm_top
        if left > 0:
            return left + most
        if self._started() is None:  # (its last trials still running: confirmed once they end)
            return most if self.study.get_trials(deepcopy=False, states=(_running(),)) else 0
        cstudy, cspec = self.confirming  # type: ignore[misc]
        done, running = _counts(cstudy)
        return cspec.n_trials - done - running

    def ask(self) -> Any:
        if self.inner.remaining() > 0:
            return self.inner.ask()
        if self._started() is None or self.remaining() <= 0:
            return None
        from xp.studies.trial import distributions

        import warnings

        cstudy, cspec = self.confirming  # type: ignore[misc]
        with warnings.catch_warnings():  # "heartbeat is supposed to be used with Study.optimize": xp beats itself
            warnings.simplefilter("ignore", UserWarning)
            return cstudy.ask(distributions(cspec))  # (each enqueued with its parameters and seed)

    def _mine(self, trial: Trial) -> bool:
        return self.confirming is not None and trial.study.study_name == self.confirming[1].study_name

    def run_settings(self, trial: Trial) -> tuple[dict[str, Any], dict[str, str] | None]:
        return ({"sweep.pruner": "none"}, None) if self._mine(trial) else self.inner.run_settings(trial)

    def told(self, trial: Trial, state: str, values: list[float], error: str | None = None) -> str:
        from xp.studies.search import tell

        if self.confirming is not None and self._mine(trial):
            return tell(self.confirming[0], trial, state, values)
        return str(self.inner.told(trial, state, values, error))

    def lost(self, trial: Trial, why: str) -> str:
        if not self._mine(trial):
            return str(self.inner.lost(trial, why))
        from optuna.trial import TrialState

        from xp.studies.search import retry

        cstudy, cspec = self.confirming  # type: ignore[misc]
        cstudy.tell(trial, state=TrialState.FAIL)
        return "retried with the same seed" if retry(cstudy, cspec, trial._trial_id) else \
            "failed, retry limit reached"

    def leader(self) -> Any:
        if self.confirming is None:  # (no retraining yet: the inner search's, without reading the confirmations)
            return self.inner.leader()
        confirmed = results(self.study, self.spec, self.base_seed)
        if not confirmed or len(confirmed[0].values) < 2:
            return self.inner.leader()
        return self._member(confirmed[0])

    def _member(self, c: Confirmed) -> Any:
        """A confirmed trial as the answer's member: its own run's figures, judged by its mean across seeds."""
        from xp.answers import member

        m = member(self.study.trials[c.trial], [self.spec.objectives[0].metric])
        m.judged = f"mean {c.mean:.4f}" + (f" +- {c.std:.4f}" if len(c.values) > 1 else "") + \
            f" over {len(c.values)} seeds"
        return m

    def answer(self) -> Any:
        import dataclasses

        answer = self.inner.answer()
        confirmed = results(self.study, self.spec, self.base_seed)
        if not confirmed:
            return answer
        rows = [{"trial": c.trial, "params": c.params, "values": c.values, "seeds": c.seeds, "mean": c.mean,
                 "std": None if len(c.values) < 2 else c.std} for c in confirmed]
        return dataclasses.replace(
            answer, best=[self._member(confirmed[0])],
            ties=[], confirmed=rows, verdict=verdict(confirmed),
            ranking=[*(c.trial for c in confirmed), *(n for n in answer.ranking if n not in {c.trial for c in confirmed})],
            rule=f"the best mean of {self.spec.objectives[0].metric} over each top trial's runs across seeds "
                 "(its own and the retrainings')")


def _running() -> Any:
    from optuna.trial import TrialState

    return TrialState.RUNNING
