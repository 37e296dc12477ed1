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

import difflib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from xp import shipped
from xp.errors import ConfigError, Terminated, XPError, one_line
from xp.worker import RUN_ENV, WORKER_ENV

CONF_DIR = shipped("conf")
PARENT_ENV = "XP_PARENT_RUN_ID"  # set for the jobs of a sweep: their MLflow parent run
SWEPT_ENV = "XP_SWEPT_KEYS"  # set for the jobs of a sweep: the keys it varies, comma-separated
# Flags Hydra answers without running a job.
PASSTHROUGH = {"--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--info", "-i",
               "--shell-completion", "-sc"}
# Hydra flags followed by a value (in the next token unless written flag=value).
FLAGS_WITH_VALUE = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--package", "-p",
                    "--cfg", "-c", "--experimental-rerun"}

log = logging.getLogger("xp")


def _err(msg: object, code: int) -> int:
    print(f"xp: error: {one_line(msg)}", file=sys.stderr)
    return code


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


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


def sweeper_spelling(argv: list[str]) -> list[str]:
    """hydra-optuna-sweeper's spelling, accepted with a pointer: hydra.sweeper.FIELD=V is sweep.FIELD=V and
    hydra.sweeper.params.KEY=SPACE is KEY=SPACE (xp's studies are the config group `sweep`)."""
    out = []
    chosen = any(a.lstrip("+").startswith("sweep=") for a in argv)
    for a in argv:
        key, eq, value = a.lstrip("+~").partition("=")
        if not key.startswith("hydra.sweeper.") or not eq:
            out.append(a)
            continue
        if not chosen:
            raise _no_study(a)
        rest = key[len("hydra.sweeper."):]
        mine = rest[len("params."):] if rest.startswith("params.") else f"sweep.{rest}"
        if mine.startswith("sweep.") and rest not in study_fields():
            raise ConfigError(f"{a}: xp's studies have no field {rest!r}; they take sweep.FIELD=VALUE with "
                              f"FIELD one of {', '.join(study_fields())}")
        print(f"xp: note: {a}: xp's studies are the config group sweep: taken as {mine}={value}", file=sys.stderr)
        out.append(f"{mine}={value}")
    return out


def study_fields() -> tuple[str, ...]:
    from xp.study import FIELDS

    return tuple(f for f in FIELDS if f != "name")


