"""Optuna studies run as Hydra sweeps (`python -m xp -m sweep=NAME`).

The study is defined in sweeps/NAME.yaml: search space, trial budget, objectives and
directions, sampler, pruner, study name and storage. Each file is an option of the config
group `sweep` (typed by StudyConf), so sweep.FIELD=VALUE overrides any field, and
KEY=interval(...)/choice(...)/range(...) on the command line add to the search space
(space_from_overrides). xp's sweeper (hydra/sweeper=
xp_optuna) asks Optuna for trials and launches each as a normal xp run through the
Hydra launcher (in-process, or joblib for parallel trials). The job attaches to its
trial in the RDB storage, reports the first objective after every epoch and stops
when the pruner says so; the sweeper tells Optuna how each trial ended. A study lives
in its storage (SQLite in mlruns/ by default): the same command again continues it up
to its budget.

Trials of a sweeper that died (SIGKILL, OOM, a lost host) stay RUNNING in the storage. The
sweeper records a heartbeat for every trial in flight (Optuna's RDB heartbeat); any sweeper
of the study that starts or asks later marks trials silent for more than grace_s FAIL and
retries each with the same parameters, at most max_retry times.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import logging
import math
import os
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from xp import shipped
from xp.callbacks import Callback
from xp.errors import ConfigError, one_line, redact

log = logging.getLogger("xp")

SWEEPS_DIR = Path(os.environ.get("XP_SWEEPS_DIR") or shipped("sweeps"))
DEFAULT_STORAGE = "sqlite:///mlruns/optuna.db"
SAMPLERS = ("tpe", "random", "grid", "gp", "nsga2", "cmaes")
PRUNERS = ("none", "median", "hyperband", "successive_halving")
# What a trial can be judged by: keys of the run's summary (xp.summary.summarize).
METRICS = ("val_accuracy", "best_val_accuracy", "throughput", "cost_usd", "train_time_s", "epoch_time_s")
FINISHED = ("COMPLETE", "PRUNED", "FAIL")


class TrialPruned(Exception):
    """Raised inside a run when the pruner stops the trial."""


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # float | int | categorical
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Objective:
    metric: str
    direction: str  # maximize | minimize


@dataclass(frozen=True)
class StudySpec:
    name: str  # the file sweeps/NAME.yaml
    study_name: str
    storage: str
    n_trials: int
    parallel: int
    sampler: str
    sampler_seed: int | None
    pruner: str
    pruner_options: dict[str, Any]
    objectives: tuple[Objective, ...]
    params: tuple[Param, ...]
    heartbeat_s: int = 30
    grace_s: int = 120
    max_retry: int = 2

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1


def names() -> list[str]:
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))


def storage_url(url: str | None, cwd: str | Path | None = None) -> str:
    """The storage URL with a relative SQLite path made absolute (jobs may run elsewhere)."""
    url = url or os.environ.get("XP_OPTUNA_STORAGE") or DEFAULT_STORAGE
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/"):
        url = prefix + str((Path(cwd or os.getcwd()) / url[len(prefix):]).resolve())
    if url.startswith(prefix):
        Path(url[len(prefix):]).parent.mkdir(parents=True, exist_ok=True)
    return url


@dataclass
class StudyConf:
    """A study, as the config group `sweep` holds it: `sweep=NAME` selects sweeps/NAME.yaml (or NAME.yaml in a
    `sweep/` folder of the user's config directory), and every field is an override (sweep.n_trials=50)."""
    name: str = ""  # the option's name (set by xp: the file's name)
    study_name: str | None = None  # Optuna study name (default: name); the same name continues the study
    storage: str | None = None  # RDB URL; null = sqlite:///mlruns/optuna.db (or $XP_OPTUNA_STORAGE)
    n_trials: int = 20  # trial budget (finished trials count, also from earlier runs)
    parallel: int = 1  # trials launched at once (with hydra/launcher=joblib)
    sampler: str = "tpe"  # tpe | random | grid | gp | nsga2 | cmaes
    sampler_seed: int | None = None  # the sampler's seed (null = random)
    pruner: str = "median"  # none | median | hyperband | successive_halving
    pruner_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    objectives: list[Any] | None = None  # [{metric, direction}]; null: maximize val_accuracy
    params: dict[str, Any] = dataclasses.field(default_factory=dict)  # search space (also KEY=interval(...) ...)
    heartbeat_s: int = 30  # the sweeper's heartbeat for each trial in flight, seconds
    grace_s: int | None = None  # a trial silent this long lost its sweeper (null: 4 x heartbeat_s)
    max_retry: int = 2  # times a lost trial is retried with the same parameters


FIELDS = tuple(f.name for f in dataclasses.fields(StudyConf))


def register() -> None:
    """Offer every study file as an option of the config group `sweep` (typed by StudyConf). A file that does
    not fit the schema is offered as it is: selecting it then fails with spec_from's one line."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    store = ConfigStore.instance()
    for path in sorted(SWEEPS_DIR.glob("*.yaml")):
        try:
            raw = yaml.safe_load(path.read_text()) or {}
            node = OmegaConf.merge(OmegaConf.structured(StudyConf), {**raw, "name": path.stem})
        except Exception:
            node = OmegaConf.create({"name": path.stem, "_unreadable": str(path)})
        store.store(group="sweep", name=path.stem, node=node)


def load_spec(name: str, known_keys: set[str] | None = None, cwd: str | Path | None = None) -> StudySpec:
    """Read and check sweeps/NAME.yaml; every problem is one ConfigError naming the file and field."""
    path = SWEEPS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"sweep={name}: no such study in {SWEEPS_DIR}; valid: {', '.join(names())}")
    where = f"sweeps/{name}.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML ({one_line(e)[:200]})") from e
    return spec_from(raw, name, known_keys, cwd, where)


def spec_from(raw: dict[str, Any], name: str, known_keys: set[str] | None = None, cwd: str | Path | None = None,
              where: str | None = None, extra: tuple[Param, ...] = (), search: bool = True) -> StudySpec:
    """Check a study's settings (a study file, or the composed `sweep` node with its overrides); `extra`: a
    search space from the command line (KEY=interval(...) ...), mixed into the file's (it wins per key).
    search=False: a trial's view, which needs its objectives and pruner, not the search space."""
    where = where or f"sweep={name}"
    if "_unreadable" in raw:
        load_spec(name, known_keys, cwd)  # says what is wrong with the file
        raise ConfigError(f"sweep={name}: {raw['_unreadable']} does not fit a study's fields ({', '.join(FIELDS)})")
    raw = {k: v for k, v in raw.items() if k != "name" and not (v is None and k in ("grace_s", "objectives"))}
    if raw.get("pruner_options") == {}:
        raw.pop("pruner_options")

    def field(key: str, default: Any = None) -> Any:
        return raw.get(key, default)

    unknown = set(raw) - {"study_name", "storage", "n_trials", "parallel", "sampler", "sampler_seed", "pruner",
                          "pruner_options", "objectives", "params", "heartbeat_s", "grace_s", "max_retry"}
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    n_trials, parallel = field("n_trials", 20), field("parallel", 1)
    heartbeat_s, max_retry = field("heartbeat_s", 30), field("max_retry", 2)
    grace_s = field("grace_s", 4 * heartbeat_s if isinstance(heartbeat_s, int) else None)
    for key, v, low in (("n_trials", n_trials, 1), ("parallel", parallel, 1), ("heartbeat_s", heartbeat_s, 1),
                        ("grace_s", grace_s, 1), ("max_retry", max_retry, 0)):
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ConfigError(f"{where}: {key}={v!r}: must be an integer >= {low}")
    if grace_s <= heartbeat_s:
        raise ConfigError(f"{where}: grace_s={grace_s} must be longer than heartbeat_s={heartbeat_s}, or live "
                          "trials are taken for dead ones")
    sampler, pruner = field("sampler", "tpe"), field("pruner", "median")
    if sampler not in SAMPLERS:
        raise ConfigError(f"{where}: sampler={sampler!r}: unknown; valid: {', '.join(SAMPLERS)}")
    if pruner not in PRUNERS:
        raise ConfigError(f"{where}: pruner={pruner!r}: unknown; valid: {', '.join(PRUNERS)}")

    objectives = _objectives(field("objectives"), where, sampler, pruner)
    given = {p.name for p in extra}
    space = {k: v for k, v in (field("params") or {}).items() if k not in given}
    params = [*(_search_space(space, where, known_keys) if space or (search and not extra) else []), *extra]
    if sampler == "grid" and any(p.kind != "categorical" for p in params):
        raise ConfigError(f"{where}: sampler=grid needs every parameter categorical (the grid's values)")
    for sampler_name, module, pkg in (("gp", "torch", "torch"), ("cmaes", "cmaes", "cmaes")):
        if sampler == sampler_name and importlib.util.find_spec(module) is None:
            raise ConfigError(f"{where}: sampler={sampler_name} needs the {pkg} package: pip install {pkg}")
    seed = field("sampler_seed")
    return StudySpec(name, str(field("study_name") or name), storage_url(field("storage"), cwd), n_trials, parallel,
                     sampler, seed, pruner, dict(field("pruner_options") or {}), tuple(objectives), tuple(params),
                     heartbeat_s, grace_s, max_retry)


def space_from_overrides(overrides: list[Any], known_keys: set[str] | None = None) -> tuple[tuple[Param, ...], list[str]]:
    """A study's search space from Hydra's sweep syntax on the command line, and the other overrides:
    KEY=a,b / choice(a,b): categorical; range(start,stop[,step]): categorical over its values;
    interval(low,high): float; tag(log, interval(...)): log scale; tag(int, interval(...)): integer."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    params, rest = [], []
    for o in overrides:
        if not o.is_sweep_override() or o.key_or_group.startswith(("hydra", "sweep")):
            rest.append(o.input_line)
            continue
        key, at, sweep = o.key_or_group, o.input_line, o.value()
        if known_keys is not None and key not in known_keys:
            close = difflib.get_close_matches(key, sorted(known_keys), n=1)
            raise ConfigError(f"{at}: unknown parameter" + (f"; did you mean {close[0]}?" if close else ""))
        tags = set(getattr(sweep, "tags", ()) or ())
        if isinstance(sweep, IntervalSweep):
            low, high, log_scale = float(sweep.start), float(sweep.end), "log" in tags
            if low > high:
                raise ConfigError(f"{at}: low {low:g} > high {high:g}")
            if log_scale and low <= 0:
                raise ConfigError(f"{at}: a log scale needs low > 0, got {low:g}")
            kind = "int" if "int" in tags else "float"
            if kind == "int" and not (low.is_integer() and high.is_integer()):
                raise ConfigError(f"{at}: tag(int, ...) needs integer bounds")
            params.append(Param(key, kind, low, high, log_scale))
        elif isinstance(sweep, (ChoiceSweep, RangeSweep)):
            values = [float(f"{v:.12g}") if isinstance(v, float) else v for v in o.sweep_iterator()]  # 0.7, not 0.70..01
            if not values:
                raise ConfigError(f"{at}: no values to choose from")
            params.append(Param(key, "categorical", choices=tuple(values)))
        else:
            raise ConfigError(f"{at}: a study searches choice(...), range(...) or interval(...)")
    return tuple(params), rest


def _objectives(given: Any, where: str, sampler: str, pruner: str) -> list[Objective]:
    objectives = []
    for i, o in enumerate(given or [{"metric": "val_accuracy", "direction": "maximize"}]):
        if not isinstance(o, dict) or o.get("metric") not in METRICS or o.get("direction") not in ("maximize", "minimize"):
            raise ConfigError(f"{where}: objectives[{i}]={o!r}: needs metric (one of {', '.join(METRICS)}) "
                              "and direction (maximize or minimize)")
        objectives.append(Objective(o["metric"], o["direction"]))
    if len(objectives) > 1 and pruner != "none":
        raise ConfigError(f"{where}: pruner={pruner}: Optuna prunes single-objective studies only; "
                          f"use pruner: none with {len(objectives)} objectives")
    if len(objectives) > 1 and sampler == "cmaes":
        raise ConfigError(f"{where}: sampler=cmaes optimises one objective; use nsga2 or tpe")
    return objectives


def _search_space(space: Any, where: str, known_keys: set[str] | None) -> list[Param]:
    if not isinstance(space, dict) or not space:
        raise ConfigError(f"{where}: params: give at least one parameter to search")
    params = []
    for pname, p in space.items():
        at = f"{where}: params.{pname}"
        if known_keys is not None and pname not in known_keys:
            close = difflib.get_close_matches(pname, sorted(known_keys), n=1)
            raise ConfigError(f"{at}: unknown parameter" + (f"; did you mean {close[0]}?" if close else ""))
        if not isinstance(p, dict) or p.get("type") not in ("float", "int", "categorical"):
            raise ConfigError(f"{at}: needs type: float, int or categorical")
        if p["type"] == "categorical":
            choices = p.get("choices")
            if not isinstance(choices, list) or not choices:
                raise ConfigError(f"{at}: choices must be a non-empty list")
            params.append(Param(pname, "categorical", choices=tuple(choices)))
            continue
        low, high, log_scale = p.get("low"), p.get("high"), bool(p.get("log", False))
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high)):
            raise ConfigError(f"{at}: low and high must be numbers")
        if low > high:
            raise ConfigError(f"{at}: low={low} > high={high}")
        if log_scale and low <= 0:
            raise ConfigError(f"{at}: a log scale needs low > 0, got {low}")
        if p["type"] == "int" and not (float(low).is_integer() and float(high).is_integer()):
            raise ConfigError(f"{at}: an int parameter needs integer low and high")
        params.append(Param(pname, p["type"], low, high, log_scale))
    return params


# --- Optuna objects (imported lazily: optuna is not needed to run a plain experiment) ---

def distributions(spec: StudySpec) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out = {}
    for p in spec.params:
        if p.kind == "categorical":
            out[p.name] = CategoricalDistribution(list(p.choices))
        elif p.kind == "int":
            out[p.name] = IntDistribution(int(p.low), int(p.high), log=p.log)
        else:
            out[p.name] = FloatDistribution(float(p.low), float(p.high), log=p.log)
    return out


def sampler_seed(spec: StudySpec, told: int) -> int | None:
    """The sampler's seed for a sweeper that finds `told` trials in the study already: sampler_seed for a new
    study, and one derived from (sampler_seed, told) for a resumed one. A sampler restarted from the same
    seed would propose the same parameters again (a TPE or random study resumed in its random start-up
    phase repeated its first trials); derived, a resumed study explores, and the same command from the same
    storage still proposes the same trials. (Optuna cannot store a sampler's random state in the study.)"""
    if spec.sampler_seed is None or told == 0:
        return spec.sampler_seed
    import zlib

    return zlib.crc32(f"{spec.sampler_seed}:{told}".encode())


def make_sampler(spec: StudySpec, told: int = 0) -> Any:
    import optuna

    s, seed = spec.sampler, sampler_seed(spec, told)
    # grid: run_study enqueues every combination (Optuna's GridSampler calls study.stop() when the
    # grid is exhausted, which only works inside study.optimize(), not with ask-and-tell)
    return {"tpe": lambda: optuna.samplers.TPESampler(seed=seed, multivariate=True),
            "grid": lambda: optuna.samplers.RandomSampler(seed=seed),
            "random": lambda: optuna.samplers.RandomSampler(seed=seed),
            "gp": lambda: optuna.samplers.GPSampler(seed=seed),
            "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=seed),
            "cmaes": lambda: optuna.samplers.CmaEsSampler(seed=seed)}[s]()


def make_pruner(spec: StudySpec) -> Any:
    import optuna

    o = spec.pruner_options
    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=o.get("n_startup_trials", 3),
                                           n_warmup_steps=o.get("n_warmup_steps", 2))
    if spec.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=o.get("min_resource", 1),
                                              reduction_factor=o.get("reduction_factor", 3))
    if spec.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=o.get("min_resource", 1))
    return optuna.pruners.NopPruner()


