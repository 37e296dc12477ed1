"""`python -m xp`: the entry point. Thin: check the command, hand it to Hydra, report.

1. Every job the command line describes (each combination of a -m sweep) is
   composed and validated before the first one starts: a bad value fails in
   a second with one line, not after an hour of the sweep.
2. With -m, one MLflow parent run groups the sweep's runs.
3. Exit codes: 0 done, 1 training failed, 2 usage or config error,
   130 Ctrl-C, 143 SIGTERM. Errors are one line on stderr; tracebacks go to
   the run's log file.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from xp import dispatch, preflight
from xp.errors import ConfigError, Terminated, XPError, one_line
from xp.interrupts import on_stop_signal, stop_in
from xp.run.worker import RUN_ENV, WORKER_ENV
from xp.states import TrialState

CONF_DIR = preflight.CONF_DIR
# Flags Hydra answers without running a job.
PASSTHROUGH = {"--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--info", "-i",
               "--shell-completion", "-sc"}
HELP = {"--help", "-h", "--hydra-help"}  # flags that compose nothing
# Hydra flags followed by a value (in the next token unless written flag=value).
FLAGS_WITH_VALUE = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--package", "-p",
                    "--cfg", "-c", "--experimental-rerun"}

CONFIG_TREE_FLAGS = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"}  # the user's own configs
HYDRA_FLAGS = PASSTHROUGH | FLAGS_WITH_VALUE | {"--multirun", "-m", "--run", "-r", "--resolve"}

log = logging.getLogger("xp")


def _own_config_tree(argv: list[str]) -> bool:
    return any(a.split("=")[0] in CONFIG_TREE_FLAGS for a in argv)


def spelled_as_flags(argv: list[str]) -> None:
    """`--model resnet18` or `--batch=64`, as other tools spell settings: one line saying how xp's are written."""
    for i, tok in enumerate(argv):
        name = tok.split("=", 1)[0]
        if not tok.startswith("--") or name in HYDRA_FLAGS or (i and argv[i - 1] in FLAGS_WITH_VALUE):
            continue
        value = tok.split("=", 1)[1] if "=" in tok else (argv[i + 1] if i + 1 < len(argv) and "=" not in argv[i + 1]
                                                         and not argv[i + 1].startswith("-") else None)
        said = tok if value is None or "=" in tok else f"{tok} {value}"
        raise ConfigError(f"{said}: xp's settings are KEY=VALUE: write {name[2:]}={value or 'VALUE'} "
                          "(python -m xp --help lists them)")


def error_line(msg: object, code: int) -> int:
    """Print the one line of an error (stderr) and return its exit code."""
    print(f"xp: error: {one_line(msg)}", file=sys.stderr)
    return code


def stopped(stop: BaseException) -> int:
    """The one line of a stop (Ctrl-C: 130; SIGTERM: 143), and its exit code."""
    if isinstance(stop, Terminated):
        return error_line("terminated (SIGTERM)", 143)
    return error_line("interrupted (Ctrl-C)", 130)


def _help_resolver() -> None:
    """${xp_help:SWEEP} in --help's template: what the groups and keys mean, from conf/'s comments
    (xp.confref), and the study chosen (sweep=NAME --help), as it is."""
    from omegaconf import OmegaConf

    from xp.confref import help_text

    def text(study: Any) -> str:
        chosen = f"\n\nThe study chosen (sweep.KEY=VALUE changes it):\n{OmegaConf.to_yaml(study)}" if study else ""
        return (help_text(CONF_DIR) + chosen).replace("$", "$$")  # (Hydra's template substitutes $NAME)

    if not OmegaConf.has_resolver("xp_help"):
        OmegaConf.register_new_resolver("xp_help", text)


def normalize_argv(argv: list[str]) -> list[str]:
    """Flags first, overrides after: `model=x -m batch=16,32` is how people type a sweep,
    but Hydra's argparse parser rejects overrides on both sides of a flag."""
    flags, overrides = [], []
    tokens = iter(argv)
    for tok in tokens:
        if tok.startswith("+sweep="):  # sweep is a key of xp's config: +sweep= would fail to append
            tok = tok[1:]
        if tok.startswith("-"):  # override keys never start with "-"
            flags.append(tok)
            if tok in FLAGS_WITH_VALUE:
                nxt = next(tokens, None)
                if nxt is not None:
                    flags.append(nxt)
        else:
            overrides.append(tok)
    return flags + overrides


