"""What a trial tells its study's pruner after each epoch, and whether it goes on: Optuna's pruners for one
objective; for two or more (which Optuna cannot prune: optuna#3450), xp's Pareto rule.

The Pareto rule (`pruner: pareto`): after its epoch e (e >= n_warmup_steps), a trial stops when its objectives at
epoch e are dominated by those of at least `min_dominators` complete trials at the same epoch e (each at least as
good in every objective and better in one), once `n_startup_trials` complete trials reached epoch e. Why so:
  - like with like: a trial's epoch e against the others' epoch e, not against their final values (accuracy rises
    with epochs, cost adds up: a trial's first epoch against another's last would prune every trial);
  - only what is dominated: a trial better in any one objective is on the front so far and goes on (a fast trial of
    lower accuracy is an answer to an accuracy/throughput question, as a slow accurate one is);
  - by two trials, not one (min_dominators: 2): one lucky trial does not stop every trial near it, and a trial
    dominated by several is far from the front, where training on seldom takes it;
  - after a few complete trials (n_startup_trials: 4), as Optuna's median pruner waits for its start-up trials.
Each trial's values per epoch are its user attributes `xp.at.EPOCH` (Optuna keeps intermediate values of one
objective only); a pruned trial says why in `xp.pruned_by` (the epoch, its values, the trials that dominated it
with theirs), and its run in the tag `xp.pruned`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from xp.studies.paretospec import Pareto

if TYPE_CHECKING:
    from xp.studies.study import StudySpec

AT = "xp.at."  # + epoch: a trial's objectives at that epoch (a multi-objective study's, for the Pareto rule)
PRUNED_BY = "xp.pruned_by"  # why the Pareto rule stopped a trial


def dominates(a: list[float], b: list[float], maximize: list[bool]) -> bool:
    """Whether `a` is at least as good as `b` in every objective and better in one."""
    better = [(x > y) if up else (x < y) for x, y, up in zip(a, b, maximize)]
    worse = [(x < y) if up else (x > y) for x, y, up in zip(a, b, maximize)]
    return any(better) and not any(worse)


def dominated_by(values: list[float], epoch: int, complete: dict[int, list[float]], maximize: list[bool],
                 rule: Pareto) -> list[int] | None:
    """The complete trials (number -> their values at `epoch`) that dominate `values` at `epoch`, when the rule
    prunes on them; None when it does not (warm-up, too few complete trials yet, or too few dominate)."""
    if epoch < rule.n_warmup_steps or len(complete) < rule.n_startup_trials:
        return None
    if not all(math.isfinite(v) for v in values):
        return None  # (a diverged trial ends by itself: xp.run.callbacks.NonFinite)
    them = sorted(n for n, v in complete.items() if dominates(v, values, maximize))
    return them if len(them) >= rule.min_dominators else None


def report(trial: Any, spec: StudySpec, values: list[float], epoch: int) -> None:
    """A trial's objectives after `epoch` (Optuna's trial, asked and told by the study's process)."""
    if spec.multi_objective:
        trial.set_user_attr(f"{AT}{epoch}", [float(v) for v in values])
    else:
        trial.report(values[0], epoch)


def should_prune(trial: Any, spec: StudySpec) -> str | None:
    """Why the trial stops now (None: it goes on); a Pareto decision is kept on the trial (PRUNED_BY)."""
    if not spec.multi_objective:
        return f"{spec.pruner} pruner" if trial.should_prune() else None
    if spec.pruner != "pareto":
        return None
    from optuna.trial import TrialState

    study, mine = trial.study, trial.user_attrs
    epochs = [int(k[len(AT):]) for k in mine if k.startswith(AT)]
    if not epochs:
        return None
    epoch = max(epochs)
    key = f"{AT}{epoch}"
    complete = {t.number: t.user_attrs[key] for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if key in t.user_attrs}
    maximize = [o.direction == "maximize" for o in spec.objectives]
    them = dominated_by(mine[key], epoch, complete, maximize, Pareto(**spec.pruner_options))  # (checked: spec_from)
    if them is None:
        return None
    names = [o.metric for o in spec.objectives]
    trial.set_user_attr(PRUNED_BY, {"epoch": epoch, "values": dict(zip(names, mine[key])),
                                    "dominated_by": {str(n): dict(zip(names, complete[n])) for n in them},
                                    "of_complete": len(complete)})
    return (f"dominated at epoch {epoch} by {len(them)} of {len(complete)} complete trials "
            f"({', '.join(map(str, them[:5]))}{', ...' if len(them) > 5 else ''}) in {', '.join(names)}")


class Pruning:
    """A trial's epochs told to its study's pruner, in the process that holds the study (a run that is an Optuna
    trial of its own, or the scheduler answering a slot's worker)."""

    def __init__(self, trial: Any, spec: StudySpec):
        self.trial, self.spec = trial, spec

    def report(self, values: list[float], epoch: int) -> None:
        report(self.trial, self.spec, values, epoch)

    def should_prune(self) -> str | None:
        return should_prune(self.trial, self.spec)
