"""A slot's worker: pinned to its slot's cores (and, through CUDA_VISIBLE_DEVICES, its GPUs) before anything
starts a thread, it imports the frameworks once and then runs trial after trial, each a complete xp run: its
own config, output folder, log file and MLflow child run, seeded by its plan (so it draws what it would draw
in a fresh process). It never opens the study's storage: its values go to the scheduler on its channel.

    python -m xp.launching.trialworker FD     (FD: its end of the scheduler's socket pair)
    python -m xp.launching.trialworker FD zygote  (no slot yet: it forks this machine's workers, xp.launching.zygote)
    python -m xp.launching.trialworker connect  (on another host: it connects to $XP_SLOT_CONNECT)
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from xp.studies.channel import Attr, Channel, Done, Error, Hello, Kept, Prune, Ready, Report, ShouldPrune, RunTrial
from xp.launching.zygote import CTRL_C_ENV
from xp.studies.compose import plain
from xp.states import TrialState
from xp.run.worker import die_with_parent

# what the pool (xp.launching.pool) tells a worker, in its environment
SLOT_ENV = "XP_SLOT"  # its slot (JSON)
QUIET_ENV = "XP_SLOT_QUIET"  # "1": its trials keep their lines in their log files (several slots)
BACKEND_ENV = "XP_SLOT_BACKEND"  # the backend whose frameworks it imports before its first trial
TRACKING_ENV = "XP_SLOT_TRACKING"  # the tracking store it opens before its first trial
CONNECT_ENV = "XP_SLOT_CONNECT"  # on another host: HOST:PORT where the scheduler waits for it
TOKEN_ENV = "XP_SLOT_TOKEN"  # ... and the secret that names its slot there
SETTLE_S = 8.0  # how long a leaving worker waits for the store to take its trials' records
# a stopped worker (Ctrl-C, SIGTERM) waits for the store this long at most after the signal: its run's records, the
# end KILLED last, stay in their spools and the study's command delivers them once every worker has gone (one
# writer: three processes contending for one SQLite file at a stop made it wait out the pool's 10 s)
STOPPED_SETTLE_S = 0.5


def main(argv: list[str]) -> int:
    from xp.launching.slots import Slot

    die_with_parent()  # a SIGKILLed scheduler leaves no worker behind
    from xp.interrupts import came, when_signalled
    from xp.tracking import spool

    when_signalled.append(lambda: spool.stopping(STOPPED_SETTLE_S))
    stop_on_signals()
    compose = None
    if SLOT_ENV not in os.environ:  # the zygote (xp.launching.zygote): what needs no slot imported, then it forks
        from xp.launching.zygote import serve

        zygote = Channel(socket.socket(fileno=int(argv[0])))
        try:
            compose = _before_slot()
        except Exception:  # done again in each worker, where a failure reaches the scheduler in one line
            compose = None
        serve(zygote)  # returns in a forked worker, its slot's variables set: it calls back as a remote one does
        argv = ["connect"]
    given: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                             for k, v in json.loads(os.environ[SLOT_ENV]).items()}
    slot = Slot(**given)
    slot.pin()  # before the frameworks start their threads: those inherit it (the ones already there are moved)
    try:
        if argv[0] == "connect":  # forked, or on another host: it calls the scheduler back, with its slot's token
            host, port = os.environ[CONNECT_ENV].rsplit(":", 1)
            try:
                channel = Channel(socket.create_connection((host, int(port)), timeout=30))
            except OSError as e:  # no scheduler there (its study stopped while this worker started): one line
                print(f"xp: a study's worker: its scheduler at {host}:{port} does not answer ({e.strerror or e}); "
                      "the worker ends", file=sys.stderr, flush=True)
                return 1
            channel.sock.settimeout(None)
            channel.send(Hello(os.environ.pop(TOKEN_ENV, "")))
        else:
            channel = Channel(socket.socket(fileno=int(argv[0])))
        try:
            compose = compose or _composer()
            _warm(os.environ.get(BACKEND_ENV), os.environ.get(TRACKING_ENV))
        except Exception as e:
            channel.send(Error(f"{type(e).__name__}: {e}"))
            return 1
        _logging(quiet=os.environ.get(QUIET_ENV) == "1")
        if came:  # a stop came while it started, and a library it imported swallowed it: no trial for it
            raise came[0]
        channel.send(Ready(os.getpid()))
    except (ConnectionResetError, BrokenPipeError):  # the scheduler went (its study stopped) while this worker
        return 0  # started: nothing to run (a scheduler it cannot reach at all stays an error)
    return _trials(channel, compose, slot)


def _trials(channel: Any, compose: Any, slot: Any) -> int:
    """Trial after trial, as the scheduler sends them, until it says exit (or the trial changed the process)."""
    from xp.tracking.spool import ended_later, kept, settle

    global _starting
    _starting = False
    first = True
    keepers: list[threading.Thread] = []
    try:
        while True:
            msg = channel.recv()
            if not isinstance(msg, RunTrial):  # exit, or the scheduler is gone: nothing of a trial is left to finish
                settle(SETTLE_S)  # but its records
                for keeper in keepers:  # (the scheduler hears that they are kept)
                    keeper.join(timeout=1.0)
                logging.shutdown()
                sys.stdout.flush()
                os._exit(0)  # without the interpreter's and the frameworks' teardown (most of a second)
            msg.first = first
            before = ended_later()
            result = run_trial(msg, channel, compose, slot)
            first = False
            drains = [d for d in ended_later() if all(d is not b for b in before)]  # this trial's run's
            if result.recycle:  # the worker leaves: its records first, as far as they go (it is told at once)
                settle(SETTLE_S)
            elif result.state == TrialState.COMPLETE and kept(drains, 0.0) is not True:  # its records may still be
                result.kept = False  # on their way to the store: they go while the next trial runs; Kept says when
            try:
                channel.send(result)
            except OSError:  # its scheduler is gone (its command killed): nothing to tell; its records go on (finally)
                return 0
            if not result.kept:
                keepers = [k for k in keepers if k.is_alive()]
                keepers.append(threading.Thread(target=_keep, args=(channel, msg.number, drains),
                                                name="xp-trial-kept", daemon=True))
                keepers[-1].start()
            if result.recycle:
                return 0
            gc.collect()  # what the trial held goes before the next one starts
            gc.freeze()  # and what lives on (imports, caches) is not traversed again by the next trial's collection
    finally:  # recycled, Ctrl-C or SIGTERM: the records of its trials reach the store before it goes
        settle(SETTLE_S)


def _keep(channel: Any, number: int, drains: list[Any]) -> None:
    """Tell the scheduler once the store holds every record of trial `number`'s run (Kept); nothing if they stay
    in their spool (given up: the worker leaves before the store is back), the scheduler then counting it lost."""
    from xp.tracking.spool import kept

    while (done := kept(drains, 1.0)) is False:
        pass
    if done:
        try:
            channel.send(Kept(number))
        except OSError:  # the scheduler is gone
            pass


def run_trial(msg: RunTrial, channel: Channel, compose: Any, slot: Any) -> Done:
    """One trial, as the scheduler's RunTrial message describes it; returns how it ended (Done)."""
    from xp.errors import XPError, one_line
    from xp.run.experiment import JobInfo, run
    from xp.studies.study import spec_from
    from xp.studies.trial import StudyTrial

    started_ms = int(time.time() * 1000)  # its MLflow run's start: the slot is this trial's from now
    out = Path(msg.output_dir)
    (out / ".hydra").mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / "xp.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    from xp.errors import RedactFilter

    handler.addFilter(RedactFilter())
    root = logging.getLogger()
    root.addHandler(handler)
    result = Done()
    try:
        if msg.config:
            compose.seed(msg.base, msg.config)
        with compose.applied(msg.base, {**msg.params, **(msg.settings or {})}) as cfg:
            _save_yaml(plain(cfg, resolve=False), out / ".hydra" / "config.yaml")
            config = _resolved(cfg)
        _save_yaml(msg.task, out / ".hydra" / "overrides.yaml")
        result.recycle = (config.get("dtype") or {}).get("name", "float32") != "float32"  # AMP patches the process
        spec = spec_from(config["sweep"], msg.sweep, search=False)
        trial = SlotTrial(channel, msg.number, msg.params, msg.study)
        job = JobInfo(overrides=msg.task, output_dir=out, log_file=out / "xp.log", parent_run_id=msg.parent,
                      cwd=Path.cwd(), trial=StudyTrial(trial, spec, trial),
                      tags={**slot.tags(), "xp.cores": _cores(), **(msg.tags or {})},
                      tidy=msg.first, started_ms=started_ms, settle_later=True)
        outcome = run(config, job)
        result.state, result.values = outcome.state, outcome.values
    except XPError as e:
        logging.getLogger("xp").debug("error", exc_info=True)
        result.error = one_line(e)[:300]
        if os.environ.get(QUIET_ENV) != "1":  # as a run's error reads on the console
            print(f"xp: error: {result.error}", file=sys.stderr, flush=True)
    except Exception as e:
        logging.getLogger("xp").debug("failed", exc_info=True)
        result.error = f"training failed: {type(e).__name__}: {one_line(e)[:300]} (traceback in {out / 'xp.log'})"
    finally:
        root.removeHandler(handler)
        handler.close()
    return result


