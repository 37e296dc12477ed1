"""A sweep's or a study's comparison, as MLflow's UI shows it: a shared view of the experiment's runs page.

MLflow's UI (3.x) opens an experiment's runs page from a view someone shared: an experiment tag
`mlflow.sharedViewState.KEY` holding the page's state as JSON, opened by `?viewStateShareKey=KEY` in the page's
address. xp writes one per sweep or study: the runs of its parent only (a study's: every trial of the study),
sorted by the objective, with the objective(s), a study's trial state and the searched parameters as the table's
columns. The printed UI link opens it as a table; without it the page opens on every run of the experiment, no
parameter or metric column shown.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("xp")

SHARED = "mlflow.sharedViewState."  # the experiment tag's prefix MLflow's UI reads
RANK = "xp.rank"  # a study's trial run's tag: its place in the study's answer (00000: the best), ordered as text
MAX_TAG = 5000  # the characters an experiment tag's value may hold in every store MLflow has


def column(kind: str, key: str) -> str:
    """A runs-table column as MLflow's UI names it: params.`lr`, metrics.`val_accuracy`."""
    return f"{kind}.`{key}`"


def state(parent_run_id: str, name: str, params: list[str], metrics: list[str],
          study: str | None = None, last_epoch: int | None = None, ranked: bool = False,
          confirmed: bool = False) -> dict[str, Any]:
    """The runs page's state: this parent's runs (a study's: every trial of the study, whichever command ran it;
    a confirmed study's: and the runs that retrained its best with other seeds), the study's answer first (its
    trials' runs ordered by their rank in its answer, `ranked`: xp.answers; MLflow's shared views drop
    pinned rows), else best first, the metrics and
    parameters as columns (a study's: and each trial's state, so a pruned trial, whose objective is a partial one,
    is told from a complete one). A population's (last_epoch: the latest epoch its members reached): its intervals
    that ended there only, the candidates of its answer (an interval that ended earlier scores at fewer epochs),
    with each one's member and whose weights it took. No chart: MLflow draws parallel coordinates in a card too
    narrow to read, its labels run together, log-searched parameters on a linear axis; the study's report
    (report/report.html on its parent run) draws them readably."""
    state_column = [column("tags", "optuna.trial_state")] if study else []
    where = f"tags.`optuna.study` = '{study}'" if study else f"tags.`mlflow.parentRunId` = '{parent_run_id}'"
    where += f" and tags.`{RANK}` LIKE '%'" if ranked else ""  # (its trials' runs: not the parent's own)
    if study and confirmed:  # (its trials and its confirming runs: the study they answer for, xp.run.record)
        where = f"tags.`xp.study` = '{study}'"
        state_column += [column("tags", "optuna.study"), column("params", "seed")]
    if last_epoch is not None:
        where += f" and tags.`xp.pbt.epochs` LIKE '%-{last_epoch}'"
        state_column += [column("tags", f"xp.pbt.{t}") for t in ("member", "epochs", "from_trial", "donor_member")]
    return {"searchFilter": where,  # (the study's ranking, where it wrote one: its answer first, then by its rule)
            "orderByKey": column("tags", RANK) if ranked else column("metrics", metrics[0]), "orderByAsc": ranked,
            "startTime": "ALL",
            "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
            "selectedColumns": [*state_column, *(column("metrics", m) for m in metrics),
                                *(column("params", p) for p in params)],
            "runsHiddenMode": "SHOW_ALL"}


def share(client: Any, experiment_id: str, parent_run_id: str, name: str, params: list[str],
          metrics: list[str], study: str | None = None, last_epoch: int | None = None,
          ranked: bool = False, confirmed: bool = False) -> str | None:
    """Write the view of a parent's runs on its experiment; its key (None if it cannot be written: the printed
    link then opens the parent's page, as before)."""
    if not params or not metrics:
        return None
    key = f"xp-{parent_run_id}"
    value = json.dumps(state(parent_run_id, name, params, metrics, study, last_epoch, ranked, confirmed),
                       separators=(",", ":"))
    if len(value) > MAX_TAG:
        return None
    try:
        client.set_experiment_tag(experiment_id, SHARED + key, value)
    except Exception as e:  # the store went away: the link to the parent's page stands
        from xp.errors import one_line

        log.debug("the UI's view of %s not written: %s", parent_run_id, one_line(e))
        return None
    return key


def view_page(experiment_id: str, key: str) -> str:
    """The experiment's runs page in that view (a path after the UI's address), in MLflow's Model training view,
    as a table (its chart mode cuts run names short and draws parallel coordinates too narrow to read)."""
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={key}&compareRunsMode=TABLE&" \
           "workflowType=machine_learning"


UI_URL = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default


def run_url_hint(uri: str, experiment_id: str | None = None, run_id: str | None = None) -> str:
    """How to look at a run: the `mlflow ui` of the environment xp runs in (its path as the user would type it:
    relative inside the current folder, e.g. .venv/bin/mlflow in a checkout) and the run's page, or the page on
    the tracking server. The page asks for MLflow's Model training view: the UI (3.x) opens in its GenAI view
    (Traces, Evaluations) otherwise."""
    import sys

    where = "/" + page(experiment_id, run_id) if experiment_id and run_id else ""
    if not uri.startswith("sqlite:///"):
        return uri.rstrip("/") + where if where and uri.startswith(("http://", "https://")) else f"MLFLOW_TRACKING_URI={uri}"
    exe = Path(sys.executable).parent / "mlflow"
    program = typed(exe) if exe.is_file() else f"{typed(Path(sys.executable))} -m mlflow"
    return f"{program} ui --backend-store-uri {uri}" + (f", then {UI_URL}{where}" if where else "")


def typed(program: Path) -> str:
    """A program of the environment xp runs in, as the user would type it: relative inside the current folder
    (.venv/bin/python in a checkout), else its whole path."""
    try:
        return str(program.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(program)


def page(experiment_id: str | None, run_id: str) -> str:
    """A run's page in the MLflow UI (a path after the UI's address), in MLflow's Model training view: the UI
    (3.x) opens in its GenAI view (Traces, Evaluations) otherwise."""
    return f"#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"
