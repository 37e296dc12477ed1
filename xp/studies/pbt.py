"""Population-based training (`sweep.search=pbt`): a population of members trains at once; every `interval`
epochs a member in the worst `quantile` takes the weights and optimizer state of one in the best (exploit) and
goes on with its hyperparameters perturbed (explore), so the study finds a schedule in the time of one training.

Each member trains in intervals; an interval is one Optuna trial (its hyperparameters the trial's params) and
one MLflow run under the study's parent, which starts from a commit through the path `resume=` takes (weights,
optimizer state, epoch, random state: xp.run.checkpoint) and commits into its own folder. The lineage lives in
the trials' user attribute PBT_ATTR (member, generation, whose commit it starts from), so the same command
continues a stopped population from its storage. Decisions are asynchronous, as Ray Tune's: a member whose
interval ends is ranked against the members' latest results at the same epoch when a slot asks for its next,
and the slots never wait for the slowest.
"""

from __future__ import annotations

import collections
import logging
import math
import random
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xp.states import INTERRUPTED, TrialState
from xp.studies.pbtspec import PbtSpec

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial, Trial
    from xp.studies.study import StudySpec


log = logging.getLogger("xp")

PBT_ATTR = "xp.pbt"  # a trial's user attribute: {member, generation, start, end, from, donor}
def explored(params: dict[str, Any], space: list[Any], pbt: PbtSpec, rng: random.Random) -> dict[str, Any]:
    """A donor's hyperparameters perturbed, each by its rule, within the space's bounds."""
    rules, out = {r.name: r for r in pbt.explore}, {}
    for p in space:
        rule, value = rules[p.name], params[p.name]
        if rng.random() < rule.resample:
            out[p.name] = _draw(p, rng)
        elif p.kind == "categorical":
            i = list(p.choices).index(value) if value in p.choices else 0
            out[p.name] = p.choices[min(len(p.choices) - 1, max(0, i + rng.choice((-1, 1))))]
        else:
            v = min(p.high, max(p.low, value * rng.choice(rule.factors)))
            out[p.name] = int(round(v)) if p.kind == "int" else v
    return out


def _draw(p: Any, rng: random.Random) -> Any:
    if p.kind == "categorical":
        return rng.choice(list(p.choices))
    if p.log:
        v = math.exp(rng.uniform(math.log(p.low), math.log(p.high)))
    else:
        v = rng.uniform(p.low, p.high)
    return int(round(v)) if p.kind == "int" else v


def population(study: Study, spec: StudySpec, config: Any) -> Population:
    """search=pbt: the study's population; its members commit under checkpoint_dir (or checkpoints/pbt-STUDY),
    which every slot's host must reach (a shared file system where the slots are other hosts)."""
    from xp.studies.pbtspec import check_run
    from xp.studies.trial import distributions

    check_run(spec.pbt, config.get("epochs"), spec.n_trials, f"sweep={spec.name}")
    root = Path(config.get("checkpoint_dir") or Path("checkpoints") / f"pbt-{spec.study_name}").expanduser()
    return Population(study, spec, distributions(spec), int(config.epochs), root.absolute(), spec.sampler_seed,
                      (config.get("model") or {}).get("log") != "none")


