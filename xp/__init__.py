"""xp: run, sweep and compare data-parallel training experiments.

Importing xp is cheap on purpose: mxnet, gluoncv and mlflow are imported
inside the functions that need them, so `python -m xp --help` stays fast.
"""

__version__ = "0.1.0"
