"""The plan handed down: the launching process plans a job once and gives every process it launches that plan,
with what else the process must know (`Launched`: its MLflow run, elastic membership), serialised (JSON,
compressed, base64) in one variable of the job's environment; a launched process reads them back, typed,
instead of planning again from its command line or reading variables deep inside.

A folder data set's listing (every image's path) stays behind: it can outgrow a variable (execve takes 128 KiB
a string), and a process lists the folder again, the same way (a seeded split), where it prepares the data.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import os
import types
import typing
import zlib
from typing import Any

from xp.data import datasets
from xp.run.plan import Plan

PLAN_ENV = "XP_PLAN"


@dataclasses.dataclass(frozen=True)
class Launched:
    """What a launched process is told beside its plan."""
    run_id: str | None = None  # the MLflow run the launching process created: rank 0 logs into it
    stop_flag: str | None = None  # elastic: the file whose presence asks the workers to stop after this epoch
    resumed: bool = False  # elastic: a later round (the run has its parameters logged already)
    job_t0: float | None = None  # when the job's run started (time.time()): its bill's clock (elastic: the
    # rounds', a spot trace's zero)


def dumps(plan: Plan | None, launched: Launched) -> str:
    """The plan (None: the workers plan themselves, as for batch=auto) and the launch context, as one line of
    text a variable can carry."""
    data: dict[str, Any] = {"launched": dataclasses.asdict(launched), "plan": None, "listed": False}
    if plan is not None:
        light = dataclasses.replace(plan, dataset=dataclasses.replace(plan.dataset, listing=None))
        data.update(plan=dataclasses.asdict(light), listed=plan.dataset.listing is not None)
    return base64.b64encode(zlib.compress(json.dumps(data).encode(), 6)).decode()


@functools.cache
def _envelope(text: str) -> dict[str, Any]:
    return json.loads(zlib.decompress(base64.b64decode(text)))


def loads(text: str) -> tuple[Plan | None, Launched]:
    """The plan (a folder data set listed again, as the launching process listed it) and the launch context."""
    data = _envelope(text)
    launched = Launched(**data["launched"])
    if data["plan"] is None:
        return None, launched
    plan = _decode(Plan, data["plan"])
    if data["listed"]:
        d = plan.dataset
        plan = dataclasses.replace(plan, dataset=dataclasses.replace(d, listing=datasets.describe(d.name, d.options).listing))
    return plan, launched


def received() -> Plan | None:
    """The plan this process was launched with, or None (it plans itself)."""
    text = os.environ.get(PLAN_ENV)
    return loads(text)[0] if text else None


def launched() -> Launched | None:
    """What this process was launched with, or None (nothing launched it); its plan is left undecoded."""
    text = os.environ.get(PLAN_ENV)
    return Launched(**_envelope(text)["launched"]) if text else None


def _decode(tp: Any, value: Any) -> Any:
    """`value` (JSON) as an instance of the annotated type `tp`: dataclasses, tuples, optionals, the rest as is."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _decode(next(a for a in typing.get_args(tp) if a is not type(None)), value)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        cls: Any = tp  # (a dataclass type)
        return cls(**{f.name: _decode(hints[f.name], value[f.name]) for f in dataclasses.fields(tp) if f.name in value})
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in value)
        return tuple(_decode(a, v) for a, v in zip(args, value))
    return value