def check_storage(url: str) -> None:
    """Connect once, before anything is created: an unreachable database is a usage error."""
    from xp.tracking import check_database

    check_database(url, "storage")


def open_study(spec: StudySpec) -> Any:
    """The study, on a storage that records heartbeats and retries the trials of dead sweepers."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_storage(spec.storage)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = optuna.storages.RDBStorage(
            spec.storage, heartbeat_interval=spec.heartbeat_s, grace_period=spec.grace_s,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=spec.max_retry))
    study = optuna.create_study(study_name=spec.study_name, storage=storage, sampler=make_sampler(spec),
                                pruner=make_pruner(spec), directions=[o.direction for o in spec.objectives],
                                load_if_exists=True)
    wanted = [o.direction for o in spec.objectives]
    have = [d.name.lower() for d in study.directions]
    if have != wanted:
        raise ConfigError(f"sweep={spec.name}: study {spec.study_name} in {redact(spec.storage)} optimises {have}, "
                          f"the spec says {wanted}; use another study_name")
    told = len(study.get_trials(deepcopy=False))
    if told:
        study.sampler = make_sampler(spec, told)  # a resumed study continues, it does not replay
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([o.metric for o in spec.objectives])  # optuna-dashboard shows these names
    study.set_user_attr("xp.sweep", spec.name)
    return study


def retry_dead_trials(study: Any, spec: StudySpec) -> list[str]:
    """Mark trials without a heartbeat for grace_s FAIL; each is queued again with its parameters
    (up to max_retry times). Returns one line per trial found."""
    import optuna

    before = {t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    trials = study.get_trials(deepcopy=False)
    retries = {t.system_attrs["retry_history"][-1]: t for t in trials if t.system_attrs.get("retry_history")}
    lines = []
    for t in trials:
        if t.number in before and t.state.name == "FAIL":
            again = retries.get(t.number)
            lines.append(f"trial {t.number} lost its sweeper (no heartbeat for {spec.grace_s} s): "
                         + (f"retried as trial {again.number} with the same parameters" if again
                            else "failed, retry limit reached"))
    return lines


@contextmanager
def heartbeat(study: Any, trials: list[Any]):
    """Record a heartbeat for `trials` every heartbeat interval while the block runs."""
    storage, stop = study._storage, threading.Event()
    interval = storage.get_heartbeat_interval()

    def beat() -> None:
        while True:
            for t in trials:
                try:
                    storage.record_heartbeat(t._trial_id)
                except Exception as e:  # a database hiccup must not end the sweep; the next beat tries again
                    log.warning(f"heartbeat of trial {t.number}: {one_line(e)[:200]}")
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name="xp-optuna-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


def _counts(study: Any) -> tuple[int, int]:
    """(finished trials that count towards the budget, trials running elsewhere). A failed trial that
    was retried does not count: its retry does."""
    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    done = sum(1 for t in trials if t.state.name in FINISHED and t.number not in retried)
    return done, sum(1 for t in trials if t.state.name == "RUNNING")


# --- the job side: a run that is a trial ------------------------------------------

class TrialReporter(Callback):
    """Reports the first objective after every epoch and raises TrialPruned when told to stop."""

    def __init__(self, trial: Any, metric: str, epochs: int):
        self.trial, self.metric, self.epochs = trial, metric, epochs

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        if self.metric in metrics:
            self.trial.report(metrics[self.metric], epoch)
            # after the last epoch there is nothing left to save: the trial is complete
            if epoch < self.epochs and self.trial.should_prune():
                raise TrialPruned(f"pruned after epoch {epoch}")


def attach(settings: Any) -> tuple[Any, StudySpec] | None:
    """The trial a run is (the plan's StudySettings, from the sweeper's optuna.* overrides), or None."""
    if settings is None:
        return None
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = spec_from(settings.sweep, settings.sweep.get("name") or settings.study, search=False)
    study = optuna.load_study(study_name=settings.study, storage=settings.storage, pruner=make_pruner(spec))
    return optuna.trial.Trial(study, settings.trial_id), spec


# --- the sweeper side ----------------------------------------------------------------

def _override(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return f"{key}={'true' if value else 'false'}"
    if isinstance(value, (int, float)):
        return f"{key}={value!r}"
    return f"{key}='{value}'"


def run_study(config: Any, arguments: list[str], launcher: Any) -> list[Any]:
    """Ask, launch, tell until the study has n_trials finished trials; report the best."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(config.sweep, resolve=True)
    space, arguments = space_from_overrides(OverridesParser.create().parse_overrides(arguments))
    name = node.get("name") or config.hydra.runtime.choices.get("sweep")  # a user's file has no name field
    spec = spec_from(node, name, extra=space)  # checked by the CLI already
    study = open_study(spec)
    for line in retry_dead_trials(study, spec):
        log.warning(line)
    done, elsewhere = _counts(study)
    remaining = spec.n_trials - done - elsewhere
    log.info(f"study {spec.study_name} ({redact(spec.storage)}): {done} trials done, {elsewhere} running elsewhere, "
             f"{max(0, remaining)} to run "
             f"(sampler {spec.sampler}, pruner {spec.pruner}, objectives "
             + ", ".join(f"{o.direction} {o.metric}" for o in spec.objectives) + ")")
    if spec.sampler == "grid":
        import itertools

        combos = list(itertools.product(*(p.choices for p in spec.params)))
        remaining = min(remaining, len(combos) - done)
        for combo in combos:
            study.enqueue_trial(dict(zip((p.name for p in spec.params), combo)), skip_if_exists=True)
    # With a parallel launcher (hydra/launcher=joblib hydra.launcher.n_jobs=N), ask N trials at a time.
    n_jobs = (config.hydra.launcher.get("n_jobs") or 1) if "n_jobs" in config.hydra.launcher else 1
    parallel = max(spec.parallel, os.cpu_count() or 1 if n_jobs == -1 else n_jobs)
    returns, job = [], 0
    while remaining > 0:
        for line in retry_dead_trials(study, spec):
            log.warning(line)
        trials, reused = _ask(study, distributions(spec), min(parallel, remaining))
        remaining -= reused
        if not trials:
            continue
        jobs = [[*arguments, *(_override(k, v) for k, v in t.params.items()), f"optuna.study={spec.study_name}",
                 f"optuna.storage='{spec.storage}'", f"optuna.trial_id={t._trial_id}"] for t in trials]
        with heartbeat(study, trials):
            results = launcher.launch(jobs, initial_job_idx=job)
        _tell(study, trials, results)
        returns.append(results)
        job += len(trials)
        done, elsewhere = _counts(study)
        remaining = spec.n_trials - done - elsewhere
    from xp.tracking import resolve_uri

    summarize(study, spec, resolve_uri(config.get("tracking_uri")))
    return returns


