"""The report's Markdown tables, and the settings a set of runs varied (shown as columns of its tables)."""

from __future__ import annotations

from typing import Any

from xp.results import num

Column = tuple[str, str, str]  # (row key, header, format)

# xp's one cost (xp.run.callbacks.CostMeter, MLflow's cost_usd): every table, plot and claim shows this figure
COST: Column = ("cost_usd", "cost (billed)", "${:.4f}")
COST_NOTE = ("cost (billed): the instance time billed from each job's start (start-up, evaluation and an elastic "
             "job's relaunches included) x its instances (an elastic run's workers) x the price of each moment "
             "(a spot trace's, where it has one): MLflow's cost_usd, the same figure in every table, plot and claim.")


def md_table(rows: list[dict[str, Any]], columns: list[Column]) -> str:
    head = "| " + " | ".join(t for _, t, _ in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join("-" if r.get(k) is None else f.format(r[k]) for k, _, f in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def varying(rows: list[dict[str, Any]], leave_out: tuple[str, ...] = ()) -> list[str]:
    """The settings whose values differ between these runs (what a sweep or study varied), less those that cannot
    change a result (as conf/ declares them: where a run committed, what it logged; a PBT interval's resume=)."""
    from xp.studies.question import never_asks

    keys = sorted(k for k in {k for r in rows for k in r["settings"]} - set(leave_out) if not never_asks(k))
    return [k for k in keys if len({r["settings"].get(k) for r in rows}) > 1]


def swept_columns(rows: list[dict[str, Any]], leave_out: tuple[str, ...] = ()) -> list[Column]:
    """Columns for the settings these runs varied (seeds aside, unless only seeds varied), each row's value
    written short (0.02504 for 0.02504130762999893)."""
    swept = [k for k in (varying(rows, ("seed",)) or varying(rows)) if k not in leave_out]
    for r in rows:
        r.update({f"swept:{k}": short(r["settings"].get(k)) for k in swept})
    return [(f"swept:{k}", k, "{}") for k in swept]


def short(value: Any) -> Any:
    """A setting as a table shows it: 0.02504 for 0.02504130762999893; other values as given."""
    number = num(value)
    return value if number is None or str(value).lstrip("-").isdigit() else f"{number:.4g}"
