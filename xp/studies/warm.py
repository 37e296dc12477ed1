"""A warm start (`sweep.warm_start=OLD`): a study that begins from an earlier study's results, the usual next step
after its question changed (epochs=2, then epochs=6; gluon, then torch; a narrower range).

The earlier study's finished trials whose parameters lie in this study's space seed its sampler; they never enter
this study: its trials, budget and answer are its own. The seeding goes through Optuna's public API only: a
study in memory (the *shadow*) holds the earlier trials and, as they end, this study's own; each proposal is asked
of the shadow, with the study's sampler, and enqueued in this study, which runs it as any proposal (reused if it
ran, dropped if another slot claimed it). It is said in one line and recorded in the study (WARM_ATTR), and in
its answer (what it searched with: `extra["warm_start"]`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from xp.errors import ConfigError
from xp.states import TrialState as Told  # (Optuna's TrialState is its own class)
from xp.answers import Answer
from xp.studies.search import Sampled
from xp.studies.study import StudySpec

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial


log = logging.getLogger("xp")

WARM_ATTR = "xp.warm_start"  # the study's user attribute: {"from": the earlier study, "trials": how many seeded it}


def source_of(spec: StudySpec) -> Any:
    """The earlier study `spec.warm_start` names, in the study's storage, checked: it exists (read without creating
    anything) and optimises the same objectives; else one line."""
    import optuna

    from xp.storefiles import first_use, sqlite_path
    from xp.studies.trial import storage_of

    name, path = str(spec.warm_start), sqlite_path(spec.storage)
    if path is not None and not (path.exists() and path.stat().st_size > 0):
        raise ConfigError(f"sweep.warm_start={name}: no such study in {spec.storage} (the storage holds no study yet)")
    with first_use(spec.storage, "sweep.storage"):
        storage = storage_of(spec.storage)
        try:
            source = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            names = sorted(s.study_name for s in optuna.get_all_study_summaries(storage) if s.study_name != spec.study_name)
            raise ConfigError(f"sweep.warm_start={name}: no such study in this storage; it holds: "
                              f"{', '.join(names) or 'no other'}") from None
    wanted = [o.metric for o in spec.objectives]
    directions = [o.direction for o in spec.objectives]
    have = source.metric_names or wanted
    if list(have) != wanted or [d.name.lower() for d in source.directions] != directions:
        raise ConfigError(f"sweep.warm_start={name}: it optimises "
                          + ", ".join(f"{d.name.lower()} {m}" for d, m in zip(source.directions, have))
                          + f"; this study {', '.join(f'{d} {m}' for d, m in zip(directions, wanted))}: its "
                          "values would mean something else here")
    return source


class WarmStart(Sampled):
    """Optuna's search (Sampled), its proposals asked of a shadow study that also holds the earlier study's
    finished trials in this space."""

    def __init__(self, study: Study, spec: StudySpec):
        import optuna

        from xp.studies.trial import make_sampler

        super().__init__(study, spec)
        source = source_of(spec)
        source_name, directions = str(spec.warm_start), [o.direction for o in spec.objectives]
        self.source = source_name
        self.shadow = optuna.create_study(directions=directions, sampler=make_sampler(spec))  # (in memory)
        finished = source.get_trials(deepcopy=False, states=(_state(Told.COMPLETE), _state(Told.PRUNED)))
        seeds = [t for t in finished if self._fits(t)]
        for t in seeds:
            self.shadow.add_trial(self._copy(t))
        self.seeded, self.copied = len(seeds), set[int]()
        study.set_user_attr(WARM_ATTR, {"from": source_name, "trials": self.seeded, "of": len(finished)})
        log.info(f"study {spec.study_name}: warm start from study {source_name}: {self.seeded} of its "
                 f"{len(finished)} finished trials lie in this space; they seed the sampler, never the answer")

    def _fits(self, trial: FrozenTrial) -> bool:
        """Whether an earlier trial's parameters are exactly this study's, each in its range."""
        return set(trial.params) == set(self.dists) and all(inside(self.dists[k], v) for k, v in trial.params.items())

    def _copy(self, trial: FrozenTrial) -> FrozenTrial:
        from optuna.trial import create_trial

        complete = trial.state.name == Told.COMPLETE
        return create_trial(state=trial.state, params=dict(trial.params), distributions=self.dists,
                            values=list(trial.values) if complete else None,
                            intermediate_values=dict(trial.intermediate_values))

    def describe(self) -> str:
        return f"{super().describe()}, warm-started from study {self.source} ({self.seeded} trials)"

    def proposing(self) -> None:
        """Before each proposal: the study's trials that ended since are copied into the shadow, and, where no
        trial waits in the study's queue (given back, retried: those run first), the shadow's next proposal is
        queued in it."""
        from optuna.trial import TrialState

        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            if t.number not in self.copied and self._fits(t):
                self.shadow.add_trial(self._copy(t))
                self.copied.add(t.number)
        if self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return
        proposal = self.shadow.ask(self.dists)
        self.shadow.tell(proposal, state=TrialState.FAIL)  # (asked only: its result comes as the study's trial's)
        self.study.enqueue_trial(proposal.params)

    def answer(self) -> Answer:
        answer = super().answer()
        return dataclasses.replace(answer, extra={**answer.extra, "warm_start": {"from": self.source,
                                                                                  "trials": self.seeded}})


def inside(dist: Any, value: Any) -> bool:
    """Whether a value lies in an Optuna distribution (a choice of a categorical one; within a numeric one's
    bounds), read from its public fields."""
    from optuna.distributions import CategoricalDistribution

    if isinstance(dist, CategoricalDistribution):
        return value in dist.choices
    return isinstance(value, (int, float)) and not isinstance(value, bool) and dist.low <= value <= dist.high


def _state(name: str) -> Any:
    from optuna.trial import TrialState

    return TrialState[name]
