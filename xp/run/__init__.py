"""The run core: one experiment from its config to its metrics.

Owns the plan (`plan.py`: the config checked and derived; `planning.py`: built once per process, by its
backend), the training loop and its state (`train.py`), what the run's MLflow run opens and ends with
(`record.py`), the backend interface and its registry (`backend.py`, `registry.py`), the callbacks that
measure and log (`callbacks.py`, `telemetry.py`), commits and resume (`checkpoint.py`), and the worker's side
of a launched job (`worker.py`). `experiment.py` puts them together for one process.

May import: xp.errors, xp.data, xp.tracking, xp.studies (a run that is a trial reports to its study).
Never launching or report.
"""
