"""How runs end: the state a run's end gets (one decision for every caller), and runs whose process is gone ended
by another."""

from __future__ import annotations

import logging
import time
from typing import Any

from xp.errors import one_line
from xp.interrupts import stop_in
from xp.states import RunStatus
from xp.tracking.stores import open_client

log = logging.getLogger("xp")

TRIES = 3  # end_lost's tries at a store that errs


def end_state(error: BaseException | None = None, failed: bool = False) -> RunStatus:
    """The state a run ends in, decided here for every caller (a run, a launched job, a Slurm submission, a
    sweep's parent, a report): KILLED for Ctrl-C and SIGTERM, FAILED for any other error or a failed outcome,
    FINISHED otherwise."""
    if error is not None and stop_in(error) is not None:  # (an error a stop caused, too)
        return RunStatus.KILLED
    return RunStatus.FAILED if error is not None or failed else RunStatus.FINISHED


def end_lost(uri: str, parent: str, trial_numbers: list[int], why: str, state: RunStatus = RunStatus.FAILED,
             study: str | None = None) -> list[str] | None:
    """End the runs of a study's trials (under the study's `parent` run) still RUNNING though their process was
    lost (a study's worker killed, or gone with its host or node: FAILED; stopped with its study and killed before
    it ended its run: KILLED). The scheduler knows the process is gone, and no process on that host may ever start
    again to say so (end_orphans); the runs are found by their tags, which they carry from their creation (a worker
    may be gone before it said which run it made), in one search. A store that does not answer leaves them to
    end_orphans or xp.sync. With `study`: the runs of that study's trials under any parent in the parent's experiment
    (trials an earlier command of the study lost: killed with its workers on another host, it ended none of their
    runs). Returns the runs ended; None when the store did not answer (the caller tries again later)."""
    numbers, ended = {str(int(n)) for n in trial_numbers}, list[str]()
    for attempt in range(TRIES):  # (a busy store's error, under load, is tried again: a run left RUNNING is worse)
        try:
            client = open_client(uri)
            experiment = client.get_run(parent).info.experiment_id
            under = f"tags.`optuna.study` = '{study}'" if study else f"tags.mlflow.parentRunId = '{parent}'"
            running = client.search_runs([experiment], f"{under} and attributes.status = '{RunStatus.RUNNING}'",
                                         max_results=1000)
            for run_id in [r.info.run_id for r in running if r.data.tags.get("optuna.trial_number") in numbers]:
                end_for(client, run_id, why, state)
                ended.append(run_id)
            return ended
        except Exception as e:
            log.debug("could not end the runs of lost trials %s: %s", trial_numbers, one_line(e))
            if attempt + 1 < TRIES:
                time.sleep(0.5)
    return None


def end_for(client: Any, run_id: str, why: str, state: RunStatus) -> None:
    """End a run its own process could not, saying why (tag xp.ended_by)."""
    client.set_tag(run_id, "xp.ended_by", f"xp: {why}")
    client.set_terminated(run_id, state)
