"""What a study asks: the settings its trials hold fixed, recorded in the study, so that a command that changes
them under the same name is refused (or continued on the user's word, recorded) instead of mixing answers.

A study's *question* is everything that changes a trial's result: the composed config's keys that can (the
model and its options, dataset, backend, dtype, epochs, the hyperparameters it does not search, ...), the search
space and the objectives, and a recipe's own settings. Whether a key can change a result is declared where the key
is defined, at the end of its comment in conf/ (xp.confkeys.QUESTION: result, measured, how, result if KEY), and
a test holds every key of conf/ to it. The question is a flat {key: value} dict; the study keeps it as its user
attribute QUESTION, and every change the user accepted (sweep.continue_changed=true) in CHANGES.

A study made before xp recorded its question gets it from the first command that continues it.
"""

from __future__ import annotations

import datetime
import dataclasses
import functools
import json
import logging
import os
from typing import Any

from xp.errors import ConfigError, redact
from xp.studies.study import Param, StudySpec

log = logging.getLogger("xp")

QUESTION = "xp.question"  # the study's user attribute: its question ({key: value as JSON})
CHANGES = "xp.question_changes"  # ... and the changes the user accepted: [{"at", "changed": {key: [was, now]}}]

# What a study's objective can be that is measured of a trial rather than trained into it: a `measured` key counts
MEASURED = ("throughput", "cost_usd", "train_time_s", "epoch_time_s")
NOT_SETTINGS = ("sweep", "hydra")  # the study's own node (its space and objectives count below) and Hydra's


@functools.lru_cache(maxsize=1)
def declared() -> dict[str, str]:
    from xp import shipped
    from xp.confkeys import questions

    return questions(shipped("conf"))


def klass_of(key: str) -> str:
    """What conf/ declares `key` to be to a study's question (its own, or its nearest node's; a key conf/ does not
    know: result)."""
    classes, parts = declared(), key.split(".")
    return next((classes[".".join(parts[:n])] for n in range(len(parts), 0, -1) if classes.get(".".join(parts[:n]))),
                "result")


def never_asks(key: str) -> bool:
    """A key that can never change a trial's result (where or how it runs, what is recorded besides)."""
    return key.split(".")[0] in NOT_SETTINGS or klass_of(key) == "how"


def asks(key: str, flat: dict[str, Any], measured: bool) -> bool:
    """Whether `key` of a composed config (flattened) is part of the question, as conf/ declares it (a key conf/
    does not know, a user's own, counts: the safe side)."""
    if key.split(".")[0] in NOT_SETTINGS:
        return False
    klass = klass_of(key)
    if klass.startswith("result if "):
        on, eq, value = klass[len("result if "):].partition("=")
        return (str(flat.get(on)).lower() == value.lower()) if eq else flat.get(on) not in (None, False, 0, "")
    return klass == "result" or klass == "measured" and measured


def _space(p: Param) -> str:
    if p.kind == "categorical":
        return "choice(" + ", ".join(json.dumps(c) for c in p.choices) + ")"
    low, high = p.bounds
    return f"{p.kind}[{low:g}, {high:g}]" + (" log" if p.log else "")


def question_of(config: dict[str, Any], spec: StudySpec) -> dict[str, str]:
    """The study's question: the composed `config`'s settings that change a trial's result (less the searched
    ones), its search space and objectives; values as JSON text (compared as written)."""
    from xp.studies.compose import flatten

    searched = {p.name for p in spec.params}
    flat = flatten(dict(config))
    measured = any(o.metric in MEASURED for o in spec.objectives)
    out = {k: json.dumps(v, sort_keys=True) for k, v in flat.items() if k not in searched and asks(k, flat, measured)}
    out.update({f"space.{p.name}": _space(p) for p in spec.params})
    out["objectives"] = ", ".join(f"{o.direction} {o.metric}" for o in spec.objectives)
    if spec.settings:
        out["study.settings"] = " ".join(spec.settings)
    if spec.pbt is not None:  # (a population of another size, interval or exploration asks another question)
        out["study.pbt"] = json.dumps(dataclasses.asdict(spec.pbt), sort_keys=True)
    return out


