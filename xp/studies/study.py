"""Optuna studies run as Hydra sweeps (`python -m xp -m sweep=NAME`): what a study is.

This module defines and checks a study; xp.studies.trial holds its Optuna side (storage, sampler,
pruner, heartbeats) and xp.studies.sweeper the loop that runs its trials.

The study is defined in sweeps/NAME.yaml: search space, trial budget, objectives and directions, sampler,
pruner, study name and storage. Each file is an option of the config group `sweep` (typed by StudyConf), so
sweep.FIELD=VALUE overrides any field, and KEY=interval(...)/choice(...)/range(...) on the command line add to
the search space (xp.studies.overrides). xp's sweeper (hydra/sweeper=xp_optuna) asks Optuna for trials and
keeps one in flight on every slot (xp.studies.scheduler; a worker process per slot runs trial after trial, each
a normal xp run); every epoch the trial's first objective goes to the scheduler, which reports it and answers
whether to prune; the scheduler tells Optuna how each trial ended. A study lives in its storage (SQLite in
mlruns/ by default): the same command again continues it up to its budget.

A dead sweeper's trials (SIGKILL, a lost host), silent past grace_s, are FAIL and retried (max_retry). A study
with search=pbt trains a population instead (xp.studies.pbt)."""

from __future__ import annotations

import difflib
import importlib.util
import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeGuard

import yaml

from xp.errors import ConfigError, one_line
from xp.states import TRIAL_ENDS
from xp.studies.pbtspec import pbt_from
from xp.studies.paretospec import pareto_rule
from xp.studies.studyfile import FIELDS, SWEEPS_DIR

log = logging.getLogger("xp")

DEFAULT_STORAGE = "sqlite:///mlruns/optuna.db"
SAMPLERS = ("tpe", "random", "grid", "gp", "nsga2", "cmaes")
PRUNERS = ("none", "median", "hyperband", "successive_halving", "pareto")
# What a trial can be judged by: keys of the run's summary (xp.results.summarize).
METRICS = ("val_accuracy", "best_val_accuracy", "throughput", "cost_usd", "train_time_s", "epoch_time_s")
FINISHED = TRIAL_ENDS  # (xp.states)
# What a recipe's claim is about: the report's seed-claims section computes the figure of each (xp.report.claims).
CLAIM_KINDS = ("scaling", "input_pipeline", "dynamic", "batch", "finetune")


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # float | int | categorical
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    @property
    def bounds(self) -> tuple[float, float]:
        """A numeric parameter's low and high (a categorical one has none)."""
        if self.low is None or self.high is None:
            raise ValueError(f"{self.name}: a {self.kind} parameter has no bounds")
        return self.low, self.high


@dataclass(frozen=True)
class Objective:
    metric: str
    direction: Literal["maximize", "minimize"]


@dataclass(frozen=True)
class StudySpec:
    name: str  # the file sweeps/NAME.yaml
    study_name: str
    storage: str
    n_trials: int
    parallel: int | None  # trials in flight at once (None: one per slot the placement offers)
    sampler: str
    sampler_seed: int | None
    pruner: str
    pruner_options: dict[str, Any]
    objectives: tuple[Objective, ...]
    params: tuple[Param, ...]
    heartbeat_s: int = 30
    grace_s: int = 120
    max_retry: int = 2
    trials_per_gpu: int = 1  # trials packed on one GPU (small models)
    scheduler: str = "slots"  # slots: xp keeps a trial in flight on every slot; hydra: batches through Hydra's launcher
    settings: tuple[str, ...] = ()  # a recipe's experiment: overrides every trial starts from (the command line wins)
    claim: dict[str, Any] | None = None  # a recipe's published figure (kind, source, figure, at, ...)
    timeout_s: float | None = None  # no trial starts after the study has run this long (xp.studies.budget)
    hard_stop: bool = False  # ... and the trials in flight stop then too
    budget_usd: float | None = None  # no trial starts that would end past this cost
    register_model: str | None = None  # the Model Registry name of the study's best (None: not registered)
    fixed: tuple[str, ...] = ()  # KEY=VALUE of the command line that took a searched key out of the search
    continue_changed: bool = False  # the user's word: continue this study though its question changed (recorded)
    question: dict[str, str] | None = None  # what its trials hold fixed (xp.studies.question), as the preflight read it
    confirm: int = 0  # its top trials retrained with this many other seeds (xp.studies.confirm)
    confirm_top: int = 3  # ... these many of them
    pbt: Any = None  # search=pbt: its population (xp.studies.pbtspec.PbtSpec); None: Optuna's sampler searches
    warm_start: str | None = None  # an earlier study whose trials seed its sampler (xp.studies.warm)

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1


