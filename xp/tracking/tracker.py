"""MLflow tracking: one run per experiment, grouped under a parent run for sweeps.

The embedded default is a SQLite database inside mlruns/ with artifacts beside
it (MLflow 3 refuses the plain ./mlruns file store). MLFLOW_TRACKING_URI or
tracking_uri=... point elsewhere (another SQLite file, PostgreSQL, a server).
mlflow is imported inside the methods: importing xp must stay cheap.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from xp.errors import ConfigError, one_line, redact
from xp.interrupts import held_interrupts
from xp.states import RunStatus
from xp.tracking import rows
from xp.tracking.ending import end_state
from xp.tracking.naming import placed_tags, run_label
from xp.tracking.provenance import source_tags
from xp.processes import started
from xp.tracking.spool import FLUSH_S, STORE_WAIT_S, Drain, Spool, settle, state_dir
from xp.tracking.stores import _artifact_root, away, away_reason, open_client

log = logging.getLogger("xp")

MAX_PARAM_LEN = 6000  # MLflow 3's limit on a param value
# MLflow's UI (3.x) opens an experiment without this tag in its GenAI mode (Traces, Evaluations): xp's are training
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
MODEL_TAGS = ("xp.model", "xp.dataset", "xp.backend", "xp.dtype")  # a logged model's tags: the run's, which say what it is
# (store, experiment name) -> id, for the process's life: a study's worker looks it up once, not every trial (8 ms
# on SQLite); again where creating a run in it fails
_experiment_ids: dict[tuple[str, str], str] = {}


class Tracker:
    """One MLflow run. As a context manager it ends the run FINISHED, FAILED or KILLED.

    KILLED for Ctrl-C and SIGTERM, FAILED for any other exception: a run is
    never left RUNNING by a process that gets to run its finally-blocks.
    """

    def __init__(self, uri: str, experiment: str, run_name: str, parent_run_id: str | None = None,
                 tags: dict[str, str] | None = None, attach_run_id: str | None = None,
                 reopen_run_id: str | None = None, spool_dir: str | Path | None = None,
                 params: dict[str, Any] | None = None, tidy: bool = True, start_ms: int | None = None,
                 settle_later: bool = False, stamped: bool = False, resumes: tuple[str, str] | None = None):
        self.uri, self.experiment, self.run_name = uri, experiment, run_label(run_name)
        self.resumes = resumes  # (tag, value): the latest interrupted run with that tag is reopened (a killed sweep's)
        self.stamped = stamped  # `tags` say already which process the run is (xp.tracking.serve: the run's own)
        self.tidy = tidy  # end the runs that gone processes of this host left RUNNING (end_orphans) as it starts
        self.start_ms = start_ms  # when the run began, if before it is created (a trial: when its worker took it)
        self._tried = False  # a create was sent (its answer may be lost: _made_before)
        self.settle_later = settle_later  # its end does not wait for the store to take its records (Spool.end)
        self.params = dict(params or {})  # logged with the run's start, in the batch of its first tags
        self.spool_dir = spool_dir  # where the run's writes wait for the store (default: in xp's state folder)
        self._spool: Spool | None = None
        self.model: tuple[Callable, int, list] | None = None  # model.log: (its writer, epoch, its metrics)
        # the points logged at the latest steps, by step and key: [key, value, time, step] each (a model links its
        # epoch's points as they were logged; another thread's metrics, the telemetry's, may come in between)
        self._points: dict[int, dict[str, list[Any]]] = {}
        self.parent_run_id = parent_run_id
        self.tags = {**placed_tags(), **(tags or {})}
        self.run_id: str | None = None
        self.artifact_uri: str | None = None  # the run's, once created here (attached or reopened: read when needed)
        # attached: log into a run someone else started and will end (a distributed launcher)
        self.attach_run_id = attach_run_id
        # reopened: continue a run that ended early (resume=): RUNNING again, ended by this process
        self.reopen_run_id = reopen_run_id
        self.experiment_id: str | None = None
        self._artifacts: list[tuple[Path, str | None]] = []
        self._client = None

    @property
    def client(self):
        if self._client is None:
            self._client = open_client(self.uri)
        return self._client

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is not None:
            if EXPERIMENT_KIND[0] not in exp.tags:  # one xp made before it said so, or another tool's
                self.client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
            return exp.experiment_id
        try:
            return self.client.create_experiment(self.experiment, artifact_location=_artifact_root(self.uri),
                                                 tags=dict([EXPERIMENT_KIND]))
        except MlflowException:  # another process created it first
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None:
                raise
            return exp.experiment_id

    def start(self) -> str:
        from xp.tracking.leftovers import WAIT_S, deliver_left

        if self.attach_run_id:
            self.run_id = self.attach_run_id
            deliver_left(self.uri, WAIT_S, self.run_id)  # what a killed process left of it goes first
            self._spool = self._local_spool()
            self.log(params=self.params, tags=self.tags)
            return self.run_id
        if not self.reopen_run_id:
            # a run before it in this process whose store went away: its end waits first (a study's trial waits for
            # the store, see _created, rather than fail for its absence; its records go on to it meanwhile)
            settle(STORE_WAIT_S if self.settle_later else FLUSH_S, away_only=True)
            if self._by_service():
                return self._started()
            if self.resumes and self.reopen_run_id is None:
                try:
                    self.reopen_run_id = self.interrupted()
                except ConfigError:
                    raise
                except Exception as e:  # as _create says it (found by benchmarks/chaos.py: a server killed as a
                    # sweep looked for the parent run to reopen ended the command in a traceback)
                    raise ConfigError(f"MLflow store {redact(self.uri)} is not usable: {type(e).__name__}: "
                                      f"{one_line(e)[:300]}") from e
        if self.reopen_run_id:
            self.run_id = self.reopen_run_id
            self.client.update_run(self.run_id, status=RunStatus.RUNNING)
            deliver_left(self.uri, WAIT_S, self.run_id)  # what a killed process left of it goes first
            self._spool = self._local_spool()
            self.log(params=self.params, tags={**self.tags, "xp.pid": str(os.getpid()), "xp.resumed": "true",
                                               "xp.pid_started": f"{started(os.getpid()):.2f}",
                                               "xp.host": socket.gethostname()})
            return self.run_id
        self.run_id, self.artifact_uri = self._created()
        self._spool = self._local_spool()
        return self._started()

    def _started(self) -> str:
        if self.params:
            self.log(params=self.params)
        assert self.run_id is not None
        return self.run_id

    def _by_service(self) -> bool:
        """The run created, and its spool drained, by the tracking service (xp.tracking.service); False where the
        store is not one it serves, or it is not there (this process does it)."""
        from xp.tracking import service
        from xp.tracking.messages import Refused, Reopen, Start, Started

        if not service.usable(self.uri):
            return False
        request = Start(self.uri, self.experiment, self.run_name, self._run_tags(), self.tidy, self.parent_run_id,
                        self.start_ms, self.settle_later, STORE_WAIT_S if self.settle_later else 0.0,
                        list(self.resumes) if self.resumes else None)
        try:
            link, answer = service.create_run(request)
        except service.Unavailable as e:
            log.info("%s: this process does its MLflow work itself", e)
            return False
        if not isinstance(answer, Started):  # (an interrupted sweep's parent: this process reopens it)
            link.close()
            if isinstance(answer, Refused):
                raise ConfigError(answer.error)
            assert isinstance(answer, Reopen)
            self.reopen_run_id, self.experiment_id = answer.run_id, answer.experiment_id
            return False
        self.run_id, self.artifact_uri = answer.run_id, answer.artifact_uri
        self.experiment_id, self.start_ms = answer.experiment_id, answer.start_ms
        self._spool = Spool(self._spool_folder(), self.uri, self.run_id,
                            lambda spool: service.Served(spool, link, self._drain, self.artifact_uri))
        return True

    def _local_spool(self) -> Spool:
        """The run's spool, drained by this process (as it has no tracking service)."""
        return Spool(self._spool_folder(), self.uri, str(self.run_id), lambda spool: self._drain())

    def _drain(self) -> Drain:
        self.client  # made (and mlflow imported) on this thread: two threads importing mlflow at once can break it
        return Drain(self._spool_folder().absolute(), self.uri, str(self.run_id), lambda: self.client,
                     artifact_uri=self.artifact_uri)

    def _spool_folder(self) -> Path:
        """One spool per process: a distributed run's launcher and its rank 0 both write to the run."""
        return (Path(self.spool_dir) if self.spool_dir else state_dir() / "spools") / f"{self.run_id}-{os.getpid()}"

    def _run_tags(self) -> dict[str, str]:
        """The tags a run is created with: which process of which host made it (unless `stamped`), its own."""
        tags = dict(self.tags) if self.stamped else \
            {**source_tags(), "xp.host": socket.gethostname(), "xp.pid": str(os.getpid()),
             "xp.pid_started": f"{started(os.getpid()):.2f}", **self.tags}
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        return tags

    def _created(self) -> tuple[str, str]:
        """The run, created in the store: its id and artifact URI. A study's trial (settle_later) whose store is
        away waits for it (at most STORE_WAIT_S), with a line when it goes and one when it is back: its trial is not
        failed for an outage."""
        deadline, pause, since = time.monotonic() + (STORE_WAIT_S if self.settle_later else 0.0), 0.5, None
        while True:
            try:
                with held_interrupts() as held:  # a stop while the store makes the run: made, then ended KILLED
                    run = self._create()  # (else the run stays RUNNING, and no process knows it to end it)
                if held.pending:
                    self.run_id, self.artifact_uri = run
                    self._spool = self._local_spool()
                    self.end(RunStatus.KILLED)
                    held.check()
                if since is not None:
                    log.warning("tracking store %s is back after %.0f s: the trial's run starts", redact(self.uri),
                                time.monotonic() - since)
                return run
            except ConfigError as e:
                if not (self.settle_later and isinstance(e.__cause__, Exception) and away(e.__cause__)) or \
                        time.monotonic() + pause > deadline:
                    raise
                if since is None:
                    since = time.monotonic()
                    log.warning("tracking store %s is away (%s): the trial's run waits for it (at most %.0f s)",
                                redact(self.uri), away_reason(e.__cause__), STORE_WAIT_S)
                time.sleep(pause)
                pause = min(2 * pause, 5.0)

    def _create(self) -> tuple[str, str]:
        try:
            key = (self.uri, self.experiment)
            remembered = not self.tidy and key in _experiment_ids
            self.experiment_id = _experiment_ids[key] if remembered else self._experiment_id()
            if self.tidy:
                self.end_orphans()
            tags = self._run_tags()
            try:
                run = self._create_run(tags)
            except Exception:
                if not remembered:
                    raise
                self.experiment_id = self._experiment_id()  # the remembered one may be gone: looked up again
                run = self._create_run(tags)
            _experiment_ids[key] = self.experiment_id
        except ConfigError:
            raise
        except Exception as e:
            if away(e):  # (restarting, say: what the user does is run the command again, not fix the store)
                raise ConfigError(f"MLflow store {redact(self.uri)} is away ({away_reason(e)}) as the run starts: run "
                                  "the command again once it answers") from e
            raise ConfigError(f"MLflow store {redact(self.uri)} is not usable: {type(e).__name__}: {one_line(e)[:300]}") from e
        return run

    def _made_before(self, tags: dict[str, Any]) -> tuple[str, str] | None:
        """The run an earlier try of this one made, whose answer was lost (the server killed, or the connection
        cut, as it committed): found by its start time, process and name, and not made twice (found by
        benchmarks/chaos.py: a trial with a second run, RUNNING until the reaper ended it FAILED)."""
        if not str(tags.get("xp.pid", "")).isdigit():
            return None
        try:
            runs = self.client.search_runs([self.experiment_id], f"attributes.start_time = {self.start_ms} and "
                                           f"tags.`xp.pid` = '{tags['xp.pid']}'", max_results=10)
        except Exception:
            return None
        return next(((r.info.run_id, r.info.artifact_uri) for r in runs
                     if r.info.run_name == self.run_name and r.info.status == RunStatus.RUNNING), None)

    def _create_run(self, tags: dict[str, Any]) -> tuple[str, str]:
        if self._tried and (made := self._made_before(tags)):  # (only a create tried again looks: no cost otherwise)
            return made
        self.start_ms = self.start_ms or int(time.time() * 1000)  # the job's start, the clock of its bill (CostMeter)
        self._tried = True
        return rows.create_run(self.client, self.experiment_id, self.run_name, self.start_ms,
                               {k: redact(str(v)) for k, v in tags.items()})

    def interrupted(self) -> str | None:
        """The latest run with the tag `resumes` names if it was interrupted (after ending the runs of dead
        processes): ended by the orphan reaper or a signal before its summary was logged (a sweep that ran to its
        end with a failed job has its summary, which MLflow would not let a second pass overwrite: a new sweep)."""
        assert self.resumes is not None
        self.experiment_id = self._experiment_id()
        self.end_orphans()
        runs = self.client.search_runs([self.experiment_id], f"tags.`{self.resumes[0]}` = '{self.resumes[1]}'",
                                       order_by=["attributes.start_time DESC"], max_results=1)
        if runs and runs[0].info.status in (RunStatus.FAILED, RunStatus.KILLED) and \
                "summary.runs" not in runs[0].data.params:
            return runs[0].info.run_id
        return None

    def end_orphans(self) -> list[str]:
        from xp.tracking.leftovers import end_orphans

        return end_orphans(self.client, self.uri, str(self.experiment_id))

    # Writes go to the run's spool and return at once; its thread delivers them in order (xp.spool).
    def log(self, params: dict[str, Any] | None = None, tags: dict[str, str] | None = None) -> None:
        """Params and tags in one record (the spool sends queued records in as few log_batch calls as MLflow's
        limits allow)."""
        items = [[str(k)[:250], redact(str(v))[:MAX_PARAM_LEN]] for k, v in sorted((params or {}).items())]
        tag_items = [[k, redact(str(v))] for k, v in (tags or {}).items()]
        if not items and not tag_items:
            return
        for i in range(0, max(len(items), 1), 100):  # MLflow's batch limit for params
            self._put("batch", params=items[i:i + 100], tags=tag_items if i == 0 else [])

    def _put(self, op: str, **data: Any) -> None:
        assert self._spool is not None, "a run's records come after its start"
        self._spool.put(op, **data)

    def log_params(self, params: dict[str, Any]) -> None:
        self.log(params=params)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        now = int(time.time() * 1000)  # the record's own timestamp: a batch sent twice is stored once
        points: list[list[Any]] = [[k, float(v), now, step or 0] for k, v in metrics.items() if v is not None]
        at = self._points.setdefault(step or 0, {})
        at.update((str(p[0]), p) for p in points)
        while len(self._points) > 16:  # (the steps logged latest: a model is logged at its epoch's end)
            self._points.pop(next(iter(self._points)))
        self._put("batch", metrics=points)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.log(tags=tags)

    def log_model(self, write: Callable[[Path], None], epoch: int, metrics: dict[str, float]) -> None:
        """The run's model (epoch `epoch`, its metrics): the run's end calls `write(folder)` (the last one handed)
        into its spool, which outlives the process until the store has it, and logs it, linking to it the epoch's
        metrics as they were logged (the same points: the run's curves get none twice)."""
        at, now = dict(self._points.get(epoch, {})), int(time.time() * 1000)
        logged = list(at.values()) + [[k, float(v), now, epoch] for k, v in metrics.items()
                                      if v is not None and k not in at]
        self.model = (write, epoch, logged)

    def add_artifact_on_exit(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload `path` when the run ends, whatever the outcome (logs matter most for failed runs)."""
        self._artifacts.append((Path(path), artifact_path))

    @contextmanager
    def owned(self) -> Iterator[Tracker]:
        """The body runs in this run, which this process owns: it ends FINISHED, or as end_state says for what the
        body raised (KILLED for Ctrl-C and SIGTERM, FAILED otherwise), which goes on up."""
        error: BaseException | None = None
        try:
            yield self
        except BaseException as e:
            error = e
            raise
        finally:
            self.end(end_state(error))

    def end(self, status: RunStatus) -> None:
        """Spool the artifacts (copied, passwords hidden) and the end state, then wait a bounded time for the
        store to take everything (settle_later: Spool.end); if it is away, one line says where records wait."""
        if self.run_id is None or self._spool is None or self._spool.closed:
            return  # never started, or ended already
        settle(keep=self.settle_later)  # the records of runs ended before go first (a study's worker: those whose
        # store is away go on, and this run's end is put just before its trial reports)
        for i, (path, dest) in enumerate(self._artifacts):
            if path.exists():
                try:  # a copy as it is now: a config or log may hold a database URL's password
                    name = Path("artifacts") / str(i) / path.name
                    (self._spool.folder / name).parent.mkdir(parents=True, exist_ok=True)
                    (self._spool.folder / name).write_text(redact(path.read_text(errors="replace")))
                    self._spool.put("artifact", file=str(name), dest=dest)
                except Exception as e:  # an artifact problem must not hide the run's outcome
                    log.warning("could not keep %s for MLflow: %s", path, one_line(e))
        if self.model is not None:  # the model before the end: a run seen ended has its model
            (write, epoch, metrics), self.model = self.model, None  # (its writer holds the backend: let it go)
            try:
                write(self._spool.folder / "model")
                # the models' list shows each as "model": its tags say which network, data and backend it is
                about = {k: v for k, v in self.tags.items() if k in MODEL_TAGS}
                self._spool.put("model", dir="model", name="model", step=epoch, metrics=metrics,
                                experiment_id=self.experiment_id, tags=about)
            except Exception as e:  # a model that cannot be written must not hide the run's outcome
                log.warning("model.log: the run's model could not be written: %s", one_line(e)[:300])
        if not self.attach_run_id:
            self._spool.put("end", status=status, time=int(time.time() * 1000))
        self._spool.end(later=self.settle_later)

    def __enter__(self) -> Tracker:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.end(end_state(exc))
