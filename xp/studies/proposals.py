"""A study's next trial: a proposal asked of Optuna, then either reused (the same parameters ran: runs are
deterministic), dropped as a duplicate (a trial claimed them first: its lower number is the claim), or run.
The study's schedulers (xp.studies.sweeper) ask through `propose`."""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

from xp.studies.trial import DUPLICATE

log = logging.getLogger("xp")


def propose(study: Any, dists: dict[str, Any], n: int) -> tuple[list[Any], int]:
    """Up to n new trials to run, and how many asked trials reused an earlier result instead (they count). Fewer
    (none, none reused) when MAX_DUPLICATES proposals in a row were a running trial's: wait for one to end."""
    trials: list[Any] = []
    reused, duplicates = 0, 0
    while len(trials) < n - reused and duplicates < MAX_DUPLICATES:
        with warnings.catch_warnings():  # "heartbeat is supposed to be used with Study.optimize": xp beats itself
            warnings.simplefilter("ignore", UserWarning)
            t = study.ask(dists)
        same = _same_params(study, t)  # one read: a trial that ends meanwhile is seen running or ended, not missed
        if _reuse_earlier(study, t, same):  # the same parameters already ran: runs are deterministic
            reused += 1
            continue
        if _running_already(study, t, same):  # another sweeper (or this one) claimed them first
            duplicates += 1
            continue
        trials.append(t)
    return trials, reused


MAX_DUPLICATES = 10  # proposals in a row that a running trial has before the sweeper waits for one to end (a search
# space smaller than its sweepers' slots)


SETTLING_S = 2.0  # a trial created this recently whose parameters are not all set yet is waited for (see below)


def _same_params(study: Any, trial: Any) -> list[Any]:
    """The study's other running, waiting or finished trials with `trial`'s parameters. A trial is created, then
    its parameters are set, in calls of their own: a lower-numbered trial created moments ago whose parameters are
    not all there yet may be about to have these; it is read again until they are (SETTLING_S at most)."""
    import datetime

    from optuna.trial import TrialState

    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
    params = trial.params  # (a copy made at each reading: once, not once per trial of the study)
    deadline = time.monotonic() + SETTLING_S
    while True:
        trials = study.get_trials(deepcopy=False, states=states)
        recent = datetime.datetime.now() - datetime.timedelta(seconds=SETTLING_S)
        unsettled = [o for o in trials if o.number < trial.number and o.state == TrialState.RUNNING
                     and set(o.params) < set(params) and o.datetime_start and o.datetime_start > recent]
        if not unsettled or time.monotonic() > deadline:
            return [o for o in trials if o.number != trial.number and o.params == params]
        time.sleep(0.01)


def _running_already(study: Any, trial: Any, same: list[Any]) -> bool:
    """Drop `trial` (FAIL, marked duplicate_of, not counted towards the budget) if a trial created before it (a lower
    number) with the same parameters is running or waiting: sweepers sharing a study must not run one parameter
    set twice (their per-trial seeds make that rare in continuous spaces, not in small discrete ones). The claim is
    the trial's number, which the storage gives once and in order: of two same-parameter trials asked at the same
    moment, the later one's read (after its own creation) sees the earlier, so exactly the earlier one runs, at any
    timing, and neither depends on the other having looked yet."""
    from optuna.trial import TrialState

    for other in same:
        if other.state in (TrialState.RUNNING, TrialState.WAITING) and other.number < trial.number:
            trial.set_user_attr(DUPLICATE, other.number)
            study.tell(trial, state=TrialState.FAIL)
            log.info(f"trial {trial.number}: the same parameters as trial {other.number}, which is running: "
                     "asking again")
            return True
    return False


def _reuse_earlier(study: Any, trial: Any, same: list[Any]) -> bool:
    """Tell `trial` the outcome of a finished trial with the same parameters, if there is one.

    An xp run is a function of its config (fixed seed, data order, initial weights), so
    rerunning the same parameters costs a whole run and teaches the sampler nothing.
    """
    from optuna.trial import TrialState

    for old in same:
        if old.state in (TrialState.COMPLETE, TrialState.PRUNED):
            trial.set_user_attr("reused_from_trial", old.number)
            if old.state == TrialState.COMPLETE:
                study.tell(trial, old.values)
            else:
                study.tell(trial, state=TrialState.PRUNED)
            log.info(f"trial {trial.number}: same parameters as trial {old.number}; its result is reused")
            return True
    return False