class Population:
    """The study's members, read from its trials, as a search (xp.studies.search): which interval runs next
    (`ask`), what each one's run is told (`run_settings`), what follows an interval's end (`told`) or a lost
    worker (`lost`), and the answer: the best member at the last epoch, with the schedule its weights followed."""

    def label(self, trial: Trial) -> str:
        return "study"

    def __init__(self, study: Study, spec: StudySpec, dists: dict[str, Any], epochs: int, root: Path, seed: int | None,
                 log_model: bool = True):
        self.study, self.spec, self.dists, self.epochs, self.root = study, spec, dists, epochs, Path(root)
        self.log_model = log_model  # (model.log=none: no member logs one)
        self.pbt: PbtSpec = spec.pbt
        self.seed = 0 if seed is None else seed
        self.generations = math.ceil(epochs / self.pbt.interval)
        self.maximize = spec.objectives[0].direction == "maximize"

    # --- the study's trials, as members ---------------------------------------------------------------------
    def _trials(self, *states: TrialState) -> list[Any]:
        return [t for t in self.study.get_trials(deepcopy=False) if PBT_ATTR in t.user_attrs
                and (not states or t.state.name in states) and INTERRUPTED not in t.user_attrs]

    def _latest(self) -> dict[int, Any]:
        """Each member's latest complete interval (the weights it holds now)."""
        out: dict[int, Any] = {}
        for t in self._trials(TrialState.COMPLETE):
            a = t.user_attrs[PBT_ATTR]
            if a["member"] not in out or a["generation"] >= out[a["member"]].user_attrs[PBT_ATTR]["generation"]:
                out[a["member"]] = t
        return out

    def _dropped(self) -> set[int]:
        return dropped(self.study, self.spec.max_retry)

    def target(self) -> int:
        """Intervals the study trains in all: those done, and every member's to its last epoch (a member that
        took a member's weights further along skips what it skipped; a dropped one trains no more), within the
        budget."""
        latest, dropped = self._latest(), self._dropped()
        done = collections.Counter(t.user_attrs[PBT_ATTR]["member"] for t in self._trials(TrialState.COMPLETE))
        ahead = sum(0 if m in dropped else self.generations - (latest[m].user_attrs[PBT_ATTR]["generation"] + 1
                                                                if m in latest else 0)
                    for m in range(self.pbt.population))
        return min(self.spec.n_trials, sum(done.values()) + ahead)

    def remaining(self) -> int:
        return self.target() - len(self._trials(TrialState.COMPLETE)) - len(self._trials(TrialState.RUNNING))

    def ask(self) -> Any:
        """The next interval: one queued (given back at a stop, or replacing a lost one), else the next of the
        member furthest behind (a new member drawn by the study's sampler, or one whose interval ended: it goes on,
        or exploits and explores, decided now against every member's latest result), else None (wait for an end).
        Members furthest behind first: on fewer slots than members the population moves on together."""
        if self.remaining() <= 0:
            return None
        if self.study.get_trials(deepcopy=False, states=(_state(TrialState.WAITING),)):
            return self._ask()
        latest, dropped = self._latest(), self._dropped()
        busy = {t.user_attrs[PBT_ATTR]["member"] for t in self._trials(TrialState.RUNNING)}
        started = {t.user_attrs[PBT_ATTR]["member"] for t in self._trials()}
        behind = sorted((latest[m].user_attrs[PBT_ATTR]["generation"] + 1 if m in latest else 0, m)
                        for m in range(self.pbt.population) if m not in busy and m not in dropped
                        and (m in latest or m not in started))
        behind = [(g, m) for g, m in behind if g < self.generations]
        if not behind:
            return None
        g, member = behind[0]
        if g == 0:
            trial = self._ask()
            trial.set_user_attr(PBT_ATTR, self._interval(member, 0, None, None))
            return trial
        self._next(latest[member], latest)
        return self._ask()

    def _ask(self) -> Any:
        with warnings.catch_warnings():  # "heartbeat is supposed to be used with Study.optimize": xp beats itself
            warnings.simplefilter("ignore", UserWarning)
            return self.study.ask(self.dists)

    def _interval(self, member: int, generation: int, start_from: int | None, donor: int | None) -> dict[str, Any]:
        start = generation * self.pbt.interval
        return {"member": member, "generation": generation, "start": start,
                "end": min(self.epochs, start + self.pbt.interval), "from": start_from, "donor": donor}

    def describe(self) -> str:
        return (f"population of {self.pbt.population} (pbt), exploiting every {self.pbt.interval} epoch"
                + ("s" if self.pbt.interval > 1 else ""))

    def run_settings(self, trial: Trial) -> tuple[dict[str, Any], dict[str, str] | None]:
        return self.settings(trial), self.tags(trial)

    def settings(self, trial: Trial) -> dict[str, Any]:
        """The config values an interval's run is given beside its hyperparameters: its last epoch, where it
        commits (checkpoint_dir/trial-N) and the commit it starts from."""
        a = trial.user_attrs[PBT_ATTR]
        out = {"epochs": a["end"], "checkpoint_dir": str(self.root),  # (a member's model: its weights at the end)
               "model.log": "last" if a["end"] == self.epochs and self.log_model else "none"}
        if a["from"] is not None:
            out["resume"] = str(self.root / f"trial-{a['from']}")
        return out

    def tags(self, trial: Trial) -> dict[str, str]:
        a = trial.user_attrs[PBT_ATTR]
        return {"xp.pbt.member": str(a["member"]), "xp.pbt.generation": str(a["generation"]),
                "xp.pbt.epochs": f"{a['start'] + 1}-{a['end']}",  # (and where it took its weights from, if it did)
                **({} if a["from"] is None else {"xp.pbt.from_trial": str(a["from"])}),
                **({} if a["donor"] is None else {"xp.pbt.donor_member": str(a["donor"])})}

    # --- its answer -----------------------------------------------------------------------------------------
    def _finals(self) -> list[Any]:
        """The complete intervals that ended a member's training at the latest epoch any reached (an interval that
        ended earlier is no answer: its epochs are fewer)."""
        done = self._trials(TrialState.COMPLETE)
        end = max((t.user_attrs[PBT_ATTR]["end"] for t in done), default=None)
        return [t for t in done if t.user_attrs[PBT_ATTR]["end"] == end and t.values
                and math.isfinite(t.values[0])]

    def leader(self) -> Any:
        from xp.answers import best_of, member

        best, _ = best_of(self._finals(), self.maximize)
        return None if best is None else member(best, [self.spec.objectives[0].metric])

    def answer(self) -> Any:
        from xp.answers import Answer, best_of, member, ranked
        from xp.studies.search import rule

        finals = self._finals()
        best, tied = best_of(finals, self.maximize)
        return Answer(self.spec.study_name, self.describe(),
                      [{"metric": o.metric, "direction": o.direction} for o in self.spec.objectives],
                      [] if best is None else [member(best, [self.spec.objectives[0].metric])],
                      rule=rule(self.spec) + " (of the intervals that ended a member's training)",
                      ties=[t.number for t in tied], ranking=[t.number for t in ranked(finals, self.maximize)],
                      schedule=[] if best is None else [{"first": f, "last": last, "member": m, "params": p}
                                                        for f, last, m, p in schedule(self.study, best.number)],
                      lacking=dropped_line(self.study, self.spec),
                      extra={"last_epoch": best.user_attrs[PBT_ATTR]["end"]} if best is not None else {})

    # --- what follows an interval ---------------------------------------------------------------------------
    def told(self, trial: Trial, state: str, values: list[float], error: str | None = None) -> str:
        """An interval ended: told to the study; a failed one is replaced (`_replace`), and commits no interval
        needs any more are removed (its member's next is decided when a slot asks for it)."""
        from xp.studies.search import tell

        state = tell(self.study, trial, state, values)
        if state == TrialState.FAIL:
            self._reached(trial, error)
            self._replace(trial)
        self._retain()
        return state

    def lost(self, trial: Trial, why: str) -> str:
        """An interval's worker was lost: FAIL, and replaced from the population."""
        from optuna.trial import TrialState as OptunaState

        self.study.tell(trial, state=OptunaState.FAIL)
        return "replaced from the population" if self._replace(trial) else "its member trains no more"

    def _reached(self, trial: Trial, error: str | None) -> None:
        """An interval that found no commit where its source interval committed (a complete one) was on a host
        that does not share checkpoint_dir with the source's: every commit is only where it was written, which
        no retry mends (each would train a member from scratch or fail): the study stops, saying so."""
        a = trial.user_attrs[PBT_ATTR]
        source = self.root / f"trial-{a['from']}"
        if a["from"] is None or f"resume={source}: no committed state" not in (error or ""):
            return
        from xp.errors import ConfigError

        raise ConfigError(f"checkpoint_dir={self.root}: member {a['member']}'s interval (trial {trial.number}) found "
                          f"no commit of trial {a['from']} there, on its slot's host: the slots' hosts do not share "
                          "that folder; a population across hosts needs a checkpoint_dir every slot's host reaches "
                          "(a shared file system), in a new study (this one's commits stay where they were written)")

    def _rng(self, trial: Trial | FrozenTrial) -> random.Random:
        return random.Random(f"{self.seed}-pbt-{trial.number}")  # (the same decisions when run again)

    def _next(self, last: FrozenTrial, latest: dict[int, Any]) -> None:
        """The next interval of the member whose latest is `last`. It is ranked, at the epoch its interval ended
        (like with like: a score at another epoch is another question), against every member that trained through
        that epoch (a member further along: its score then, reported by its interval); in the worst quantile of
        them, and not in the best, it takes the latest weights of one of the best and explores their
        hyperparameters; else it goes on as it was."""
        a = last.user_attrs[PBT_ATTR]
        at = self._scores(a["end"])
        scored = sorted(at, key=lambda m: at[m], reverse=self.maximize)  # best first
        k = max(1, int(len(scored) * self.pbt.quantile))
        member, g = a["member"], a["generation"] + 1
        donors = [m for m in scored[:k] if m != member and latest[m].user_attrs[PBT_ATTR]["end"] < self.epochs
                  and member in at and self._better(at[m], at[member])]  # (equal scores: no copy, it goes on)
        if len(scored) >= 2 and member in scored[-k:] and member not in scored[:k] and donors:
            rng = self._rng(last)  # (a donor's latest weights: at that epoch or further, with an epoch to train)
            donor = latest[rng.choice(donors)]
            params = self._explored(donor, rng)
            d = donor.user_attrs[PBT_ATTR]["member"]
            log.info(f"pbt: member {member} ({last.value:.4g} at epoch {a['end']}) takes member {d}'s weights "
                     f"({at[d]:.4g} at epoch {a['end']}; trial {donor.number}'s, epoch "
                     f"{donor.user_attrs[PBT_ATTR]['end']}) and "
                     "goes on with " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                               for k, v in params.items()))
            self._queue(params, self._interval(member, donor.user_attrs[PBT_ATTR]["generation"] + 1, donor.number, d))
        else:
            self._queue(dict(last.params), self._interval(member, g, last.number, None))

    def _better(self, a: float, b: float) -> bool:
        return a > b if self.maximize else a < b

    def _explored(self, donor: FrozenTrial, rng: random.Random, tries: int = 32) -> dict[str, Any]:
        """The donor's hyperparameters explored, unlike those of every interval that starts from the same commit
        (two members that take one donor's weights would otherwise train the same copy, a slot spent twice): drawn
        again while they match one, then drawn from the space."""
        taken = [t.params or t.system_attrs.get("fixed_params", {}) for t in self.study.get_trials(deepcopy=False)
                 if t.user_attrs.get(PBT_ATTR, {}).get("from") == donor.number and INTERRUPTED not in t.user_attrs
                 and t.state.name != TrialState.FAIL] + [dict(donor.params)]  # (going on as it was: the donor's)
        for _ in range(tries):
            params = explored(donor.params, list(self.spec.params), self.pbt, rng)
            if params not in taken:
                return params
        while (params := {p.name: _draw(p, rng) for p in self.spec.params}) in taken and tries:
            tries -= 1
        return params

    def _scores(self, epoch: int) -> dict[int, float]:
        """Each member's score at `epoch`, of the complete interval that trained its weights through it (the latest
        generation's: a member that took another's weights trained a new lineage); members not there yet: none."""
        through: dict[int, Any] = {}
        for t in self._trials(TrialState.COMPLETE):
            a = t.user_attrs[PBT_ATTR]
            if a["start"] < epoch <= a["end"] and (a["member"] not in through or a["generation"] >
                                                   through[a["member"]].user_attrs[PBT_ATTR]["generation"]):
                through[a["member"]] = t
        scores = {m: t.intermediate_values.get(epoch, t.value if t.user_attrs[PBT_ATTR]["end"] == epoch else None)
                  for m, t in through.items()}
        return {m: v for m, v in scores.items() if v is not None}

    def _queue(self, params: dict[str, Any], attr: dict[str, Any]) -> None:
        self.study.enqueue_trial(params, user_attrs={PBT_ATTR: attr})

    def _replace(self, trial: Trial) -> bool:
        """A member's interval failed (its worker lost, its training failed): it is trained again, from the latest
        weights (explored) of the member best at the epoch the lost interval started from (like with like, as
        `_next` ranks), where another member has some, else from where it started; a member that failed more
        than max_retry times trains no more."""
        a = trial.user_attrs[PBT_ATTR]
        if a["member"] in self._dropped():
            log.warning(f"pbt: member {a['member']} failed {self.spec.max_retry + 1} times: it trains no more")
            return False
        latest = {m: t for m, t in self._latest().items() if m != a["member"] and
                  a["start"] <= t.user_attrs[PBT_ATTR]["end"] < self.epochs}  # (as far as it got, or further)
        at = self._scores(a["start"]) if a["generation"] > 0 else {}
        ranked = [m for m in latest if m in at]
        if ranked:
            best = latest[(max if self.maximize else min)(ranked, key=at.__getitem__)]
            d = best.user_attrs[PBT_ATTR]
            params = self._explored(best, self._rng(trial))
            log.warning(f"pbt: member {a['member']}'s interval (trial {trial.number}) was lost: it is replaced from "
                        f"member {d['member']}'s weights ({at[d['member']]:.4g} at epoch {a['start']}; trial "
                        f"{best.number}, epoch {d['end']})")
            attr = self._interval(a["member"], d["generation"] + 1, best.number, d["member"])
            self._queue(params, attr)
        else:
            log.warning(f"pbt: member {a['member']}'s interval (trial {trial.number}) was lost: it runs again")
            self._queue(dict(trial.params), dict(a))
        return True

    def _retain(self) -> None:
        """Of the interval's commit folders, those a member holds now or a queued or running interval starts
        from stay; the others go (a population of P keeps about P)."""
        keep = {t.number for t in self._latest().values()}
        waiting = (_state(TrialState.WAITING), _state(TrialState.RUNNING))
        for t in self.study.get_trials(deepcopy=False, states=waiting):
            start = t.user_attrs.get(PBT_ATTR, {}).get("from")
            if start is not None:
                keep.add(start)
        for t in self._trials(TrialState.COMPLETE, TrialState.FAIL):
            if t.number not in keep:
                shutil.rmtree(self.root / f"trial-{t.number}", ignore_errors=True)


