"""Launching: where a run's processes go and how they get there.

Owns the `Launcher` interface and its registry (`launcher.py`: local, ssh, slurm; more through the entry-point
group `xp.launchers`), the transports that reach hosts and probing and reaping them (`hosts.py`, `remote.py`,
`slurm.py`), the engines' interface (`engine.py`: ps-lite, Horovod and torchrun implement it beside their
frameworks), the job that starts and watches the processes (`job.py`), elastic membership (`elastic.py`), and a
study's placement (`placement.py`: decided once, handed to its sweeper), its slots and their long-lived workers
(`slots.py`, `pool.py`, `trialworker.py`).

May import: xp.errors, xp.run (the plan, the worker's variables), xp.tracking, xp.studies (a trial's channel to
its scheduler). Never report.
"""
