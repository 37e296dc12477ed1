"""What xp knows of Hydra's own launcher plugins (hydra/launcher=NAME), which some users choose for a sweep
instead of xp's launchers: which run a sweep's jobs on this machine (its study's trials then go to xp's slots),
which on a cluster's nodes (every store must be one those nodes reach), and how many jobs a parallel one runs
at once. The rest of xp asks here instead of matching their names."""

from __future__ import annotations

from typing import Any

ELSEWHERE = "submitit"  # hydra/launcher=submitit_*: each job is a job of submitit's executor
CLUSTER = "submitit_slurm"  # ... on a Slurm cluster's nodes


def chosen(argv: list[str]) -> str:
    """The Hydra launcher the command line picks ("": Hydra's default, which runs jobs here)."""
    return next((a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("hydra/launcher=")), "")


def runs_jobs_here(name: str) -> bool:
    """The Hydra launcher of this name ("": Hydra's default) runs jobs on this machine."""
    return name in ("", "basic", "joblib")


def runs_elsewhere(name: str) -> bool:
    """Jobs of this Hydra launcher run outside this process's reach: a study's trials are its jobs, in batches."""
    return name.startswith(ELSEWHERE)


def at_once(launcher_config: Any) -> int | None:
    """Jobs a parallel Hydra launcher runs at once (hydra.launcher.n_jobs; -1: a core each), or None."""
    import os

    n_jobs = launcher_config.get("n_jobs") if "n_jobs" in launcher_config else None
    if n_jobs is None:
        return None
    return (os.cpu_count() or 1) if n_jobs == -1 else int(n_jobs)


def check_cluster_sweep(argv: list[str], config: dict[str, Any], uri: str) -> None:
    """hydra/launcher=submitit_slurm: every job or trial runs on a cluster node, so the MLflow store, and a
    study's Optuna storage (its trials report every epoch for pruning), must be ones every node reaches."""
    launcher = chosen(argv)
    if not launcher.startswith(CLUSTER):
        return
    from xp.launching.reach import check_reachable

    stores: list[tuple[str, str, str | None]] = [(uri, "tracking_uri", None)]
    if config.get("sweep"):
        from xp.studies.study import storage_url

        stores.append((storage_url(config["sweep"].get("storage")), "sweep.storage",
                       "give the study a database every node reaches: "
                       "sweep.storage=postgresql://USER:PASSWORD@HOST/DB (or $XP_OPTUNA_STORAGE)"))
    for url, key, fix in stores:
        check_reachable(url, [f"the Slurm jobs' nodes (hydra/launcher={launcher})"], None, key=key, fix=fix)