def names() -> list[str]:
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))


def storage_url(url: str | None, cwd: str | Path | None = None) -> str:
    """The storage URL with a relative SQLite (or journal file) path made absolute (jobs may run elsewhere)."""
    url = url or os.environ.get("XP_OPTUNA_STORAGE") or DEFAULT_STORAGE
    prefix = next((p for p in ("sqlite:///", "journal:///") if url.startswith(p)), None)
    if prefix and not url.startswith(prefix + "/"):
        url = prefix + str((Path(cwd or os.getcwd()) / url[len(prefix):]).resolve())
    if prefix:
        try:
            Path(url[len(prefix):]).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"sweep.storage={url}: its folder cannot be made ({e.strerror}: {e.filename})") from None
    return url


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
              where: str | None = None, extra: tuple[Param, ...] = (), search: bool = True,
              overrides: Iterable[str] = ()) -> StudySpec:
    """Check a study's settings (a study file, or the composed `sweep` node with its overrides); `extra`: a
    search space from the command line (KEY=interval(...) ...), mixed into the file's (it wins per key);
    `overrides`: the command line's other overrides: one that fixes a searched key (batch=32) takes it out of the
    search (the command line wins, as in Hydra). search=False: a trial's view, which needs its objectives and
    pruner, not the search space."""
    where = where or f"sweep={name}"
    if "_unreadable" in raw:
        load_spec(name, known_keys, cwd)  # says what is wrong with the file
        raise ConfigError(f"sweep={name}: {raw['_unreadable']} does not fit a study's fields ({', '.join(FIELDS)})")
    raw = {k: v for k, v in raw.items() if k != "name" and not (v is None and k in ("grace_s", "objectives"))}
    if raw.get("pruner_options") == {}:
        raw.pop("pruner_options")

    def field(key: str, default: Any = None) -> Any:
        return raw.get(key, default)

    if unknown := set(raw) - set(FIELDS):
        raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    n_trials, parallel, per_gpu = field("n_trials", 20), field("parallel"), field("trials_per_gpu", 1)
    confirm, confirm_top = field("confirm", 0), field("confirm_top", 3)
    heartbeat_s, max_retry = field("heartbeat_s", 30), field("max_retry", 2)
    grace_s = field("grace_s", 4 * heartbeat_s if isinstance(heartbeat_s, int) else None)
    _integers(where, (("n_trials", n_trials, 1), ("parallel", parallel, 1), ("heartbeat_s", heartbeat_s, 1),
                      ("grace_s", grace_s, 1), ("max_retry", max_retry, 0), ("trials_per_gpu", per_gpu, 1),
                      ("confirm", confirm, 0), ("confirm_top", confirm_top, 1)))
    if grace_s <= heartbeat_s:
        raise ConfigError(f"{where}: grace_s={grace_s} must be longer than heartbeat_s={heartbeat_s}, or live "
                          "trials are taken for dead ones")
    scheduler, sampler, pruner = field("scheduler", "slots"), field("sampler", "tpe"), field("pruner", "median")
    for key, value, valid in (("scheduler", scheduler, ("slots (xp keeps a trial in flight on every slot)", "hydra "
                                                         "(batches through Hydra's launcher)")),
                              ("sampler", sampler, SAMPLERS), ("pruner", pruner, PRUNERS)):
        if value not in [v.split()[0] for v in valid]:
            raise ConfigError(f"{where}: {key}={value!r}: unknown; valid: {', '.join(valid)}")

    _recipe_steps(field("batch_ladder"), field("pretrain"), where)  # (before the search space they fill)
    objectives = _objectives(field("objectives"), where, sampler, pruner, field("pruner_options"))
    params, fixed = _space_and_fixed(field("params") or {}, extra, overrides, where, known_keys, search)
    if confirm and (len(objectives) > 1 or "seed" in {p.name for p in params}):
        raise ConfigError(f"{where}: confirm={confirm}: retrains the best trial of one objective with other seeds; "
                          f"this study {'searches the seed' if len(objectives) < 2 else 'has several objectives'}")
    if sampler == "grid" and any(p.kind != "categorical" for p in params):
        raise ConfigError(f"{where}: sampler=grid needs every parameter categorical (the grid's values)")
    for sampler_name, module, pkg in (("gp", "torch", "torch"), ("cmaes", "cmaes", "cmaes")):
        if sampler == sampler_name and importlib.util.find_spec(module) is None:
            raise ConfigError(f"{where}: sampler={sampler_name} needs the {pkg} package: pip install {pkg}")
    settings, claim = study_settings_of(field("settings") or [], where), _claim(field("claim"), where)
    pbt = pbt_from(raw, params if search else None, fixed, where, scheduler)  # (pbt: no pruner)

    return StudySpec(name, str(field("study_name") or name), storage_url(field("storage"), cwd), n_trials, parallel,
                     sampler, field("sampler_seed"), "none" if pbt else pruner, dict(field("pruner_options") or {}),
                     tuple(objectives), tuple(params), heartbeat_s, grace_s, max_retry, per_gpu, scheduler, settings,
                     claim,
                     *_budget(raw, where), _registry_name(field("register_model"), field("study_name") or name, where),
                     fixed, _flag(field("continue_changed", False), "continue_changed", where), None, confirm,
                     confirm_top, pbt, warm_from(raw, where))