class SlotTrial:
    """A worker's view of the trial it runs (what xp's run uses of an Optuna trial): its values go to the
    scheduler, which reports them to the study and answers whether to prune."""

    def __init__(self, channel: Any, number: int, params: dict[str, Any], study_name: str):
        self.channel, self.number, self.params = channel, number, params
        self.study = type("Study", (), {"study_name": study_name})()

    def report(self, values: list[float], step: int) -> None:
        self.channel.send(Report([float(v) for v in values], int(step)))

    def should_prune(self) -> str | None:
        """Why the study's pruner stops the trial now, or None."""
        self.channel.send(ShouldPrune())
        answer = self.channel.recv_kind(Prune)  # (the worker's next trial may come first: it is held)
        if answer is None:
            raise ConnectionError("the study's scheduler is gone")
        return (answer.why or "pruned") if answer.prune else None

    def set_user_attr(self, key: str, value: Any) -> None:
        self.channel.send(Attr(key, value))


def _resolved(cfg: Any) -> dict[str, Any]:
    """The trial's config resolved. A worker that brought up no Hydra of its own has none of Hydra's resolvers
    (${now:...}, ${python_version:}) until a config uses one: then they are registered, as Hydra does."""
    from omegaconf.errors import UnsupportedInterpolationType

    try:
        return plain(cfg)
    except UnsupportedInterpolationType:
        from hydra.core.utils import setup_globals

        setup_globals()
        return plain(cfg)


