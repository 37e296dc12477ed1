"""The states xp decides and reads, as types: an MLflow run's, an Optuna trial's, how a run ended.

Each is a `StrEnum` whose values are the strings of the system it crosses into (MLflow's run status, Optuna's
trial state names), so a member goes to that system as it is and what the system returns
compares equal to a member: `run.info.status == RunStatus.RUNNING`, `t.state.name == TrialState.FAIL`. No other
module spells these states as strings (tests/test_structure.py greps for them); a launcher's job states are
its own enum, in its module.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """An MLflow run's status (mlflow.entities.RunStatus's names), as xp ends and reads runs."""
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"


class TrialState(StrEnum):
    """An Optuna trial's state (optuna.trial.TrialState's names), as a study's trial reports it and xp counts it;
    also the MLflow tag optuna.trial_state of a trial's run."""
    RUNNING = "RUNNING"
    WAITING = "WAITING"
    COMPLETE = "COMPLETE"
    PRUNED = "PRUNED"
    FAIL = "FAIL"


TRIAL_ENDS = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)  # a trial's states once it is told


class Ending(StrEnum):
    """How one run of xp ended (xp.run.experiment.Outcome): a plain run FINISHED; a study's trial as Optuna is told
    (COMPLETE, PRUNED, FAIL); an elastic job's worker STOPPED, to be relaunched into a new group."""
    FINISHED = RunStatus.FINISHED.value
    COMPLETE = TrialState.COMPLETE.value
    PRUNED = TrialState.PRUNED.value
    FAIL = TrialState.FAIL.value
    STOPPED = "STOPPED"

INTERRUPTED = "xp.interrupted"  # user attribute of a trial its study stopped before it ended (Ctrl-C, SIGTERM)
# user attribute of a trial whose command was killed while the sampler drew its parameters: never run, not a
# proposal (xp.studies.trial.proposal_number: the next one draws what it would have), not counted
VOID = "xp.void"
