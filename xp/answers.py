"""A study's answer, written once: which settings are best (one tie-break rule), how sure (its confirmation across
seeds), where its weights came from (a population's schedule), what the question held fixed and how it changed.

Each search (xp.studies.search) derives its answer once, at the study's end, into an `Answer`. The study keeps it
in its storage (xp.studies.summary.keep) and on its parent MLflow run (best_trial.json, the
tags xp.best_*, the description); every view reads that record and derives nothing again: the console summary
(`lines`), the parent run (`description`, `tags`), the registry's `@best`, the UI link's pinned first row and
columns (xp.readback.view), and `xp.report`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial


FILE = "best_trial.json"  # the parent run's artifact holding it (a multi-objective study's: pareto_front.json)
FRONT_FILE = "pareto_front.json"
RULE = "a tie goes to the lowest trial number (the one proposed first)"


@dataclass
class Member:
    """A trial of the answer: the best, or a member of the Pareto front. `values` are its own run's figures."""
    trial: int
    values: dict[str, float]
    params: dict[str, Any]
    mlflow_run_id: str | None = None
    judged: str = ""  # how the search judged it where not by its own figures ("mean 0.9109 over 3 seeds")


@dataclass
class Answer:
    study: str
    search: str  # how it searched, in words ("tpe sampler, median pruner"; "population of 4 (pbt)")
    objectives: list[dict[str, str]]  # [{"metric", "direction"}], in the study's order
    best: list[Member]  # the best trial (a single objective) or the Pareto front; empty: no complete trial
    rule: str = ""  # how the best was chosen, with its tie-break
    ties: list[int] = field(default_factory=list)  # other trials whose figure equals the best's
    ranking: list[int] = field(default_factory=list)  # its candidates' trial numbers, best first, by its rule
    searched: list[str] = field(default_factory=list)  # the parameters it searched
    fixed: list[str] = field(default_factory=list)  # KEY=VALUE fixed on the command line (not searched)
    changes: list[str] = field(default_factory=list)  # how its question changed under continue_changed
    counts: dict[str, int] = field(default_factory=dict)  # its trials by how they ended (xp.studies.summary.counts)
    confirmed: list[dict[str, Any]] = field(default_factory=list)  # [{trial, params, values, mean, std}], best first
    verdict: str = ""  # whether the top two confirmed trials are within each other's noise
    schedule: list[dict[str, Any]] = field(default_factory=list)  # [{first, last, member, params}]: the best's weights
    lacking: list[str] = field(default_factory=list)  # what the answer lacks (members dropped)
    storage: str = ""  # where the study lives (its password left out)
    extra: dict[str, Any] = field(default_factory=dict)  # a search's own figures (a warm start's source)

    # --- the record --------------------------------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Answer:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["best"] = [Member(**m) for m in d.get("best") or []]
        return cls(**known)

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    @property
    def metric(self) -> str:
        return self.objectives[0]["metric"]

    @property
    def first(self) -> Member | None:
        """The study's best trial (None: no complete trial, or a Pareto front)."""
        return self.best[0] if self.best and not self.multi_objective else None

    @property
    def file(self) -> str:
        return FRONT_FILE if self.multi_objective else FILE

    # --- what every view says ---------------------------------------------------------------------------------
    def best_lines(self) -> list[str]:
        """`best trial: trial 3  val_accuracy=0.91  lr=0.01 ...` (the front's members, one a line)."""
        title = "Pareto front" if self.multi_objective else "best trial"
        out = []
        for m in self.best:
            out.append(f"{title}: trial {m.trial}  " + "  ".join(f"{k}={v:.4g}" for k, v in m.values.items())
                       + (f" (its own run; {m.judged})" if m.judged else "") + "  "
                       + " ".join(f"{k}={said(v)}" for k, v in m.params.items()))
        if self.ties:
            out.append(f"  tied with trial{'s' if len(self.ties) > 1 else ''} {', '.join(map(str, self.ties))} "
                       f"at {self.metric}: {RULE}")
        return out

    def schedule_line(self) -> str | None:
        """`its weights' schedule: epochs 1-4 (member 2) lr=0.02; epochs 5-10 (member 0) lr=0.016`."""
        if not self.schedule:
            return None
        return "its weights' schedule: " + "; ".join(
            f"epochs {s['first']}-{s['last']} (member {s['member']}) "
            + " ".join(f"{k}={said(v)}" for k, v in s["params"].items()) for s in self.schedule)

    def confirmation_lines(self) -> list[str]:
        if not self.confirmed:
            return []
        out = [f"confirmed across seeds: best by mean is {_line(self.confirmed[0], self.metric)}"]
        out += [f"  {_line(c, self.metric)}" for c in self.confirmed[1:]]
        return out + ([f"  {self.verdict}"] if self.verdict else [])

    def lines(self) -> list[str]:
        """The console summary after its counts line."""
        return [*self.changes, *self.best_lines(), *filter(None, [self.schedule_line()]), *self.lacking,
                *self.confirmation_lines()]

    def description(self, counts_line: str, versions: dict[int, str], register_model: str) -> str:
        """The parent run's description (its run page's Markdown)."""
        lines = [f"**Study `{self.study}`** ({self.search}): {counts_line}."
                 + (f" Fixed on the command line (not searched): {', '.join(self.fixed)}." if self.fixed else "")]
        lines += [f"- {c}" for c in self.changes]
        for m in self.best:
            version = versions.get(m.trial)
            model = f"models:/{register_model}/{version}" if version else None
            best = self.first is not None
            lines.append(f"- {'best trial' if best else 'Pareto member'}: **trial {m.trial}** "
                         + ", ".join(f"{k} = {v:.4g}" for k, v in m.values.items()) + "; "
                         + ", ".join(f"{k} = {said(v)}" for k, v in m.params.items())
                         + (f"; its run: `{m.mlflow_run_id}`" if m.mlflow_run_id else "")
                         + (f"; its model: `{model}`" + (f" (`models:/{register_model}@best`)" if best else "")
                            if model else ""))
        if self.ties:
            lines.append(f"- tied with trial{'s' if len(self.ties) > 1 else ''} {', '.join(map(str, self.ties))}: "
                         f"{RULE}")
        if self.schedule_line():
            lines.append(f"- The best member's {self.schedule_line()[4:]}")  # type: ignore[index]
        lines += [f"- {c}" for c in self.lacking]
        lines += [f"- {c.strip()}" for c in self.confirmation_lines()]
        return "\n".join(lines)

    def tags(self) -> dict[str, str]:
        """The parent run's tags that name the answer (a view finds it by these)."""
        first = self.first
        out = {"optuna.study": self.study, "xp.study.search": self.search,
               "xp.study.searched": ",".join(self.searched)}
        if first is not None:
            out.update({"xp.best_trial": str(first.trial), "xp.best_run_id": str(first.mlflow_run_id or "")})
        if self.changes:  # (the report says them beside its trials)
            out["xp.study.changes"] = "\n".join(self.changes)
        return out