def main(argv: list[str] | None = None) -> int:
    from xp import study

    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    study.register()  # the study files are options of the config group `sweep`
    if any(a in PASSTHROUGH or a.split("=")[0] in PASSTHROUGH for a in argv):
        return _hydra(argv)
    _remember_command(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        argv = sweeper_spelling(argv)
        configs = preflight(argv)
        plan, engine = _engine(configs[0]) if configs and not os.environ.get(WORKER_ENV) else (None, None)
        submit = plan is not None and plan.launch.launcher == "slurm" and not _slurm().inside()
        if engine or submit:
            if "-m" in argv or "--multirun" in argv:
                raise ConfigError(f"{engine.name if engine else 'launcher=slurm'} runs are launched one at a time; "
                                  "run each configuration as its own command (a sweep's jobs go to Slurm with "
                                  "hydra/launcher=submitit_slurm)")
            return _launch(argv, plan, engine)
        if "-m" in argv or "--multirun" in argv:
            _check_cluster_sweep(argv, configs[0] if configs else {})
            if configs and configs[0].get("sweep"):
                _register_study_sweeper()
                argv = [*argv, "hydra/sweeper=xp_optuna"]
            return _sweep(argv, configs[0] if configs else {})
        return _hydra(argv)
    except XPError as e:
        return _err(e, e.exit_code)
    except KeyboardInterrupt:
        return _err("interrupted (Ctrl-C)", 130)
    except Terminated:
        return _err("terminated (SIGTERM)", 143)


def _register_study_sweeper() -> None:
    """Hydra instantiates sweepers only from hydra_plugins; ours is installed there and registered here."""
    from hydra.core.plugins import Plugins
    from hydra_plugins.xp_optuna_sweeper import XPOptunaSweeper

    Plugins.instance().register(XPOptunaSweeper)


# --- validation before anything runs -------------------------------------------

def _groups(dirs: list[Path]) -> dict[str, list[str]]:
    """Each config group's options: xp's, the study files, and those of the user's config directories."""
    from xp import study

    groups: dict[str, set[str]] = {"sweep": set(study.names())}
    for d in [CONF_DIR, *dirs]:
        for g in (p for p in d.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
            groups.setdefault(g.name, set()).update(f.stem for f in g.glob("*.yaml"))
    return {g: sorted(options) for g, options in groups.items()}


def _user_dirs(config_dir: str | None, overrides: list[Any]) -> list[Path]:
    """The user's config directories: --config-dir, and file:// entries of hydra.searchpath=[...]."""
    dirs = [Path(config_dir).expanduser().resolve()] if config_dir else []
    for o in overrides:
        if o.key_or_group == "hydra.searchpath" and not o.is_delete():
            for entry in o.value() or []:
                if str(entry).startswith("file://"):
                    dirs.append(Path(str(entry)[len("file://"):]).expanduser().resolve())
    for d in dirs:
        if not d.is_dir():
            raise ConfigError(f"config directory {d}: no such folder")
    return dirs


def _parse_advice(overrides: list[str]) -> str | None:
    """Hydra's parser on a value with a space (dataset.root=/data/my dir): the shell split it, or Hydra's grammar
    needs it quoted. Say so, with the quoted spelling."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for i, o in enumerate(overrides):
        if "=" not in o and i > 0 and "=" in overrides[i - 1]:  # the shell split KEY=a b into two arguments
            key, value = overrides[i - 1].split("=", 1)
            return (f"cannot parse the command line: {o!r} is not KEY=VALUE; if it belongs to {key}'s value, quote "
                    f"the whole value for the shell and for Hydra: \"{key}='{value} {o}'\"")
        key, _, value = o.partition("=")
        if " " in value.strip() and not value.startswith(("'", '"')):
            try:
                parser.parse_override(o)
            except Exception:
                return (f"cannot parse the command line: {o}: a value with spaces (and with Hydra's ()[]{{}},: in "
                        f"it) must be quoted for Hydra: \"{key}='{value}'\"")
    return None


def _composition_error(e: Exception, override: list[str], known_keys: list[str]) -> ConfigError:
    text = str(e) + ("\n" + str(e.__cause__) if e.__cause__ else "")
    for o in override:
        key = o.split("=", 1)[0].lstrip("+~")
        if f"Key '{key.split('.')[-1]}' is not in struct" in text or f"Could not override '{key}'" in text:
            close = ([k for k in known_keys if k.endswith("." + key)]
                     or difflib.get_close_matches(key, known_keys, n=1))
            hint = f"did you mean {close[0]}?" if close else "see python -m xp --help"
            if close and close[0] == key:  # a key of another option of its group (dataset.root is folder's)
                group = key.split(".", 1)[0]
                hint = f"the chosen {group} has no such key; it is one of another {group} option (choose it: {group}=...)"
            return ConfigError(f"{o}: unknown key {key!r}; {hint}")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    why = next((ln for ln in lines if "could not be converted" in ln), None)
    if why:  # a typed field (a study's): "Value 'abc' of type 'str' could not be converted to Integer"
        bad = next((o for o in override if o in lines[0]), lines[0])
        return ConfigError(f"{bad}: {why.split('full_key')[0].strip()}")
    return ConfigError(" ".join(lines[:2]) or type(e).__name__)


def preflight(argv: list[str]) -> list[dict[str, Any]]:
    """Compose and validate every job of the command line; return their resolved configs."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from xp.experiment import plan_and_backend

    args = get_args_parser().parse_args(argv)
    if args.config_path or args.config_name:
        return []  # another config tree: Hydra composes it; each job still validates as it starts
    try:
        parsed = OverridesParser.create().parse_overrides(args.overrides)
    except Exception as e:
        raise ConfigError(_parse_advice(args.overrides) or f"cannot parse the command line: {one_line(e)}") from e
    dirs = _user_dirs(args.config_dir, parsed)  # the user's own options, beside xp's
    searchpath = [f"hydra.searchpath=[{','.join(f'file://{d}' for d in dirs)}]"] if dirs else []
    groups = _groups(dirs)
    _check_options(parsed, groups)
    jobs, space = _jobs([o for o in parsed if not o.key_or_group.startswith("hydra")], args.multirun)

    configs = []
    with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name="xp"):
        known = _known_keys(compose, groups, dirs)
        _check_added(parsed, known, groups)
        jobs = [[*searchpath, *job] for job in jobs]
        jobs = _study_jobs(jobs, args.multirun, known, compose, space) or jobs
        for job in jobs:
            try:
                config = OmegaConf.to_container(compose("config", overrides=job), resolve=True)
            except Exception as e:
                raise _composition_error(e, job, known) from e
            plan_and_backend(config)
            configs.append(config)
        hydra_overrides = [o.input_line for o in parsed
                           if o.key_or_group.startswith("hydra") and o.key_or_group != "hydra.searchpath"]
        if hydra_overrides:  # Hydra's own settings must apply too, or a sweep fails after its parent run began
            try:
                compose("config", overrides=[*hydra_overrides, *jobs[0]], return_hydra_config=True)
            except Exception as e:
                raise _composition_error(e, hydra_overrides, known) from e
    return configs


def _check_options(parsed: list[Any], groups: dict[str, list[str]]) -> None:
    """No _target_ from the command line; every group option exists."""
    for o in parsed:
        key = o.key_or_group
        if "_target_" in key.split(".") or "_target_" in key.split("/"):
            # Hydra instantiates _target_ (hydra.callbacks too): from a command line that is running any code
            raise ConfigError(f"{o.input_line}: setting _target_ from the command line is refused; xp builds only "
                              "registered backends (backend=NAME) and the targets of its own config files")
        if key in groups and not o.is_delete():
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
            for v in values:
                if v not in groups[key]:
                    what = "study" if key == "sweep" else key
                    raise ConfigError(f"{key}={v}: no such {what}; valid: {', '.join(groups[key])}")


def _jobs(user: list[Any], multirun: bool) -> tuple[list[list[str]], tuple[Any, ...]]:
    """The jobs the overrides describe, and a study's search space given on the command line."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    _check_study_fields(user)
    space: tuple[Any, ...] = ()
    if multirun and any(o.key_or_group == "sweep" and not o.is_delete() for o in user):
        # a study: KEY=interval(...)/choice(...)/range(...)/a,b are its search space, not jobs
        from xp import study

        space, rest = study.space_from_overrides(user)
        user = OverridesParser.create().parse_overrides(rest)
    if multirun:
        try:
            return [job for batch in BasicSweeper.split_arguments(user, None) for job in batch], space
        except Exception as e:
            raise ConfigError(one_line(e)) from e
    sweeps = [o.input_line for o in user if o.is_sweep_override()]
    if sweeps:
        raise ConfigError(f"{sweeps[0]}: several values need a sweep; add -m to run one experiment per value")
    return [[o.input_line for o in user]], space


def _known_keys(compose: Any, groups: dict[str, list[str]], dirs: list[Path]) -> list[str]:
    """Every key a config can have: the defaults', and those of every option (dataset.root lives in folder.yaml)."""
    from omegaconf import OmegaConf

    from xp.plan import flatten

    known = set(flatten(OmegaConf.to_container(compose("config"), resolve=True)))
    for group in groups:
        for f in (f for d in [CONF_DIR, *dirs] for f in (d / group).glob("*.yaml")):
            known.update(f"{group}.{k}" for k in OmegaConf.to_container(OmegaConf.load(f)) or {})
    return sorted(known)


def _check_added(parsed: list[Any], known: list[str], groups: dict[str, list[str]]) -> None:
    """+KEY=V (and ++KEY=V) adds a key Hydra did not have: one xp does not know would be silently unused."""
    sections = {k.rsplit(".", 1)[0] for k in known if "." in k}
    for o in parsed:
        key = o.key_or_group
        if not (o.is_add() or o.is_force_add()) or key.startswith(("hydra", "sweep")) or key in groups:
            continue
        if key not in known and key not in sections:
            close = ([k for k in known if k.endswith("." + key)] or difflib.get_close_matches(key, known, n=1))
            raise ConfigError(f"{o.input_line}: xp has no key {key!r}, nothing would read it"
                              + (f"; did you mean {close[0]}?" if close else "; see python -m xp --help"))


def _check_study_fields(overrides: list[Any]) -> None:
    """sweep.FIELD=V: a field of a study, and a study chosen with it."""
    chosen = any(o.key_or_group == "sweep" and not o.is_delete() for o in overrides)
    for o in overrides:
        if not o.key_or_group.startswith("sweep."):
            continue
        field = o.key_or_group.split(".")[1]
        if field not in study_fields():
            close = difflib.get_close_matches(field, study_fields(), n=1)
            raise ConfigError(f"{o.input_line}: a study has no field {field!r}"
                              + (f"; did you mean sweep.{close[0]}?" if close else f"; fields: {', '.join(study_fields())}"))
        if not chosen:
            raise _no_study(o.input_line)


def _no_study(override: str) -> ConfigError:
    from xp.study import names

    return ConfigError(f"{override}: sets a field of a study; choose the study too: -m sweep=NAME "
                       f"(studies: {', '.join(names())})")


def _study_jobs(jobs: list[list[str]], multirun: bool, known: list[str], compose: Any,
                space: tuple[Any, ...]) -> list[list[str]]:
    """With sweep=NAME: check the study (its file, sweep.* overrides, a search space given on the command line)
    and return one job per corner of its search space (each choice, each bound), so a value the plan refuses
    fails now, not in trial 17."""
    from omegaconf import OmegaConf

    from xp import study
    from xp.trial import check_storage

    base = jobs[0]
    try:
        node = OmegaConf.to_container(compose("config", overrides=base), resolve=True).get("sweep")
    except Exception:
        return []  # composition errors are reported by the caller
    if not node:
        return []
    name = node.get("name") or next(o.split("=", 1)[1] for o in base if o.lstrip("+").startswith("sweep="))
    if not multirun:
        raise ConfigError(f"sweep={name}: a study runs many experiments; add -m")
    for p in space:
        if p.name not in known:
            close = difflib.get_close_matches(p.name, known, n=1)
            raise ConfigError(f"{p.name}: not a parameter xp knows" + (f"; did you mean {close[0]}?" if close else ""))
    spec = study.spec_from(node, name, set(known), extra=space)
    check_storage(spec.storage)
    corners = [[*base, f"{p.name}={int(v) if p.kind == 'int' else v}"] for p in spec.params
               for v in (p.choices if p.kind == "categorical" else (p.low, p.high))]
    return corners


# --- running -------------------------------------------------------------------

def _hydra(argv: list[str]) -> int:
    import hydra

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def task(cfg: Any) -> float:
        return _task(cfg)

    saved = sys.argv
    sys.argv = [saved[0] if saved else "xp", *argv]
    try:
        task()
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved


def _task(cfg: Any) -> float:
    """One Hydra job: the raw DictConfig stops here; run() gets a plain dict."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from xp.experiment import JobInfo, run

    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    job = JobInfo(
        overrides=[o for o in hc.overrides.task if not o.lstrip("+~").startswith("hydra")],
        output_dir=out,
        log_file=out / f"{hc.job.name}.log",
        parent_run_id=os.environ.get(PARENT_ENV),
        cwd=Path(hc.runtime.cwd),
        run_id=os.environ.get(RUN_ENV),
        swept=tuple(k for k in os.environ.get(SWEPT_ENV, "").split(",") if k),
    )
    config = OmegaConf.to_container(cfg, resolve=True)
    in_study = (config.get("optuna") or {}).get("trial_id") is not None
    try:
        outcome = run(config, job)
        if in_study:  # what the study's sweeper reads
            return {"state": outcome.state, "values": outcome.values}
        return outcome.objective
    except XPError as e:
        log.debug("error", exc_info=True)
        code = _err(e, e.exit_code)
    except Exception as e:
        if not getattr(e, "xp_logged", False):
            log.debug("failed", exc_info=True)
        code = _err(f"training failed: {type(e).__name__}: {one_line(e)[:500]} (traceback in {job.log_file})", 1)
    if in_study:
        return {"state": "FAIL"}  # a failed trial is recorded; the study goes on
    raise SystemExit(code)


def _engine(config: dict[str, Any]) -> tuple[Any, Any]:
    """The run's plan and the distributed engine it needs (its backend decides), or None for one process."""
    from xp.experiment import plan_and_backend

    plan, backend_cls = plan_and_backend(config)
    return plan, backend_cls.launch(plan)


def _launch(argv: list[str], plan: Any, engine_cls: Any) -> int:
    """A distributed job: this process starts the workers and owns the MLflow run, which rank 0 fills."""
    from xp.launch import LaunchError, launch, prepare, spec_for
    from xp.worker import HOSTS_ENV
    from xp.stores import check_reachable, resolve_uri
    from xp.tracking import Tracker, run_name

    uri = resolve_uri(plan.tracking_uri)
    if plan.resume is not None and not Path(str(plan.resume)).expanduser().is_dir():
        raise ConfigError(f"resume={plan.resume}: a distributed run resumes from a folder "
                          "(resume=CHECKPOINT_DIR, a new MLflow run)")
    overrides = [a for a in argv if not a.startswith("-")]
    if plan.launch.launcher == "slurm" and not _slurm().inside():
        return _submit(argv, plan, engine_cls, uri, overrides)
    elastic_on = plan.elastic.enabled
    spec = spec_for(plan, argv, engine_cls, env={RUN_ENV: "", "MLFLOW_TRACKING_URI": uri}, elastic=elastic_on)
    engine = engine_cls(spec)
    prepare(engine, [h.name for h in spec.hosts] if elastic_on else None,  # elastic: every listed host
            before_probe=lambda: check_reachable(uri, [h.name for h in spec.hosts], spec.host_ip))
    if spec.remote and not elastic_on:  # the instances the job occupies: rank 0 prices them (elastic: per worker)
        spec.env[HOSTS_ENV] = str(len(engine.hosts()))
    submitted = os.environ.get(RUN_ENV) if spec.launcher == "slurm" else None  # the run xp's sbatch created
    tracker = Tracker(uri, plan.experiment, plan.run_name or run_name(overrides), attach_run_id=submitted,
                      tags={"xp.launcher": spec.launcher, "xp.engine": engine.name, "xp.workers": str(spec.workers),
                            **({"xp.hosts": ",".join(engine.hosts())} if spec.remote else {})})
    tracker.start()
    spec.env[RUN_ENV] = tracker.run_id
    print(f"xp: launching {engine.describe()}; MLflow run {tracker.run_id}", flush=True)

    def run() -> None:
        if elastic_on:
            from xp import elastic

            elastic.run(engine, plan, lambda metrics, step: tracker.log_metrics(metrics, step=step))
        else:
            launch(engine)

    return _owned_run(tracker, run, LaunchError)


def _owned_run(tracker: Any, body: Any, expected: type[XPError]) -> int:
    """body() in the MLflow run this process owns, which it ends FINISHED, KILLED (Ctrl-C, SIGTERM) or FAILED
    (`expected`: one line and its exit code; anything else propagates)."""
    from xp.tracking import end_state

    error: BaseException | None = None
    try:
        body()
        return 0
    except expected as e:
        error = e
        return _err(e, e.exit_code)
    except BaseException as e:
        error = e
        raise
    finally:
        tracker.end(end_state(error))


def _check_cluster_sweep(argv: list[str], config: dict[str, Any]) -> None:
    """hydra/launcher=submitit_slurm: every job or trial runs on a cluster node, so the MLflow store, and a
    study's Optuna storage (its trials report every epoch for pruning), must be ones every node reaches."""
    from xp.stores import check_reachable, resolve_uri

    launcher = next((a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("hydra/launcher=")), "")
    if not launcher.startswith("submitit_slurm"):
        return
    nodes = [f"the Slurm jobs' nodes (hydra/launcher={launcher})"]
    check_reachable(resolve_uri(config.get("tracking_uri")), nodes, None)
    if config.get("sweep"):
        from xp.study import storage_url

        check_reachable(storage_url(config["sweep"].get("storage")), nodes, None, key="sweep.storage",
                        fix="give the study a database every node reaches: "
                            "sweep.storage=postgresql://USER:PASSWORD@HOST/DB (or $XP_OPTUNA_STORAGE)")


def _slurm() -> Any:
    from xp import slurm

    return slurm


def _submit(argv: list[str], plan: Any, engine_cls: Any, uri: str, overrides: list[str]) -> int:
    """launcher=slurm from a login node: the run as a Slurm job; this process owns its MLflow run and ends it
    with the job's outcome (Slurm's reason when Slurm ended it)."""
    from xp.stores import check_reachable
    from xp.tracking import Tracker, run_name

    slurm = _slurm()
    slurm.check(plan.launch.slurm)
    check_reachable(uri, ["the Slurm job's nodes"], None)
    tracker = Tracker(uri, plan.experiment, plan.run_name or run_name(overrides),
                      tags={"xp.launcher": "slurm", "xp.engine": engine_cls.name if engine_cls else "none",
                            "xp.workers": str(plan.workers)})
    tracker.start()
    return _owned_run(tracker, lambda: slurm.submit(plan, argv, tracker), slurm.SlurmError)


def _remember_command(argv: list[str]) -> None:
    """The command line as typed, for the runs' tags (xp.tracking.source_tags); a sweep's jobs, a study's trials
    and launched workers inherit the first process's."""
    import shlex

    from xp.tracking import COMMAND_ENV

    if not os.environ.get(COMMAND_ENV):
        entry = "python -m xp" if sys.argv[0].endswith("__main__.py") else "xp"
        os.environ[COMMAND_ENV] = f"{entry} {shlex.join(argv)}".strip()


def swept_keys(overrides: list[str]) -> list[str]:
    """The keys a multirun varies (KEY=a,b or a sweep function), as Hydra's override parser reads them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return [o.key_or_group for o in OverridesParser.create().parse_overrides(overrides) if o.is_sweep_override()]


def _sweep(argv: list[str], config: dict[str, Any]) -> int:
    """Run a Hydra multirun under one MLflow parent run; print the sweep's table at the end."""
    from xp import summary, sweepstate
    from xp.stores import resolve_uri
    from xp.tracking import Tracker, end_state, run_name

    uri = resolve_uri(config.get("tracking_uri"))
    overrides = [a for a in argv if a not in ("-m", "--multirun") and not a.startswith("hydra/sweeper=")]
    chosen = next((a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("sweep=")), "")
    kind = f"study {config['sweep'].get('name') or chosen}" if config.get("sweep") else "sweep"
    experiment = config.get("experiment") or "xp"
    skey = sweepstate.key("sweep", experiment, overrides)
    parent = Tracker(uri, experiment, f"{kind}: " + run_name(overrides),
                     tags={"xp.sweep": "true", sweepstate.SWEEP_KEY: skey})
    parent.reopen_run_id = sweepstate.interrupted_parent(parent, skey)  # a killed sweep goes on where it was
    parent.start()
    if parent.reopen_run_id:
        os.environ[sweepstate.RESUMED_ENV] = "1"
        log.info(f"sweep: resuming the interrupted sweep of MLflow parent run {parent.run_id}: its finished jobs "
                 "are reused")
    else:
        parent.log_params({"sweep.overrides": " ".join(overrides)})
    os.environ[PARENT_ENV] = parent.run_id
    from hydra._internal.utils import get_args_parser

    os.environ[SWEPT_ENV] = ",".join(swept_keys(get_args_parser().parse_args(argv).overrides))
    error: BaseException | None = None
    rc = 1
    try:
        rc = _hydra(argv)
        return rc
    except BaseException as e:
        error = e
        raise
    finally:
        status = end_state(error, failed=rc != 0)
        os.environ.pop(PARENT_ENV, None)
        os.environ.pop(SWEPT_ENV, None)
        os.environ.pop(sweepstate.RESUMED_ENV, None)
        try:
            children = sweepstate.latest_per_job(parent.child_runs())
            rows = [summary.row_from_mlflow(r) for r in children]
            parent.log_params(summary.parent_params(rows, children))
            parent.set_tags(summary.parent_tags(children))
        finally:
            parent.end(status)
        print(f"\nsweep: {len(rows)} runs under MLflow parent run {parent.run_id} ({status})")
        print(summary.table(rows))
