"""The messages between a run's (or a command's) process and the tracking service, typed with xp.wire's codec:

    run -> service:  Start (create the run), Open (drain its spool), Last (no more records), Close (wait for its
                     delivery, `wait` s at most); a command's MLflow work, an Op each (EndLost, DeliverLeft,
                     SweepResult, StudyResult, BestModel); Status (`python -m xp.tracking status`)
    service -> run:  Started, Reopen (an interrupted sweep's parent: the run's process reopens it), Refused (the
                     store's line), Result, Closed, Serving; unasked: Say (a line for the run's console)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from xp.states import RunStatus
from xp.wire import Message, Protocol

TRACKING = Protocol("tracking")


@TRACKING.kind("start")
@dataclass
class Start(Message):
    uri: str
    experiment: str
    run_name: str
    tags: dict[str, str]
    tidy: bool = True
    parent: str | None = None
    start_ms: int | None = None
    settle_later: bool = False
    wait_s: float = 0.0
    resumes: list[str] | None = None


@TRACKING.kind("open")
@dataclass
class Open(Message):
    folder: str
    artifact_uri: str | None = None


@TRACKING.kind("last")
@dataclass
class Last(Message):
    pass


@TRACKING.kind("close")
@dataclass
class Close(Message):
    wait: float


class Op(Message):
    """A command's MLflow work on store `uri`, done by the service for it (xp.trackingd: the function each kind
    names; service.call: by the command's process where no service serves the store): its fields are the
    function's arguments."""

    uri: str

    def args(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@TRACKING.kind("end_lost")
@dataclass
class EndLost(Op):
    """xp.tracking.ending.end_lost: a study's lost trials' runs ended."""
    uri: str
    parent: str
    trial_numbers: list[int]
    why: str
    state: str = RunStatus.FAILED
    study: str | None = None


@TRACKING.kind("deliver_left")
@dataclass
class DeliverLeft(Op):
    """xp.tracking.leftovers.deliver_left: what gone processes left for the store, delivered."""
    uri: str
    wait_s: float


@TRACKING.kind("sweep_result")
@dataclass
class SweepResult(Op):
    """xp.readback.work.sweep_result: a sweep's table rows and its parent's summary."""
    uri: str
    experiment_id: str
    parent: str
    kind: str
    params: list[str]
    metrics: list[str]
    study: str | None = None
    ranked: bool = False
    confirmed: bool = False
    last_epoch: int | None = None


@TRACKING.kind("study_result")
@dataclass
class StudyResult(Op):
    """xp.readback.work.study_result: a study's answer on its parent run, its best model registered."""
    uri: str
    parent: str | None
    register_model: str
    answer: dict[str, Any]
    counts_line: str = ""


@TRACKING.kind("best_model")
@dataclass
class BestModel(Op):
    """xp.readback.work.best_model: the registry's alias `best` on a trial's model."""
    uri: str
    name: str
    member: dict[str, Any]


@TRACKING.kind("status")
@dataclass
class Status(Message):
    pass


@TRACKING.kind("serving")
@dataclass
class Serving(Message):
    """What the service serves: the stores it opened (redacted), its connections now, how long it has been idle."""
    stores: list[str]
    connections: int
    idle_s: float


@TRACKING.kind("started")
@dataclass
class Started(Message):
    run_id: str
    artifact_uri: str
    experiment_id: str
    start_ms: int


@TRACKING.kind("reopen")
@dataclass
class Reopen(Message):
    run_id: str
    experiment_id: str


@TRACKING.kind("refused")
@dataclass
class Refused(Message):
    error: str


@TRACKING.kind("result")
@dataclass
class Result(Message):
    value: Any


@TRACKING.kind("closed")
@dataclass
class Closed(Message):
    done: bool
    left: int


@TRACKING.kind("say")
@dataclass
class Say(Message):
    level: int
    msg: str
