"""A study's result: its search's answer (xp.answers) written once at its end and said, logged on the sweep's
parent run, its model in the Model Registry (summarize); while it runs, the registry's alias `best` follows the
search's leader as each new one's model reaches the store (BestModel)."""

from __future__ import annotations

import logging
import dataclasses
import json
import os
import threading
from typing import TYPE_CHECKING

from xp.errors import redact
from xp.answers import Answer, Member
from xp.studies.study import StudySpec
from xp.states import VOID
from xp.studies.trial import DUPLICATE, INTERRUPTED

if TYPE_CHECKING:
    from optuna import Study

    from xp.studies.search import Search


log = logging.getLogger("xp")

ANSWER_ATTR = "xp.answer"  # the Optuna study's user attribute holding its latest answer (JSON of Answer)


def counts(study: Study) -> dict[str, int]:
    """The study's trials by how they ended, as Optuna holds them: its FAIL trials split into those that failed,
    those given back at a stop (queued again: not failures) and proposals dropped as duplicates of a running one."""
    out = {"complete": 0, "pruned": 0, "fail": 0, "given back": 0, "duplicate": 0, "void": 0, "running": 0,
           "waiting": 0}
    for t in study.get_trials(deepcopy=False):
        name = t.state.name.lower()
        if name == "fail":
            name = "given back" if INTERRUPTED in t.user_attrs else "duplicate" if DUPLICATE in t.user_attrs \
                else "void" if VOID in t.user_attrs else "fail"
        out[name] = out.get(name, 0) + 1
    return out


def counts_line(c: dict[str, int]) -> str:
    """`10 trials (8 complete, 2 pruned, 0 fail); Optuna also holds 4 given back at a stop and queued again`."""
    ran = c["complete"] + c["pruned"] + c["fail"] + c["running"]
    line = f"{ran} trials ({c['complete']} complete, {c['pruned']} pruned, {c['fail']} fail"
    line += f", {c['running']} running" if c["running"] else ""
    extra = [f"{c['given back']} given back at a stop and queued again"] if c["given back"] else []
    extra += [f"{c['duplicate']} proposals dropped as duplicates"] if c["duplicate"] else []
    extra += [f"{c['void']} cut short while their parameters were drawn"] if c["void"] else []
    extra += [f"{c['waiting']} queued"] if c["waiting"] else []
    return line + ")" + (f"; Optuna also holds {', '.join(extra)}" if extra else "")


def summarize(study: Study, spec: StudySpec, search: Search, tracking_uri: str | None = None) -> Answer:
    """The search's answer (xp.answers), completed with what every study has (its counts, what the command
    line fixed, how its question changed), written once: kept in the study's storage, said on the console, and
    on the sweep's parent MLflow run (description, tags, best_trial.json), its best trial's model registered."""
    import dataclasses

    from xp.studies.question import changes_said

    tally = counts(study)  # (its fail: less dropped proposals and trials stopped and requeued)
    answer = dataclasses.replace(search.answer(), counts=tally, fixed=list(spec.fixed), changes=changes_said(study),
                                 searched=[p.name for p in spec.params],
                                 storage=redact(spec.storage))
    keep(study, answer)
    log.info(f"study {spec.study_name}: {counts_line(tally)}")
    for line in answer.lines():
        (log.warning if line in answer.lacking else log.info)(f"  {line}")
    parent = os.environ.get("XP_PARENT_RUN_ID")
    if tracking_uri and (parent or spec.register_model):  # (by the tracking service, where there is one)
        from xp.tracking.messages import StudyResult
        from xp.trackingd import call

        said = call(StudyResult(tracking_uri, parent, spec.register_model or "", answer.as_dict(), counts_line(tally)))
        if said:
            log.info(f"  {said}")
    return answer


class BestModel:
    """While a single-objective study runs, the registry's alias `best` follows its search's leader (the answer
    it would give now, xp.studies.search): a new leader is registered, and the alias moved to it, once its run's
    model is in the store (a study's trial reports before its worker's spool has sent the run's records: this
    thread waits for the model, off the scheduler's path; a newer leader replaces the one it waits for; a run
    that ended without a model is let go). The study's end registers its answer's best either way (summarize)."""

    POLL_S = 0.5

    def __init__(self, search: Search, spec: StudySpec, uri: str):
        self.search, self.spec, self.uri = search, spec, uri
        leader = search.leader()  # a resumed study's best so far
        self.trial: int | None = leader.trial if leader is not None else None
        self._waiting: Member | None = None  # the leader whose model is awaited
        self._wake, self._closing = threading.Event(), False
        self._thread = threading.Thread(target=self._loop, name="xp-best-model", daemon=True)
        self._thread.start()

    @classmethod
    def of(cls, search: Search, spec: StudySpec, uri: str | None) -> BestModel | None:
        """One for a study that registers a single objective's best into a tracking store; else None."""
        return cls(search, spec, uri) if uri and spec.register_model and not spec.multi_objective else None

    def told(self, leader: Member | None) -> None:
        """A trial completed: the search's leader (as the runner read it) may be another."""
        if leader is not None and leader.trial != self.trial:
            self.trial, self._waiting = leader.trial, leader
            self._wake.set()

    def close(self, timeout_s: float = 30.0) -> None:
        """No more trials: the thread stops (what it awaited, the study's end registers)."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=timeout_s)

    def _loop(self) -> None:
        from xp.tracking.messages import BestModel
        from xp.trackingd import call

        while not self._closing:
            self._wake.wait(timeout=self.POLL_S if self._waiting is not None else None)
            self._wake.clear()
            leader = self._waiting
            if leader is None or self._closing:
                continue
            try:
                now = self.search.leader() if leader.mlflow_run_id is None else None  # (its worker sets it as
                if now is not None and now.trial == leader.trial:  # the run starts: read it again)
                    leader.mlflow_run_id = now.mlflow_run_id
                if leader.mlflow_run_id:  # (by the tracking service, where there is one)
                    answer = call(BestModel(self.uri, self.spec.register_model or "", dataclasses.asdict(leader)))
                    if answer["said"]:
                        log.info(f"study {self.spec.study_name}: {answer['said']}")
                    elif answer["waiting"]:
                        continue  # its records are on their way
                if self._waiting is leader:  # (a newer leader may have come meanwhile)
                    self._waiting = None
            except Exception as e:  # the store away, say: the study goes on; its end registers its best
                log.debug("study %s: the best model is not registered yet (%s)", self.spec.study_name, e)


def keep(study: Study, answer: Answer) -> None:
    """The answer into the study's storage: the same command's views, and the next command's, read it."""
    study.set_user_attr(ANSWER_ATTR, json.dumps(answer.as_dict(), default=str))


def kept(study: Study) -> Answer | None:
    """The answer the study's last command wrote (None: none yet)."""
    text = study.user_attrs.get(ANSWER_ATTR)
    return Answer.from_dict(json.loads(text)) if text else None


def load(storage: str, study_name: str) -> Answer | None:
    """The answer a study in `storage` keeps (None: no such study, or no answer yet)."""
    import optuna

    from xp.studies.trial import storage_of

    try:
        return kept(optuna.load_study(study_name=study_name, storage=storage_of(storage)))
    except KeyError:
        return None