def main(argv: list[str] | None = None) -> int:
    from xp import recipes
    from xp.data import plugins
    from xp.launching.launcher import offer_options
    from xp.studies import studyfile

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        spelled_as_flags(argv)
    except XPError as e:
        return error_line(e, e.exit_code)
    argv = normalize_argv(argv)
    if any(a in PASSTHROUGH or a.split("=")[0] in PASSTHROUGH for a in argv):
        # the study files are options of the config group `sweep`; the help only lists them
        studyfile.register(names_only=all(a in HELP for a in argv))
        offer_options()
        plugins.offer_options()
        _help_resolver()
        with _one_repository():
            return _hydra(argv)
    study_here = ("-m" in argv or "--multirun" in argv) and any(a.startswith("sweep=") for a in argv)
    if not os.environ.get(WORKER_ENV):  # a command (not a launched job's rank): its runs may start the service
        from xp.tracking import service

        service.starts = True
    placement = None
    try:
        if study_here and not os.environ.get(WORKER_ENV):
            from xp.launching.placement import Placement

            placement = Placement.with_zygote()  # first: its worker's imports overlap all that follows
        studyfile.register(typed=_studies_chosen(argv))
        offer_options()
        plugins.offer_options()  # a package's networks and data sets, as options of model and dataset
        _remember_command(argv)
        signal.signal(signal.SIGTERM, on_stop_signal)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # (not where it is ignored: nohup)
            signal.signal(signal.SIGINT, on_stop_signal)
        argv = recipes.with_recipe(preflight.sweeper_spelling(argv))
        configs = preflight.preflight(argv)  # every job composed and checked before anything starts
        return dispatch.start(argv, configs, _hydra, placement)
    except (Exception, KeyboardInterrupt, Terminated) as e:  # an error a stop caused is the stop (stop_in)
        stop = stop_in(e)
        if stop is not None:
            return stopped(stop)
        if isinstance(e, XPError):
            return error_line(e, e.exit_code)
        raise
    finally:
        if placement is not None:  # the workers it started ahead that no study took
            placement.discard()


def leave(code: int) -> None:
    """End the process with `code` as the interpreter would, less its teardown of every module it imported
    (0.6 s once mlflow is in): threads that are not daemons are waited for (after threading's own exit hooks:
    joblib's executor ends there), the exit callbacks run (logging's flush, temporary files), the standard
    streams are flushed."""
    import atexit
    import threading

    # as the interpreter: threading's exit hooks (joblib's workers end), then the joins
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe: nothing left to say there
            pass
    os._exit(code if isinstance(code, int) else 1)


# --- running -------------------------------------------------------------------

def _hydra(argv: list[str]) -> int:
    import hydra

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def task(cfg: Any) -> float | dict[str, Any]:
        return _task(cfg)

    saved = sys.argv
    sys.argv = [saved[0] if saved else "xp", *argv]
    try:
        with _mode_from_flags(argv), _stops_not_errors():
            task()
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved


@contextmanager
def _mode_from_flags(argv: list[str]) -> Iterator[None]:
    """Hydra composes the whole config once more before a run or a sweep only to read hydra.mode, which xp's
    config tree never sets: the mode is the command line's (-m or not), 0.2 s of every command's start-up. A config
    tree of the user's own (--config-dir, --config-name) may set it: Hydra reads it there as ever."""
    from hydra._internal.hydra import Hydra

    if _own_config_tree(argv):
        yield
        return
    original = Hydra.get_mode
    # _run_app: RUN, or MULTIRUN with -m
    Hydra.get_mode = lambda self, config_name, overrides: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Hydra.get_mode = original  # type: ignore[method-assign]


@contextmanager
def _stops_not_errors() -> Iterator[None]:
    """A stop (Ctrl-C, SIGTERM) that lands inside Hydra's or OmegaConf's own work may leave it failing otherwise
    ("'NoneType' object has no attribute '_invalidate_flags_cache'", full_key: defaults), which Hydra would print
    and exit 1 for, a sweep's parent run ended FAILED: the stop is raised instead (xp.interrupts.stop_in). An
    error of xp's that ends a sweep (a study that cannot go on as set) is its one line and exit code, not the
    traceback Hydra prints for it."""
    from hydra._internal import utils

    original = getattr(utils, "run_and_report", None)
    if original is None:  # (a Hydra that reports otherwise: its own way, as before)
        yield
        return

    def run_and_report(func: Any) -> Any:
        def checked() -> Any:
            try:
                return func()
            except Exception as e:
                stop = stop_in(e)
                if stop is not None:
                    raise stop from None
                if isinstance(e, XPError):
                    log.debug("error", exc_info=True)
                    raise SystemExit(error_line(e, e.exit_code)) from None
                raise

        return original(checked)

    utils.run_and_report = run_and_report
    try:
        yield
    finally:
        utils.run_and_report = original