def _integers(where: str, given: tuple[tuple[str, Any, int], ...]) -> None:
    """Each (field, value, lowest) an integer of at least its lowest (parallel may be null)."""
    for key, v, low in given:
        if key == "parallel" and v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ConfigError(f"{where}: {key}={v!r}: must be an integer >= {low}")


def _space_and_fixed(file_space: dict[str, Any], extra: tuple[Param, ...], overrides: Iterable[str], where: str,
                     known_keys: set[str] | None, search: bool) -> tuple[list[Param], tuple[str, ...]]:
    """The search space: the file's, less each key the command line gives a range of its own (`extra`, which
    joins it) or one value (`overrides`: fixed, as Hydra's command line wins); and those fixing overrides."""
    fixed = tuple(o for o in fixed_overrides(overrides) if o.partition("=")[0] in file_space)
    given = {p.name for p in extra} | {o.partition("=")[0] for o in fixed}
    space = {k: v for k, v in file_space.items() if k not in given}
    if search and fixed and not space and not extra:
        raise ConfigError(f"{where}: every parameter it searches is fixed on the command line ({', '.join(fixed)}): "
                          "nothing is left to search; run it without -m sweep=..., or search another key")
    return [*(_search_space(space, where, known_keys) if space or (search and not extra) else []), *extra], fixed


def fixed_overrides(overrides: Iterable[str]) -> list[str]:
    """The command line's KEY=VALUE overrides of one value (not a sweep, a group, Hydra's or a study's own), as
    written: those that name a searched key fix it."""
    out = []
    for o in overrides:
        key, eq, value = o.lstrip("+~").partition("=")
        if not eq or key.startswith(("hydra", "sweep", "optuna")) or o.startswith("~"):
            continue
        if "," in value or value.strip().startswith(("choice(", "range(", "interval(", "tag(", "glob(")):
            continue  # a sweep (the search space's, from space_from_overrides)
        out.append(f"{key}={value}")
    return out


def _flag(value: Any, key: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key}={value!r}: must be true or false")
    return value


def _registry_name(value: Any, study: str, where: str) -> str | None:
    """register_model: the registry name of the study's best (null: the study's name; none: not registered)."""
    if value is None:
        return str(study)
    if not isinstance(value, str) or not value.strip() or "/" in value or "@" in value:
        raise ConfigError(f"{where}: register_model={value!r}: a Model Registry name (no / or @), or none")
    return None if value.lower() == "none" else value


def _budget(raw: dict[str, Any], where: str) -> tuple[float | None, bool, float | None]:
    """timeout_s, hard_stop and budget_usd (xp.studies.budget), checked."""
    for key in ("timeout_s", "budget_usd"):
        v = raw.get(key)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf):
            raise ConfigError(f"{where}: {key}={v!r}: must be a number > 0, or null")
    if not isinstance(raw.get("hard_stop", False), bool):
        raise ConfigError(f"{where}: hard_stop={raw['hard_stop']!r}: must be true or false")
    timeout_s, budget_usd = (None if raw.get(k) is None else float(raw[k]) for k in ("timeout_s", "budget_usd"))
    return timeout_s, raw.get("hard_stop", False), budget_usd


