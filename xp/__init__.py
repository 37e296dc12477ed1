"""xp: run, sweep and compare data-parallel training experiments.

Importing xp is cheap on purpose: mxnet, gluoncv and mlflow are imported
inside the functions that need them, so `python -m xp --help` stays fast.
"""

import os

__version__ = "0.1.0"

# MLflow 3 starts usage telemetry as it is imported: a thread that asks a server for its settings and one that
# sends events, in every process that logs (a run, each of a study's workers). xp's processes go without it
# (no network needed, less CPU at start-up); MLFLOW_DISABLE_TELEMETRY=false keeps it.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def shipped(name: str):
    """xp's own config folders (conf, sweeps): inside the package when installed from a wheel (package data),
    beside it in a checkout."""
    from pathlib import Path

    here = Path(__file__).resolve().parent
    return here / name if (here / name).is_dir() else here.parent / name
