"""What `pruner: pareto` asks, read from a study file and checked (xp.studies.pruning applies it): the rule's
start-up, warm-up and dominators, and objectives that a run measures every epoch. Bad input is one line
(ConfigError)."""

from __future__ import annotations

import dataclasses
from typing import Any

from xp.errors import ConfigError

# objectives a run measures every epoch, and their names among an epoch's metrics
PER_EPOCH = {"val_accuracy": "val_accuracy", "throughput": "throughput_samples_per_s", "cost_usd": "cost_usd",
             "epoch_time_s": "epoch_time_s"}


@dataclasses.dataclass(frozen=True)
class Pareto:
    n_startup_trials: int = 4
    n_warmup_steps: int = 1
    min_dominators: int = 2


def pareto_rule(metrics: list[str], pruner_options: dict[str, Any], where: str) -> Pareto:
    """A study file's Pareto rule (its objectives' metrics, its pruner_options), checked: two or more objectives,
    each measured every epoch, and the rule's options."""
    if len(metrics) < 2:
        raise ConfigError(f"{where}: pruner=pareto compares two or more objectives; this study has one "
                          f"({metrics[0]}): use median, hyperband or successive_halving")
    late = [m for m in metrics if m not in PER_EPOCH]
    if late:
        raise ConfigError(f"{where}: pruner=pareto needs each objective every epoch; {', '.join(late)} is known only "
                          f"at a run's end (objectives a run measures every epoch: {', '.join(PER_EPOCH)})")
    options = dict(pruner_options)
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(Pareto)})
    least = {"n_warmup_steps": 0}  # (the others: at least 1)
    bad = [k for k, v in options.items() if not isinstance(v, int) or isinstance(v, bool) or v < least.get(k, 1)]
    if unknown or bad:
        raise ConfigError(f"{where}: pruner_options {', '.join(unknown + bad)}: the Pareto rule takes "
                          "n_startup_trials, n_warmup_steps and min_dominators (whole numbers, at least 1; warm-up 0)")
    return Pareto(**options)