def _recipe_steps(ladder: Any, pretrain: Any, where: str) -> None:
    """A recipe's steps before its trials (xp.recipes), checked: batch_ladder, pretrain."""
    if ladder is not None and (not isinstance(ladder, int) or isinstance(ladder, bool) or ladder < 1):
        raise ConfigError(f"{where}: batch_ladder={ladder!r}: must be an integer >= 1 (the smallest batch of the "
                          "ladder up to batch=auto's largest)")
    if pretrain is not None:
        study_settings_of(pretrain, where, "pretrain")


def study_settings_of(given: Any, where: str, name: str = "settings") -> tuple[str, ...]:
    if not isinstance(given, (list, tuple)) or not all(isinstance(s, str) and "=" in s for s in given):
        raise ConfigError(f"{where}: {name}={given!r}: must be a list of KEY=VALUE overrides")
    return tuple(given)


def _claim(given: Any, where: str) -> dict[str, Any] | None:
    if given is None:
        return None
    given = dict(given) if hasattr(given, "items") else given
    if not isinstance(given, dict) or given.get("kind") not in CLAIM_KINDS:
        raise ConfigError(f"{where}: claim: needs kind (one of {', '.join(CLAIM_KINDS)})")
    figure = given.get("figure")
    if not isinstance(figure, (int, float)) or isinstance(figure, bool) or not isinstance(given.get("source"), str):
        raise ConfigError(f"{where}: claim: needs figure (the published number) and source (where it was published)")
    return given


def _objectives(given: Any, where: str, sampler: str, pruner: str, pruner_options: Any) -> list[Objective]:
    objectives = []
    for i, o in enumerate(given or [{"metric": "val_accuracy", "direction": "maximize"}]):
        if not isinstance(o, dict) or o.get("metric") not in METRICS or o.get("direction") not in ("maximize", "minimize"):
            raise ConfigError(f"{where}: objectives[{i}]={o!r}: needs metric (one of {', '.join(METRICS)}) "
                              "and direction (maximize or minimize)")
        objectives.append(Objective(o["metric"], o["direction"]))
    if len(objectives) > 1 and pruner not in ("none", "pareto"):
        raise ConfigError(f"{where}: pruner={pruner}: Optuna prunes single-objective studies only; with "
                          f"{len(objectives)} objectives use pruner: pareto (xp's, xp.studies.pruning) or none")
    if pruner == "pareto":  # (its objectives, each measured every epoch, and its options)
        pareto_rule([o.metric for o in objectives], dict(pruner_options or {}), where)
    if len(objectives) > 1 and sampler == "cmaes":
        raise ConfigError(f"{where}: sampler=cmaes optimises one objective; use nsga2 or tpe")
    return objectives


def _finite(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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
        if not (_finite(low) and _finite(high)):
            raise ConfigError(f"{at}: low and high must be numbers")
        if low > high:
            raise ConfigError(f"{at}: low={low} > high={high}")
        if log_scale and low <= 0:
            raise ConfigError(f"{at}: a log scale needs low > 0, got {low}")
        if p["type"] == "int" and not (float(low).is_integer() and float(high).is_integer()):
            raise ConfigError(f"{at}: an int parameter needs integer low and high")
        params.append(Param(pname, p["type"], low, high, log_scale))
    return params


def warm_from(raw: dict[str, Any], where: str) -> str | None:
    """A study file's warm_start: the earlier study's name, checked (None: a cold start)."""
    name = raw.get("warm_start")
    if name is None:
        return None
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}: warm_start={name!r}: the name of an earlier study in the same storage")
    if raw.get("search", "optuna") != "optuna" or raw.get("sampler") == "grid":
        raise ConfigError(f"{where}: warm_start={name}: seeds an Optuna sampler (search=optuna, not grid); this "
                          f"study's search is {raw.get('search', 'optuna')}, its sampler {raw.get('sampler', 'tpe')}")
    if name == raw.get("study_name"):
        raise ConfigError(f"{where}: warm_start={name}: that is this study; the same command continues it")
    return name.strip()
