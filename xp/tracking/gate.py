"""MLflow's private API, used only with the MLflow versions CI tests it with (TESTED).

xp writes a run's creation and its batches of records as rows on SQLite (xp.tracking.rows: MLflow's ORM classes,
sessions and validators), seeds a new SQLite store's schema with MLflow's own `_initialize_tables`, and lets a
long-lived process forget a store MLflow caches. Each of those needs MLflow's internals to be what the tests held
them to; under another MLflow they take the public path (MlflowClient's calls; a store made by MLflow's own first
open), said in one line once a process ($XP_MLFLOW_PUBLIC=1 takes the public path quietly under any version: CI
runs the tracking tests so). constraints.txt names the MLflow CI tests; pyproject.toml allows a range of 3.x.
"""

from __future__ import annotations

import functools
import logging
import os

log = logging.getLogger("xp")

TESTED = ("3.17.2",)  # MLflow versions CI runs xp's private uses of it with (tests/test_rows.py and the rest)
PUBLIC_ENV = "XP_MLFLOW_PUBLIC"  # 1: the public path whatever the version (CI runs the tracking tests so too)


def public_only() -> bool:
    """Whether this process was told to use MLflow's public API only (PUBLIC_ENV)."""
    return os.environ.get(PUBLIC_ENV) == "1"


@functools.lru_cache(maxsize=1)
def private_ok() -> bool:
    """Whether this process's MLflow is one xp's uses of its internals were tested with; if not, one line."""
    import mlflow

    if public_only():
        return False
    if mlflow.__version__ in TESTED:
        return True
    log.warning(f"xp: MLflow {mlflow.__version__} is not one xp was tested with ({', '.join(TESTED)}): its runs are "
                "written through MLflow's public API (slower on SQLite stores)")
    return False