def differences(was: dict[str, str], now: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    """The keys whose values differ. A key one side lacks differs only if the other side searches it, or it is the
    search space, the objectives or the study's own (a config key a newer xp added, or an older one had, is not a
    change of the question). A key searched on one side and fixed on the other is named once, by its key."""
    own = ("space.", "objectives", "study.")

    def counts(k: str) -> bool:
        return (k in was and k in now) or k.startswith(own) or f"space.{k}" in was or f"space.{k}" in now

    out = {k: (was.get(k), now.get(k)) for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k) and counts(k)}
    return {k: v for k, v in out.items() if not (k.startswith("space.") and k[len("space."):] in out)}


def _said(changed: dict[str, tuple[str | None, str | None]], was: str = "before", now: str = "now") -> str:
    def value(v: str | None, key: str) -> str:
        if v is None:
            return "(searched)" if not key.startswith("space.") else "(not searched)"
        return v.strip('"')

    return "; ".join(f"{k}: {value(a, k)} {was}, {value(b, k)} {now}" for k, (a, b) in changed.items())


def refusal(spec: StudySpec, changed: dict[str, tuple[str | None, str | None]], trials: int) -> ConfigError:
    return ConfigError(
        f"study {spec.study_name} ({redact(spec.storage)}) answers another question: its {trials} trials ran with "
        f"other fixed settings ({_said(changed, 'in the study', 'in this command')}); its answer would mix both. Start another study "
        f"(sweep.study_name=NEW_NAME), or continue this one anyway, recorded in it (sweep.continue_changed=true)")


def recorded(spec: StudySpec) -> tuple[dict[str, str] | None, int] | None:
    """The question the study `spec` names has recorded, and its trial count; None when there is no such study
    (or its store does not exist yet). Read without creating anything."""
    import optuna

    from xp.studies.trial import JOURNAL, journal_path, storage_of
    from xp.storefiles import first_use, sqlite_path

    path = sqlite_path(spec.storage)
    if path is not None and not (path.exists() and path.stat().st_size > 0):
        return None
    if spec.storage.startswith(JOURNAL) and not os.path.getsize(journal_path(spec.storage)):
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with first_use(spec.storage, "sweep.storage"):
        storage = optuna.storages.get_storage(storage_of(spec.storage))
    try:
        sid = storage.get_study_id_from_name(spec.study_name)
    except KeyError:
        return None
    attrs = storage.get_study_user_attrs(sid)
    return attrs.get(QUESTION), len(storage.get_all_trials(sid, deepcopy=False))


def check(spec: StudySpec, question: dict[str, str]) -> None:
    """Before anything runs: refuse a command that reaches an existing study with another question (one line
    naming each difference and the two ways on), unless it says sweep.continue_changed=true."""
    found = recorded(spec)
    if found is None or found[0] is None or spec.continue_changed:
        return
    changed = differences(found[0], question)
    if changed:
        raise refusal(spec, changed, found[1])


def settle(study: Any, spec: StudySpec, question: dict[str, str]) -> list[str]:
    """The study's question, recorded (its first command, or the first since xp records it), or checked again
    (two commands that started a new study at once: the second is refused), or, on the user's word
    (sweep.continue_changed=true), changed with the change recorded. Returns the lines to say."""
    attrs = study.user_attrs
    was = attrs.get(QUESTION)
    if was is None:
        study.set_user_attr(QUESTION, question)
        return [] if not study.get_trials(deepcopy=False) else [
            f"study {spec.study_name}: the settings its trials hold fixed recorded now (a study made before xp "
            "recorded them): a command that changes them is refused from here on"]
    changed = differences(was, question)
    if not changed:
        return []
    if not spec.continue_changed:
        raise refusal(spec, changed, len(study.get_trials(deepcopy=False)))
    at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    history = [*attrs.get(CHANGES, []), {"at": at, "trials_before": len(study.get_trials(deepcopy=False)),
                                         "changed": {k: list(v) for k, v in changed.items()}}]
    study.set_user_attr(CHANGES, history)
    study.set_user_attr(QUESTION, question)
    return [f"study {spec.study_name}: continued under changed settings, as asked (sweep.continue_changed=true; "
            f"recorded in the study): {_said(changed)}"]


def changes_said(study: Any) -> list[str]:
    """One line per change of its question the study was continued under (for its summary and report)."""
    return [f"continued at {c['at']} after {c.get('trials_before', '?')} trials under changed settings ("
            + _said({k: tuple(v) for k, v in c["changed"].items()}) + ")" for c in study.user_attrs.get(CHANGES, [])]
