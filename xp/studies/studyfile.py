"""A study file as Hydra's config group `sweep` holds it: its fields typed (StudyConf), each file an option of the
group (register). What the fields mean and how they are checked: xp.studies.study."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from xp import shipped

SWEEPS_DIR = Path(os.environ.get("XP_SWEEPS_DIR") or shipped("sweeps"))

@dataclass
class StudyConf:
    """A study, as the config group `sweep` holds it: `sweep=NAME` selects sweeps/NAME.yaml (or NAME.yaml in a
    `sweep/` folder of the user's config directory), and every field is an override (sweep.n_trials=50)."""
    name: str = ""  # the option's name (set by xp: the file's name)
    study_name: str | None = None  # Optuna study name (default: name); the same name continues the study
    storage: str | None = None  # RDB URL, journal:///FILE; null: sqlite:///mlruns/optuna.db ($XP_OPTUNA_STORAGE)
    n_trials: int = 20  # trial budget (finished trials count, also from earlier runs)
    timeout_s: float | None = None  # time budget: no trial starts after the study has run this long, seconds
    hard_stop: bool = False  # at the time (or money) budget, the trials in flight stop too (else they finish)
    budget_usd: float | None = None  # money budget: no trial starts that would end past it (hardware's price)
    register_model: str | None = None  # the Model Registry name its best trial's model goes under (null: the
    # study's name; none: not registered)
    parallel: int | None = None  # trials in flight at once; null: one per slot (a trial's GPUs, or a core)
    trials_per_gpu: int = 1  # trials packed on each GPU (small models)
    scheduler: str = "slots"  # slots: a trial in flight on every slot; hydra: batches of `parallel` via Hydra's launcher
    sampler: str = "tpe"  # tpe | random | grid | gp | nsga2 | cmaes
    sampler_seed: int | None = None  # the sampler's seed (null = random)
    pruner: str = "median"  # none | median | hyperband | successive_halving | pareto (two or more objectives)
    pruner_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    objectives: list[Any] | None = None  # [{metric, direction}]; null: maximize val_accuracy
    params: dict[str, Any] = dataclasses.field(default_factory=dict)  # search space (also KEY=interval(...) ...)
    heartbeat_s: int = 30  # the sweeper's heartbeat for each trial in flight, seconds
    grace_s: int | None = None  # a trial silent this long lost its sweeper (null: 4 x heartbeat_s)
    max_retry: int = 2  # times a lost trial is retried with the same parameters
    settings: list[str] = dataclasses.field(default_factory=list)  # a recipe: KEY=VALUE overrides of every trial
    claim: dict[str, Any] | None = None  # a recipe: the published figure the report measures (kind, source, ...)
    batch_ladder: int | None = None  # a recipe: trials at batch N, 2N, 4N ... up to batch=auto's largest (preflight)
    pretrain: list[str] | None = None  # a recipe: one run before the trials (these overrides); they start from its weights or none
    continue_changed: bool = False  # continue a study whose fixed settings (model, data, epochs, space...) this
    # command changes, the change recorded in it (else such a command is refused: xp.studies.question)
    confirm: int = 0  # after its trials, retrain its best ones with this many other seeds (seed+1...); its answer is
    # then the best by mean, with its spread (0: the best of one draw, as Optuna's)
    confirm_top: int = 3  # how many of its best trials sweep.confirm retrains
    search: str = "optuna"  # optuna: its sampler proposes each trial | pbt: population-based training (pbt:)
    pbt: dict[str, Any] | None = None  # search=pbt: population, interval (epochs), quantile, explore (pbtspec)
    warm_start: str | None = None  # an earlier study (same storage) whose finished trials in this space seed the
    # sampler; they never count in this study's budget or answer (xp.studies.warm)


FIELDS = tuple(f.name for f in dataclasses.fields(StudyConf))


def register(names_only: bool = False, typed: Iterable[str] | None = None) -> None:
    """Offer every study file as an option of the config group `sweep` (typed by StudyConf; a file that does not
    fit is offered as it is: selecting it fails with spec_from's one line). `names_only`: for a bare --help, which
    lists the options (Hydra copies the store for each group it lists: the typed studies cost 0.9 s). `typed`:
    only these are typed, the others offered by name (a command that chooses no study: 0.2 s of its start-up)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    store = ConfigStore.instance()
    typed = None if typed is None else set(typed)
    for path in sorted(SWEEPS_DIR.glob("*.yaml")):
        if names_only or (typed is not None and path.stem not in typed):
            store.store(group="sweep", name=path.stem, node={"name": path.stem})
            continue
        try:
            raw = yaml.safe_load(path.read_text()) or {}
            node = OmegaConf.merge(OmegaConf.structured(StudyConf), {**raw, "name": path.stem})
        except Exception:
            node = OmegaConf.create({"name": path.stem, "_unreadable": str(path)})
        store.store(group="sweep", name=path.stem, node=node)