def ranked(trials: list[Any], maximize: bool, value: Any = lambda t: t.values[0]) -> list[Any]:
    """Complete trials best first by `value`, with the one tie-break rule (RULE). Every search ranks through this."""
    scored = [t for t in trials if value(t) is not None and math.isfinite(value(t))]
    return sorted(scored, key=lambda t: ((-value(t) if maximize else value(t)), t.number))


def best_of(trials: list[Any], maximize: bool, value: Any = lambda t: t.values[0]) -> tuple[Any, list[Any]]:
    """The best of complete trials (`ranked`'s first), and the others tied with it."""
    order = ranked(trials, maximize, value)
    if not order:
        return None, []
    return order[0], [t for t in order[1:] if value(t) == value(order[0])]


def member(trial: FrozenTrial, metrics: list[str]) -> Member:
    """An Optuna trial as a member of the answer (its own figures)."""
    return Member(trial.number, dict(zip(metrics, trial.values)), dict(trial.params),
                  trial.user_attrs.get("mlflow_run_id"))


def said(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _line(c: dict[str, Any], metric: str) -> str:
    spread = f" +- {c['std']:.4f} (std), {min(c['values']):.4f} - {max(c['values']):.4f}" if c.get(
        "std") is not None else ""
    return f"trial {c['trial']}: {metric} {c['mean']:.4f}{spread} over {len(c['values'])} seeds"