def _ask(study: Any, dists: dict[str, Any], n: int) -> tuple[list[Any], int]:
    """Up to n new trials to run, and how many asked trials reused an earlier result instead (they count)."""
    trials, reused = [], 0
    while len(trials) < n - reused:
        with warnings.catch_warnings():  # "heartbeat is supposed to be used with Study.optimize": xp beats itself
            warnings.simplefilter("ignore", UserWarning)
            t = study.ask(dists)
        if _reuse_earlier(study, t):  # the same parameters already ran: runs are deterministic
            reused += 1
            continue
        trials.append(t)
    return trials, reused


def _tell(study: Any, trials: list[Any], results: list[Any]) -> None:
    """How each launched trial ended, as its job returned it (xp.cli: {"state", "values"})."""
    from optuna.trial import TrialState

    for t, r in zip(trials, results):
        out = r._return_value if r.status.name == "COMPLETED" and isinstance(r._return_value, dict) else {}
        if out.get("state") == "COMPLETE":
            study.tell(t, out["values"])
        elif out.get("state") == "PRUNED":
            study.tell(t, state=TrialState.PRUNED)
        else:
            study.tell(t, state=TrialState.FAIL)


def _reuse_earlier(study: Any, trial: Any) -> bool:
    """Tell `trial` the outcome of a finished trial with the same parameters, if there is one.

    An xp run is a function of its config (fixed seed, data order, initial weights), so
    rerunning the same parameters costs a whole run and teaches the sampler nothing.
    """
    from optuna.trial import TrialState

    for old in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if old.params == trial.params:
            trial.set_user_attr("reused_from_trial", old.number)
            if old.state == TrialState.COMPLETE:
                study.tell(trial, old.values)
            else:
                study.tell(trial, state=TrialState.PRUNED)
            log.info(f"trial {trial.number}: same parameters as trial {old.number}; its result is reused")
            return True
    return False


