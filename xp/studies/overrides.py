"""A study's part of the command line: a search space in Hydra's sweep syntax (`space_from_overrides`: KEY=a,b,
choice(...), range(...), interval(...), tag(log|int, ...)) and the single values that fix a searched key
(`fixed_overrides`, in xp.studies.study, which the spec is read with: the command line wins over the study file,
as Hydra's does)."""

from __future__ import annotations

from typing import Any

from xp.errors import ConfigError
from xp.studies.study import Param


def space_from_overrides(overrides: list[Any]) -> tuple[tuple[Param, ...], list[str]]:
    """A study's search space from Hydra's sweep syntax on the command line, and the other overrides:
    KEY=a,b / choice(a,b): categorical; range(start,stop[,step]): categorical over its values;
    interval(low,high): float; tag(log, interval(...)): log scale; tag(int, interval(...)): integer."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    params, rest = [], []
    for o in overrides:
        if not o.is_sweep_override() or o.key_or_group.startswith(("hydra", "sweep")):
            rest.append(o.input_line)
            continue
        key, at, sweep = o.key_or_group, o.input_line, o.value()  # keys are checked with the plan's (xp.cli)
        tags = set(getattr(sweep, "tags", ()) or ())
        if isinstance(sweep, IntervalSweep):
            if sweep.start is None or sweep.end is None:  # Hydra's grammar gives both
                raise ConfigError(f"{at}: an interval needs a low and a high")
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
