"""The messages between a run's (or a command's) process and the tracking service, typed with xp.wire's codec:

    run -> service:  Start (create the run), Open (drain its spool), Last (no more records), Close (wait for its
                     delivery, `wait` s at most), Call (a command's MLflow work: "MODULE:NAME" of an xp module's CALLS)
    service -> run:  Started, Reopen (an interrupted sweep's parent: the run's process reopens it), Refused (the
                     store's line), Result, Closed; unasked: Say (a line for the run's console)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


@TRACKING.kind("call")
@dataclass
class Call(Message):
    work: str
    args: dict[str, Any]


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