def summarize(study: Any, spec: StudySpec, tracking_uri: str | None = None) -> dict[str, Any]:
    """Print the best trial (or the Pareto front) and log it on the sweep's parent MLflow run."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    states = {s: sum(1 for t in trials if t.state == getattr(TrialState, s)) for s in FINISHED}
    best = study.best_trials
    front = [{"trial": t.number, "values": dict(zip([o.metric for o in spec.objectives], t.values)),
              "params": t.params, "mlflow_run_id": t.user_attrs.get("mlflow_run_id")} for t in best]
    log.info(f"study {spec.study_name}: {len(trials)} trials ({', '.join(f'{v} {k.lower()}' for k, v in states.items())})")
    title = "Pareto front" if spec.multi_objective else "best trial"
    for f in front:
        log.info(f"  {title}: trial {f['trial']}  " + "  ".join(f"{k}={v:.4g}" for k, v in f["values"].items())
                 + "  " + " ".join(f"{k}={v}" for k, v in f["params"].items()))
    summary = {"study": spec.study_name, "storage": redact(spec.storage), "trials": states, "best": front}
    parent = os.environ.get("XP_PARENT_RUN_ID")
    if parent and tracking_uri:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri)
        client.set_tag(parent, "optuna.study", spec.study_name)
        if front and not spec.multi_objective:
            for k, v in front[0]["params"].items():
                client.log_param(parent, f"best.{k}", v)
            client.log_metric(parent, f"best_{spec.objectives[0].metric}", front[0]["values"][spec.objectives[0].metric])
        client.log_dict(parent, summary, "pareto_front.json" if spec.multi_objective else "best_trial.json")
    return summary


def to_json(summary: dict[str, Any]) -> str:
    return json.dumps(summary, indent=1, default=str)
