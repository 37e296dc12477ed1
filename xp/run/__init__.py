"""The run core: one experiment from its config to its metrics.

Owns the plan (`plan.py`: the config checked and derived; `backend_plan.py`: the config's backend and its
plan, built once per process), the training loop and its state (`train.py`), what the run's MLflow run opens
and ends with (`record.py`), the backend interface and the plugins' entry-point groups (`backend.py`,
`entry_points.py`), the callbacks that measure and log (`callbacks.py`, `telemetry.py`), commits and resume (`checkpoint.py`), and the worker's side
of a launched job (`worker.py`). `experiment.py` puts them together for one process.

May import: xp.errors, xp.data, xp.tracking, xp.studies (a run that is a trial reports to its study).
Never launching or report.
"""
