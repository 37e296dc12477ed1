"""A study's result: its best trial (or Pareto front) said, logged on the sweep's parent run, and its model in the
Model Registry: alias `best` moved to each new best trial's model as it reaches the store (BestModel), and the
final best registered at the study's end (summarize)."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from xp.errors import redact
from xp.studies.pbt import answers, dropped_line, schedule_line
from xp.studies.study import FINISHED, StudySpec
from xp.studies.trial import DUPLICATE, INTERRUPTED

log = logging.getLogger("xp")


def member(trial: Any, spec: StudySpec) -> dict[str, Any]:
    """A trial of the best (or the Pareto front), as the summary and the registry take it."""
    return {"trial": trial.number, "values": dict(zip([o.metric for o in spec.objectives], trial.values)),
            "params": trial.params, "mlflow_run_id": trial.user_attrs.get("mlflow_run_id")}


def counts(study: Any) -> dict[str, int]:
    """The study's trials by how they ended, as Optuna holds them: its FAIL trials split into those that failed,
    those given back at a stop (queued again: not failures) and proposals dropped as duplicates of a running one."""
    out = {"complete": 0, "pruned": 0, "fail": 0, "given back": 0, "duplicate": 0, "running": 0, "waiting": 0}
    for t in study.get_trials(deepcopy=False):
        name = t.state.name.lower()
        if name == "fail":
            name = "given back" if INTERRUPTED in t.user_attrs else "duplicate" if DUPLICATE in t.user_attrs else "fail"
        out[name] = out.get(name, 0) + 1
    return out


def counts_line(c: dict[str, int]) -> str:
    """`10 trials (8 complete, 2 pruned, 0 fail); Optuna also holds 4 given back at a stop and queued again`."""
    ran = c["complete"] + c["pruned"] + c["fail"] + c["running"]
    line = f"{ran} trials ({c['complete']} complete, {c['pruned']} pruned, {c['fail']} fail"
    line += f", {c['running']} running" if c["running"] else ""
    extra = [f"{c['given back']} given back at a stop and queued again"] if c["given back"] else []
    extra += [f"{c['duplicate']} proposals dropped as duplicates"] if c["duplicate"] else []
    extra += [f"{c['waiting']} queued"] if c["waiting"] else []
    return line + ")" + (f"; Optuna also holds {', '.join(extra)}" if extra else "")


def summarize(study: Any, spec: StudySpec, tracking_uri: str | None = None, base_seed: int = 0) -> dict[str, Any]:
    """Print the best trial (or the Pareto front), log it on the sweep's parent MLflow run, register its model.
    With sweep.confirm, the best is the best by mean across seeds (xp.studies.confirm), said with its spread."""
    from xp.studies import confirm
    from xp.studies.question import changes_said

    tally = counts(study)  # (its fail: less dropped proposals and trials stopped and requeued)
    states = {s: tally[s.lower()] for s in FINISHED}
    front = [member(t, spec) for t in (answers(study, spec.objectives[0].direction == "maximize") if spec.pbt
                                        else study.best_trials)]
    log.info(f"study {spec.study_name}: {counts_line(tally)}")
    changes = changes_said(study)
    for line in changes:
        log.info(f"  {line}")
    title = "Pareto front" if spec.multi_objective else "best trial"
    for f in front:
        log.info(f"  {title}: trial {f['trial']}  " + "  ".join(f"{k}={v:.4g}" for k, v in f["values"].items())
                 + "  " + " ".join(f"{k}={v}" for k, v in f["params"].items()))
    lineage = [schedule_line(study, front[0]["trial"])] if spec.pbt and front else []  # (a population's answer)
    for line in lineage:
        log.info(f"  {line}")
    lacking = dropped_line(study, spec) if spec.pbt else []
    for line in lacking:
        log.warning(f"  {line}")
    confirmed = confirm.results(study, spec, base_seed)
    metric = spec.objectives[0].metric
    confirmation = confirm.said(confirmed, metric)
    for line in confirmation:
        log.info(f"  {line}")
    if confirmed and front and confirmed[0].trial != front[0]["trial"]:  # the best by mean is the study's answer
        front = [member(study.trials[confirmed[0].trial], spec)]
    summary = {"study": spec.study_name, "storage": redact(spec.storage), "trials": states, "counts": tally,
               "best": front, "schedule": lineage, "population_lacking": lacking,
               "fixed_on_command_line": list(spec.fixed), "question_changes": changes,
               "confirmed": [{"trial": c.trial, "params": c.params, "values": c.values, "mean": c.mean,
                              "std": None if len(c.values) < 2 else c.std} for c in confirmed]}
    description = "\n".join([f"**Study `{spec.study_name}`**: {counts_line(tally)}."
                             + (f" Fixed on the command line (not searched): {', '.join(spec.fixed)}." if spec.fixed
                                else ""), *(f"- {c}" for c in changes),
                             *(f"- The best member's {c[4:]}" for c in lineage), *(f"- {c}" for c in lacking),
                             *(f"- {c.strip()}" for c in confirmation)])
    parent = os.environ.get("XP_PARENT_RUN_ID")
    if tracking_uri and (parent or spec.register_model):  # (by the tracking service, where there is one)
        from xp.tracking import service
        from xp.readback.work import study_result

        said = service.call(tracking_uri, study_result, parent=parent, study=spec.study_name,
                            register_model=spec.register_model or "", metric=spec.objectives[0].metric,
                            multi_objective=spec.multi_objective, front=front, summary=summary,
                            description=description)
        if said:
            log.info(f"  {said}")
    return summary


class BestModel:
    """While a single-objective study runs, the registry's alias `best` follows its best trial: a trial told
    better than every one before it is registered, and the alias moved to it, once its run's model is in the store
    (a study's trial reports before its worker's spool has sent the run's records: this thread waits for the
    model, off the scheduler's path; a newer best replaces the one it waits for; a run that ended without a model
    is let go). The study's end registers its final best either way (summarize)."""

    POLL_S = 0.5

    def __init__(self, study: Any, spec: StudySpec, uri: str):
        self.study, self.spec, self.uri = study, spec, uri
        self.maximize = spec.objectives[0].direction == "maximize"
        try:
            self.value: float | None = study.best_value  # a resumed study's best so far
            if spec.pbt:  # (a population's: of the intervals that ended a member's training)
                self.value = next((t.value for t in answers(study, self.maximize)), None)
        except ValueError:
            self.value = None
        self._waiting: Any = None  # the trial whose model is awaited
        self._wake, self._closing = threading.Event(), False
        self._thread = threading.Thread(target=self._loop, name="xp-best-model", daemon=True)
        self._thread.start()

    @classmethod
    def of(cls, study: Any, spec: StudySpec, uri: str | None) -> BestModel | None:
        """One for a study that registers a single objective's best into a tracking store; else None."""
        return cls(study, spec, uri) if uri and spec.register_model and not spec.multi_objective else None

    def told(self, trial: Any, values: list[float]) -> None:
        """The scheduler told the study `trial` completed with `values`."""
        value = values[0]
        if self.value is None or (value > self.value if self.maximize else value < self.value):
            self.value, self._waiting = value, trial
            self._wake.set()

    def close(self, timeout_s: float = 30.0) -> None:
        """No more trials: the thread stops (what it awaited, the study's end registers)."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=timeout_s)

    def _loop(self) -> None:
        from xp.tracking import service
        from xp.readback.work import best_model

        while not self._closing:
            self._wake.wait(timeout=self.POLL_S if self._waiting is not None else None)
            self._wake.clear()
            trial = self._waiting
            if trial is None or self._closing:
                continue
            try:
                best = self.study._storage.get_trial(trial._trial_id)  # its run id, set by its worker
                if best.user_attrs.get("mlflow_run_id"):  # (by the tracking service, where there is one)
                    answer = service.call(self.uri, best_model, name=self.spec.register_model or "",
                                          member=member(best, self.spec))
                    if answer["said"]:
                        log.info(f"study {self.spec.study_name}: {answer['said']}")
                    elif answer["waiting"]:
                        continue  # its records are on their way
                if self._waiting is trial:  # (a newer best may have come meanwhile)
                    self._waiting = None
            except Exception as e:  # the store away, say: the study goes on; its end registers its best
                log.debug("study %s: the best model is not registered yet (%s)", self.spec.study_name, e)