def _save_yaml(data: Any, path: Path) -> None:
    """A trial's .hydra file, as OmegaConf.save writes it, through libyaml where there is one (5x faster)."""
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    path.write_text(yaml.dump(data, Dumper=dumper, default_flow_style=False, allow_unicode=True, sort_keys=False))


def stop_on_signals() -> None:
    """SIGTERM and Ctrl-C end the trial's run KILLED; Ctrl-C not where it came ignored, unless its shell ignored it
    only while it started (xp.launching.zygote.CTRL_C_ENV)."""
    signal.signal(signal.SIGTERM, _stopped)
    if os.environ.pop(CTRL_C_ENV, None) == "1" or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _stopped)


_starting = True  # no trial yet: the worker imports and calls back


def _stopped(signum: int, frame: Any) -> None:
    """Ctrl-C or SIGTERM: the trial's run ends KILLED. Only the first signal counts: a stopped study's scheduler
    sends SIGTERM to a worker that Ctrl-C reached too, which must not cut short the end of its run."""
    from xp.interrupts import signalled

    error = signalled(signum)
    for s in (signal.SIGTERM, signal.SIGINT):  # a handler, not SIG_IGN: a signal that came while this one ran
        signal.signal(s, _again)  # would find SIG_IGN and raise "ignored due to race condition"
    raise error


def _again(signum: int, frame: Any) -> None:
    """A stop signal after the first. A trial's run that is ending is not cut short. A worker still starting ends
    now: the first one may have been swallowed where it landed (an import's finder that caught it and printed it),
    and the scheduler's SIGTERM is then all that ends it (ignored, a study's stop waited 10 s for SIGKILL)."""
    if _starting:
        os._exit(128 + signum)


