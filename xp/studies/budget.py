"""A study's budgets in time and money: `sweep.timeout_s` (no trial starts after the study has run that long;
with `sweep.hard_stop=true` the trials in flight are stopped then too) and `sweep.budget_usd` (no trial starts
that would end past it). What counts is the study's wall time while it holds its machines, from its command's
start to its end, summed over the commands that ran it (kept in the study: user attributes xp.spent_s and
xp.spent_usd, so a resumed study counts what it spent), and its cost: that time at the hardware's hourly price
(`hardware`, `pricing`) x the hosts its slots are on (one machine: 1). A run's own cost_usd is the same price
over its own time; the study's figure is what its machines cost, idle moments between trials included."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from xp.errors import ConfigError
from xp.states import TrialState

LASTED = (TrialState.COMPLETE, TrialState.PRUNED)  # the trials whose time says how long one lasts

log = logging.getLogger("xp")

SPENT_S, SPENT_USD = "xp.spent_s", "xp.spent_usd"
SAVE_EVERY_S = 5.0  # how often what was spent is written to the study while it runs (and at its end)


def hourly_price(config: Any) -> float:
    """USD per instance-hour of the study's trials (the composed config's hardware and pricing: as
    xp.run.plan.HardwareSpec.hourly reads them; studies sit below xp.run, and this config is not checked yet)."""
    hardware = config.get("hardware") or {}
    if config.get("pricing") == "spot" and hardware.get("spot_price_per_hour") is not None:
        return float(hardware["spot_price_per_hour"])
    return float(hardware.get("price_per_hour") or 0.0)


def check_budget(spec: Any, config: dict[str, Any], here: bool) -> None:
    """Before anything starts: a money budget needs a price; budgets are kept on this machine or a launcher's
    hosts (`here`), not by a cluster's Hydra launcher (submitit), whose jobs hold their own. One line each."""
    if spec.timeout_s is None and spec.budget_usd is None:
        return
    if not here:
        raise ConfigError("sweep.timeout_s and sweep.budget_usd: a study on xp's slots (any launcher=), not in "
                          "batches of a cluster's Hydra launcher (its jobs hold allocations of their own)")
    if spec.budget_usd is not None and hourly_price(config) <= 0:
        name = (config.get("hardware") or {}).get("name")
        raise ConfigError(f"sweep.budget_usd={spec.budget_usd:g}: hardware={name} has no price; choose an instance "
                          "(hardware=p3.2xlarge) or set hardware.price_per_hour=USD")


def command_start() -> float:
    """When this process (the study's command) started, on the monotonic clock: its budget counts from there, not
    from the moment the study was opened (on a loaded machine composing and opening it took seconds, which the
    budget did not count: trials started past sweep.timeout_s after the command began)."""
    import psutil

    return time.monotonic() - max(0.0, time.time() - psutil.Process().create_time())


@dataclass
class Budget:
    study: Any
    timeout_s: float | None
    budget_usd: float | None
    hard_stop: bool
    usd_per_s: float  # what the study's machines cost a second while it runs
    before_s: float = 0.0  # spent by the commands that ran it before this one
    before_usd: float = 0.0
    typical_s: float = 0.0  # how long the study's trials have lasted (its finished ones, mean): a new command's guess
    started: float = field(default_factory=lambda: command_start())
    saved: float = 0.0

    @classmethod
    def of(cls, spec: Any, study: Any, config: Any, hosts: int) -> Budget | None:
        """The study's budget (None: it has none), counting what earlier commands spent (check_budget said
        whether it can be kept)."""
        if spec.timeout_s is None and spec.budget_usd is None:
            return None
        usd_per_s = hourly_price(config) * hosts / 3600.0
        attrs, lasted = study.user_attrs, [(t.datetime_complete - t.datetime_start).total_seconds()
                                           for t in study.get_trials(deepcopy=False)
                                           if t.state.name in LASTED and t.datetime_start
                                           and t.datetime_complete]
        return cls(study, spec.timeout_s, spec.budget_usd, spec.hard_stop, usd_per_s,
                   float(attrs.get(SPENT_S, 0.0)), float(attrs.get(SPENT_USD, 0.0)),
                   sum(lasted) / len(lasted) if lasted else 0.0)

    def spent_s(self) -> float:
        return self.before_s + time.monotonic() - self.started

    def spent_usd(self) -> float:
        return self.before_usd + (time.monotonic() - self.started) * self.usd_per_s

    def refuses(self, trial_s: float) -> str | None:
        """Why no trial (expected to last trial_s, from this command's trials so far; none yet: as the study's
        have) may start now; None: one may."""
        trial_s = trial_s or self.typical_s
        if self.timeout_s is not None and self.spent_s() >= self.timeout_s:
            return f"its time budget is spent ({self.spent_s():.0f} s of sweep.timeout_s={self.timeout_s:g})"
        if self.budget_usd is not None and self.spent_usd() + trial_s * self.usd_per_s > self.budget_usd:
            return (f"its money budget would not cover another trial (${self.spent_usd():.4f} spent, about "
                    f"${trial_s * self.usd_per_s:.4f} a trial, sweep.budget_usd={self.budget_usd:g})")
        return None

    def stops_now(self) -> str | None:
        """sweep.hard_stop=true: why the trials in flight stop now (None: they go on)."""
        if not self.hard_stop:
            return None
        if self.timeout_s is not None and self.spent_s() >= self.timeout_s:
            return f"stopped at its time budget (sweep.timeout_s={self.timeout_s:g})"
        if self.budget_usd is not None and self.spent_usd() >= self.budget_usd:
            return f"stopped at its money budget (sweep.budget_usd={self.budget_usd:g})"
        return None

    def line(self) -> str:
        """What it has spent of what, for the study's lines."""
        parts = [f"{self.spent_s():.0f} s" + (f" of {self.timeout_s:g} s" if self.timeout_s is not None else "")]
        if self.usd_per_s > 0:
            parts.append(f"${self.spent_usd():.4f}" + (f" of ${self.budget_usd:g}" if self.budget_usd is not None
                                                        else ""))
        return ", ".join(parts)

    def save(self, force: bool = False) -> None:
        """Record what the study has spent in it (every SAVE_EVERY_S at most, unless forced)."""
        if force or time.monotonic() - self.saved >= SAVE_EVERY_S:
            self.saved = time.monotonic()
            try:
                self.study.set_user_attr(SPENT_S, round(self.spent_s(), 3))
                self.study.set_user_attr(SPENT_USD, round(self.spent_usd(), 6))
            except Exception as e:  # the storage is away: counted again next time (a resume may count less)
                log.warning(f"study: what it spent could not be recorded ({type(e).__name__})")