@contextmanager
def _one_repository() -> Iterator[None]:
    """Hydra's help lists every config group's options and builds its config repository anew for each of ~90
    groups (the primary config loaded and copied each time: 0.6 s of the help's 1.2). One repository per set of
    overrides serves them all, for this call only."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    original = ConfigLoaderImpl._parse_overrides_and_create_caching_repo
    made: dict[tuple, Any] = {}

    def once(self: Any, config_name: str | None, overrides: list[str]) -> Any:
        key = (id(self), config_name, tuple(overrides))
        if key not in made:
            made[key] = original(self, config_name, overrides)
        return made[key]

    ConfigLoaderImpl._parse_overrides_and_create_caching_repo = once  # type: ignore[method-assign]
    try:
        yield
    finally:
        ConfigLoaderImpl._parse_overrides_and_create_caching_repo = original  # type: ignore[method-assign]


def _task(cfg: Any) -> float | dict[str, Any]:
    """One Hydra job: the raw DictConfig stops here; run() gets a plain dict."""
    from hydra.core.hydra_config import HydraConfig

    from xp import multirun
    from xp.run.experiment import JobInfo, run
    from xp.run.handoff import Launched, launched
    from xp.studies.compose import plain

    hc = HydraConfig.get()
    launch = launched() or Launched(run_id=os.environ.get(RUN_ENV))  # launched, or a batch job's submitted run
    out = Path(hc.runtime.output_dir)
    job = JobInfo(
        overrides=[o for o in hc.overrides.task if not o.lstrip("+~").startswith("hydra")],
        output_dir=out,
        log_file=out / f"{hc.job.name}.log",
        parent_run_id=os.environ.get(multirun.PARENT_ENV),
        cwd=Path(hc.runtime.cwd),
        run_id=launch.run_id,
        stop_flag=launch.stop_flag,
        job_t0=launch.job_t0,
        resumed=launch.resumed,
        swept=tuple(k for k in os.environ.get(multirun.SWEPT_ENV, "").split(",") if k),
    )
    config = plain(cfg)
    in_study = (config.get("optuna") or {}).get("trial_id") is not None
    try:
        outcome = None
        if job.parent_run_id and not launch.run_id and not os.environ.get(WORKER_ENV):
            outcome = dispatch.launched_job(job, config)  # a sweep's distributed job: launched, as a command is
        outcome = outcome or run(config, job)
        if in_study:  # what the study's sweeper reads
            return {"state": outcome.state, "values": outcome.values}
        return outcome.objective
    except XPError as e:
        log.debug("error", exc_info=True)
        code = error_line(e, e.exit_code)
    except Exception as e:
        if not getattr(e, "xp_logged", False):
            log.debug("failed", exc_info=True)
        code = error_line(f"training failed: {type(e).__name__}: {one_line(e)[:500]} (traceback in {job.log_file})", 1)
    if in_study:
        return {"state": TrialState.FAIL}  # a failed trial is recorded; the study goes on
    raise SystemExit(code)


def _studies_chosen(argv: list[str]) -> list[str] | None:
    """The studies the command line chooses (sweep=NAME), whose config nodes are typed; None (every one) when
    another config tree could choose one in its defaults."""
    if _own_config_tree(argv):
        return None
    return [n for a in argv if a.lstrip("+").startswith("sweep=") for n in a.split("=", 1)[1].split(",")]


def _remember_command(argv: list[str]) -> None:
    """The command line as typed, for the runs' tags (xp.tracking.provenance.source_tags); a sweep's jobs, a study's trials
    and launched workers inherit the first process's."""
    import shlex

    from xp.tracking.provenance import COMMAND_ENV

    if not os.environ.get(COMMAND_ENV):
        entry = "python -m xp" if sys.argv[0].endswith("__main__.py") else "xp"
        os.environ[COMMAND_ENV] = f"{entry} {shlex.join(argv)}".strip()


def console() -> None:
    """The `xp` console command (pyproject's [project.scripts]): the same as python -m xp."""
    leave(main())