def _before_slot() -> Any:
    """The zygote's work, which does not depend on a slot, done while the study is composed: no framework
    (their thread pools and devices follow the slot's cores, thread counts and CUDA_VISIBLE_DEVICES). What every
    trial runs through imported, and the study's Composer. MLflow only where the trials' runs are not the tracking
    service's (xp.tracking.service: a SQLite store's are): its database store too unless the store is a server."""
    import xp.run.experiment  # noqa: F401

    from xp.tracking.stores import resolve_uri

    uri = resolve_uri()  # (before the study is composed: a tracking_uri given on its command line is not known)
    if not served(uri, there=False):
        import mlflow.tracking  # noqa: F401

        if not uri.startswith(("http:", "https:")):
            import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    return _composer()


def _warm(backend: str | None, tracking_uri: str | None) -> None:
    """What every trial needs, done once before the first: the backend's frameworks imported, the tracking store
    opened (mlflow imported, the store's schema checked)."""
    if backend:
        from xp.run.entry_points import Registry

        Registry().load(backend).warm()
    if tracking_uri and not served(tracking_uri):
        from xp.errors import ConfigError
        from xp.tracking.stores import open_client

        try:
            open_client(tracking_uri)
        except ConfigError as e:
            if not isinstance(e.__cause__, OSError):
                raise
            # the store is away: not this worker's failure; its trials' runs wait for it (spool.STORE_WAIT_S;
            # benchmarks/chaos.py: an outage made 3 replacement workers in a row "not start", the study ended)
    gc.freeze()  # what the imports left is not traversed by the trials' collections (collecting it first: 0.15 s)


def served(uri: str, there: bool = True) -> bool:
    """Whether this process's trials' runs on `uri` will be the tracking service's (`there`: and it listens; the
    zygote asks before the command started it): then the worker does not import MLflow (it would, should the
    service go away). A worker on another host finds none (only commands start one) and imports it."""
    from xp.tracking import service

    return service.usable(uri) and (not there or service.socket_path().exists())


def _cores() -> str:
    """This process's CPU affinity, as the kernel has it (Cpus_allowed_list)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return ""


def _composer() -> Any:
    """The study's Composer (xp.studies.compose) over Hydra brought up only when a trial needs a composition: the
    scheduler ships the study's composed config, so trials whose parameters are plain values are set on it
    without Hydra (its import, the study files registered, the config folder: 0.4 s of a worker's start)."""
    from xp.studies.compose import Composer

    return Composer(_Hydra())


class _Hydra:
    """hydra.compose in xp's config folder, initialized at the first call, for the process's life."""

    def __init__(self) -> None:
        self.compose: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compose is None:
            from hydra import compose, initialize_config_dir

            from xp import shipped
            from xp.data import plugins
            from xp.launching.launcher import offer_options
            from xp.studies import studyfile

            studyfile.register()  # the study files are options of the config group `sweep`
            offer_options()  # and the launchers of the config group `launcher`
            plugins.offer_options()  # and the registered networks and data sets
            initialize_config_dir(str(shipped("conf")), version_base="1.3", job_name="xp").__enter__()
            self.compose = compose
        return self.compose(*args, **kwargs)


def _logging(quiet: bool) -> None:
    """As a Hydra job logs: its lines on the console (with several slots, only warnings: the scheduler prints a
    line per trial) and everything in the trial's log file."""
    from xp.errors import RedactFilter

    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(logging.Formatter("%(message)s"))
    console.setLevel(logging.WARNING if quiet else logging.INFO)
    console.addFilter(RedactFilter())
    root = logging.getLogger()
    root.handlers[:] = [console]
    root.setLevel(logging.INFO)
    logging.getLogger("xp").setLevel(logging.DEBUG)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if quiet:  # MLflow prints a "View run" line per run itself (its own handler), on a server's store
        logging.getLogger("mlflow").setLevel(logging.WARNING)


if __name__ == "__main__":
    from xp.errors import Terminated

    try:
        code = main(sys.argv[1:])
    except KeyboardInterrupt:  # Ctrl-C reached the whole process group: the trial's run ended KILLED
        code = 130
    except Terminated:
        code = 143
    # leaving (the interpreter's and the frameworks' teardown, most of a second): a stop signal now, the pool's
    # SIGTERM say, ends the process as it would anyway, without a traceback from a handler raising in an atexit
    # callback (a remote worker printed one in benchmarks/chaos.py)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise SystemExit(code)
