"""Reporting: the sweep's table (`summary.py`), the seeds' comparison report (`build.py`, `python -m xp.report`)
and its plots (`plots.py`).

May import: xp.errors, xp.tracking.
"""
