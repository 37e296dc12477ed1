"""Tracking: how a record reaches MLflow. A run (`tracker.py`) appends its records to its spool file and one
Drain delivers them (`spool.py`): in the tracking service for a SQLite store (`service.py`, the run's side;
`daemon.py`, the service's process; `messages.py`, what they say), else in the run's own process; what a gone
process left is delivered by the next command on the store (`leftovers.py`). Stores opened and checked
(`stores.py`), a SQLite store's rows written in one transaction under a tested MLflow (`rows.py`, `gate.py`).

May import: xp.errors, xp.states, xp.wire, xp.storefiles (MLflow itself inside functions).
"""
