"""xp: run, sweep and compare data-parallel training experiments.

Importing xp is cheap on purpose: mxnet, gluoncv and mlflow are imported
inside the functions that need them, so `python -m xp --help` stays fast.
"""

__version__ = "0.1.0"


def shipped(name: str):
    """xp's own config folders (conf, sweeps): inside the package when installed from a wheel (package data),
    beside it in a checkout."""
    from pathlib import Path

    here = Path(__file__).resolve().parent
    return here / name if (here / name).is_dir() else here.parent / name
