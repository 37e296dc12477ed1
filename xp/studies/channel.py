"""The one channel between a study's scheduler and its workers, whatever carries it (a socket pair on this machine,
a TCP connection a worker elsewhere makes back): the messages they exchange, typed, and where the scheduler waits
for them (`Inbox`: every worker's messages in the order they came, not file descriptors, so a carrier without one
fits too).

    scheduler -> worker:  Fork (to the zygote: a worker to fork for a slot), RunTrial, Prune (the answer to
                          ShouldPrune), Exit
    zygote -> scheduler:  Forked (the forked worker's process id), Exited (a forked worker's exit code)
    worker -> scheduler:  Hello (a worker elsewhere calling back, with its slot's secret), Ready, Error,
                          Report, ShouldPrune, Attr, Done, Kept

On the wire each is one line of JSON, {"op": KIND, ...fields}.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from xp.states import TrialState
from xp.wire import Channel as _Channel, Inbox, Message, Protocol, encode

__all__ = ["Channel", "Inbox", "Message", "encode", "decode"]

STUDY = Protocol("study")


@STUDY.kind("fork")
@dataclass
class Fork(Message):
    """To the zygote (xp.launching.zygote): fork a worker with these variables, without those, in this folder."""
    env: dict[str, str]
    unset: list[str]
    cwd: str


@STUDY.kind("trial")
@dataclass
class RunTrial(Message):
    """One trial to run: its parameters, the study's config they are set on, where its files and run go."""
    number: int
    params: dict[str, Any]
    study: str
    sweep: str
    base: list[str]  # the command line's overrides (and the user's config folders) the trial composes from
    task: list[str]  # ... and its parameters: its .hydra/overrides.yaml
    output_dir: str
    parent: str | None  # the study's MLflow parent run
    config: dict[str, Any] | None = None  # the study's composed config (its parameters are set on it)
    first: bool = True  # the worker's first trial (it tidies what a previous process left)
    settings: dict[str, Any] | None = None  # config values beside its parameters (a PBT member's epochs, resume)
    tags: dict[str, str] | None = None  # more tags of its run (a PBT member's lineage)


@STUDY.kind("prune")
@dataclass
class Prune(Message):
    prune: bool
    why: str = ""  # the pruner's reason (xp.studies.pruning.should_prune)


@STUDY.kind("exit")
@dataclass
class Exit(Message):
    pass


@STUDY.kind("forked")
@dataclass
class Forked(Message):
    """From the zygote (xp.launching.zygote): the worker it forked for the last Fork asked, its process id."""
    pid: int


@STUDY.kind("exited")
@dataclass
class Exited(Message):
    """From the zygote: one of its workers ended, with this exit code (negative: the signal that ended it)."""
    pid: int
    code: int


@STUDY.kind("hello")
@dataclass
class Hello(Message):
    token: str


@STUDY.kind("ready")
@dataclass
class Ready(Message):
    pid: int


@STUDY.kind("error")
@dataclass
class Error(Message):
    error: str


@STUDY.kind("report")
@dataclass
class Report(Message):
    values: list[float]  # the study's objectives after epoch `step`
    step: int


@STUDY.kind("should_prune")
@dataclass
class ShouldPrune(Message):
    pass


@STUDY.kind("attr")
@dataclass
class Attr(Message):
    key: str
    value: Any


@STUDY.kind("done")
@dataclass
class Done(Message):
    """How a trial ended: its state (COMPLETE, PRUNED, FAIL), its objectives' values, the failure's line, whether
    the trial changed the worker's process for good (mixed precision: the worker leaves), and whether its run's
    records are in the tracking store already (`kept`; if not, Kept says when they are)."""
    state: str = TrialState.FAIL  # a TrialState's value (a plain string off the wire)
    values: list[float] = field(default_factory=list)
    error: str | None = None
    recycle: bool = False
    kept: bool = True


@STUDY.kind("kept")
@dataclass
class Kept(Message):
    """The records of trial `number`'s run (its last points, its model) are in the tracking store now: the trial
    counts complete from here (a trial is told COMPLETE only once what it made is kept: had its host gone before,
    with the records on its disk, the study would hold a complete trial without its model)."""
    number: int



def decode(line: bytes) -> Message:
    return STUDY.decode(line)


class Channel(_Channel):
    """A channel that carries the study's messages."""

    def __init__(self, sock: socket.socket):
        super().__init__(sock, STUDY)
