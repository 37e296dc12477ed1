"""What a run is called, and what the launcher that placed its process says of it (tags)."""

from __future__ import annotations

import os

from xp.errors import redact

PLACED_ENV = "XP_PLACED_TAGS"  # tags (JSON) a launcher gives the runs of the processes it placed: where their logs are
MAX_RUN_NAME = 250  # MLflow's column; PostgreSQL enforces it, SQLite does not
# overrides that say nothing of the run: where it is tracked, and how its processes reach the hosts
UNNAMING = ("tracking_uri=", "experiment=", "run_name=", "optuna.", "hydra.", "launcher.", "host_ip=",
            "network_interface=", "port=", "dist_timeout_s=")


def run_name(overrides: list[str] | tuple[str, ...]) -> str:
    """A run's default name: its overrides, less those that say where it is tracked or how it was launched."""
    return " ".join(o for o in overrides if not o.lstrip("+~").startswith(UNNAMING))


def run_label(name: str) -> str:
    """`name` as MLflow can store it: passwords hidden, at most 250 characters."""
    name = redact(name)
    return name if len(name) <= MAX_RUN_NAME else name[:MAX_RUN_NAME - 3] + "..."


def placed_tags() -> dict[str, str]:
    """What the launcher that placed this process says of its place (PLACED_ENV), as run tags."""
    import json

    try:
        found = json.loads(os.environ.get(PLACED_ENV) or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}
