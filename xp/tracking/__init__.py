"""Tracking: MLflow runs and their stores (`tracker.py`), the write-ahead spool that keeps training from
waiting on the store (`spool.py`, `sync.py`), a run's creation and records written to SQLite as rows
(`rows.py`), opening and checking stores (`stores.py`, `storefile.py`), and
finding what an interrupted sweep already ran (`sweepstate.py`).

May import: xp.errors only (MLflow itself inside functions).
"""
