"""What `sweep.search=pbt` asks, read from a study file and checked (xp.studies.pbt trains it): the population's
size, its interval in epochs, the quantile that exploits and each searched key's explore rule; and what the
population needs of its experiment and budget. Bad input is one line (ConfigError)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xp.errors import ConfigError

SEARCHES = ("optuna", "pbt")
FACTORS = (0.8, 1.2)  # a float's or an int's default explore: times one of these (Ray Tune's default)
RESAMPLE = 0.25  # ... or, this often, a fresh draw from the space


@dataclass(frozen=True)
class Explore:
    """How a member that exploited changes one hyperparameter: a fresh draw from the space with probability
    `resample`, else times one of `factors` (a number) or a neighbouring choice (a categorical)."""
    name: str
    factors: tuple[float, ...] = FACTORS
    resample: float = RESAMPLE


@dataclass(frozen=True)
class PbtSpec:
    population: int  # members training at once
    interval: int  # epochs between two exploit decisions
    quantile: float  # the worst this fraction copy the best this fraction
    explore: tuple[Explore, ...]  # one per searched parameter


def pbt_from(study: dict[str, Any], params: list[Any] | None, fixed: tuple[str, ...], where: str,
             scheduler: str = "slots") -> PbtSpec | None:
    """The PBT settings of a study's fields (search=pbt), checked; None for an Optuna search. A rule for a key
    the study does not search (or that the command line fixed) is one line. params None: a trial's view (it
    needs to know it is a member, not how members explore)."""
    search, raw = study.get("search", "optuna"), study.get("pbt")
    if search not in SEARCHES:
        raise ConfigError(f"{where}: search={search!r}: unknown; valid: {', '.join(SEARCHES)}")
    if search != "pbt":
        if raw:
            raise ConfigError(f"{where}: pbt: settings for search=pbt, and this study's search is {search}")
        return None
    raw = dict(raw or {})
    if unknown := set(raw) - {"population", "interval", "quantile", "explore"}:
        raise ConfigError(f"{where}: pbt: unknown field(s) {', '.join(sorted(unknown))} (population, interval, "
                          "quantile, explore)")
    population, interval, quantile = raw.get("population", 4), raw.get("interval", 1), raw.get("quantile", 0.25)
    for key, v in (("population", population), ("interval", interval)):
        if not isinstance(v, int) or isinstance(v, bool) or v < (2 if key == "population" else 1):
            raise ConfigError(f"{where}: pbt.{key}={v!r}: must be an integer >= {2 if key == 'population' else 1}")
    if not isinstance(quantile, (int, float)) or isinstance(quantile, bool) or not 0 < quantile <= 0.5:
        raise ConfigError(f"{where}: pbt.quantile={quantile!r}: must be a fraction in (0, 0.5] (the worst this "
                          "fraction copy the best this fraction)")
    if len(study.get("objectives") or [1]) > 1 or study.get("confirm") or study.get("sampler") == "grid":
        raise ConfigError(f"{where}: search=pbt: one objective, no confirm and no grid (a member's answer is its "
                          "schedule, which another seed or a grid does not retrain)")
    if scheduler == "hydra":
        raise ConfigError(f"{where}: search=pbt runs on xp's slots (scheduler: slots), not in Hydra's batches")
    if params is None:
        return PbtSpec(population, interval, float(quantile), ())
    searched = {p.name: p for p in params}
    rules = dict(raw.get("explore") or {})
    for key in rules:
        if key not in searched:
            said = next((f for f in fixed if f.partition("=")[0] == key), None)
            raise ConfigError(f"{where}: pbt.explore.{key}: " + (f"{said} on the command line fixed it: a fixed key "
                              "is not explored" if said else f"the study does not search {key} (it searches "
                              f"{', '.join(searched) or 'nothing'})"))
    return PbtSpec(population, interval, float(quantile),
                   tuple(_rule(p, rules.get(p.name), where) for p in params))


def _rule(param: Any, raw: Any, where: str) -> Explore:
    raw = dict(raw or {})
    if unknown := set(raw) - {"factors", "resample"}:
        raise ConfigError(f"{where}: pbt.explore.{param.name}: unknown field(s) {', '.join(sorted(unknown))} "
                          "(factors, resample)")
    factors, resample = raw.get("factors", list(FACTORS)), raw.get("resample", RESAMPLE)
    if param.kind == "categorical" and "factors" in raw:
        raise ConfigError(f"{where}: pbt.explore.{param.name}.factors: a categorical moves to a neighbouring "
                          "choice, it is not multiplied")
    if not isinstance(factors, list) or not factors or \
            not all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in factors):
        raise ConfigError(f"{where}: pbt.explore.{param.name}.factors={factors!r}: a list of positive numbers")
    if not isinstance(resample, (int, float)) or isinstance(resample, bool) or not 0 <= resample <= 1:
        raise ConfigError(f"{where}: pbt.explore.{param.name}.resample={resample!r}: a probability in [0, 1]")
    return Explore(param.name, tuple(float(f) for f in factors), float(resample))


def check_run(pbt: PbtSpec, epochs: Any, n_trials: int, where: str) -> None:
    """What a population needs of its experiment and budget (n_trials: intervals trained in all)."""
    if not isinstance(epochs, int) or pbt.interval > epochs:
        raise ConfigError(f"{where}: pbt.interval={pbt.interval} is longer than the experiment's epochs={epochs}: "
                          "no member would ever exploit")
    if pbt.population > n_trials:
        raise ConfigError(f"{where}: pbt.population={pbt.population} is larger than the budget of n_trials="
                          f"{n_trials} intervals: not every member would train once")
