"""Studies: Optuna searches over runs (`study.py`: the study's settings and storage; `trial.py`: a trial's
storage, sampler and pruner; `sweeper.py`: the Hydra sweeper that asks and tells). The run's side of a trial
(reporting, pruning) is a callback in xp.run.

May import: xp.errors, xp.tracking.
"""