def dropped(study: Study, max_retry: int) -> set[int]:
    """Members whose intervals failed more than max_retry times: they train no more."""
    fails: dict[int, int] = {}
    for t in study.get_trials(deepcopy=False, states=(_state(TrialState.FAIL),)):
        if PBT_ATTR in t.user_attrs and INTERRUPTED not in t.user_attrs:
            m = t.user_attrs[PBT_ATTR]["member"]
            fails[m] = fails.get(m, 0) + 1
    return {m for m, n in fails.items() if n > max_retry}


def dropped_line(study: Study, spec: StudySpec) -> list[str]:
    """What the answer lacks where members were dropped (none: nothing to say)."""
    gone = sorted(dropped(study, spec.max_retry))
    if not gone:
        return []
    return [f"population: member{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))} trained no more (their "
            f"intervals failed more than max_retry={spec.max_retry} times, each failure's line above): the answer "
            f"is of the other {spec.pbt.population - len(gone)} of {spec.pbt.population} members"]


def _state(state: TrialState) -> Any:
    import optuna

    return optuna.trial.TrialState[state]



def schedule(study: Study, number: int) -> list[tuple[int, int, int, dict[str, Any]]]:
    """The hyperparameters a member's weights trained with, to trial `number`'s end: (first epoch, last epoch,
    member, params) per interval of its lineage, first to last; intervals in a row with the same member and
    params are one."""
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    chain, at = [], trials.get(number)
    while at is not None and PBT_ATTR in at.user_attrs:
        a = at.user_attrs[PBT_ATTR]
        chain.append((a["start"] + 1, a["end"], a["member"], dict(at.params)))
        at = trials.get(a["from"]) if a["from"] is not None else None
    out: list[tuple[int, int, int, dict[str, Any]]] = []
    for first, last, member, params in reversed(chain):
        if out and out[-1][2:] == (member, params):
            out[-1] = (out[-1][0], last, member, params)
        else:
            out.append((first, last, member, params))
    return out
