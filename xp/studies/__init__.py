"""Studies: Optuna searches over runs (`study.py`: the study's settings and storage; `trial.py`: a trial's
storage, sampler and pruner; `sweeper.py`: the Hydra sweeper that asks and tells; `scheduler.py`: trials kept in flight on slots, the
one writer to the study's storage; `channel.py`: its messages to and from its workers, and the inbox it waits on). The run's side of a trial (reporting, pruning) is a callback in xp.run;
the slots and their worker processes are launching's (xp.launching.slots, pool, trialworker).

May import: xp.errors, xp.tracking.
"""
