"""What ran a run and who ran it (the command line as typed, the user, the git commit of xp's code, the versions of
the distributions it used), and where to look at it (MLflow's UI): the tags and params every run carries."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Iterable

from xp.errors import redact

CHECKOUT = Path(__file__).resolve().parents[2]  # the repository, when xp runs from a checkout


def source_tags(entry: str = "xp") -> dict[str, str]:
    """What ran and who ran it, as MLflow's Source and User columns read them: the command line as typed
    (XP_COMMAND, set once by the entry point, so that sweep jobs and workers inherit the original), the
    user, and the git commit of xp's code with a dirty flag (none when xp runs from an installed wheel)."""
    import getpass
    import shlex
    import sys

    command = redact(os.environ.get(COMMAND_ENV) or shlex.join([entry, *sys.argv[1:]]))  # a URL's password
    source = "python -m xp" if command.startswith("python -m xp") else command.split(" ", 1)[0]
    tags = {"mlflow.source.type": "LOCAL", "mlflow.source.name": source, "xp.command": command}
    try:
        tags["mlflow.user"] = getpass.getuser()
    except (KeyError, OSError):
        pass
    tags.update(_git())
    return tags


COMMAND_ENV = "XP_COMMAND"


def _git() -> dict[str, str]:
    """The commit xp's code comes from and whether the tree has changes (tracked files), within 5 s."""
    import subprocess

    global _git_tags
    if _git_tags is None:
        root = CHECKOUT
        _git_tags = {}
        if (root / ".git").exists():
            try:
                # (no optional locks: `git status` refreshes the index under .git/index.lock, which a run killed
                # at that moment left behind, and every git command in the user's checkout then failed: found by
                # benchmarks/chaos.py)
                run = lambda *a: subprocess.run(["git", "--no-optional-locks", "-C", str(root), *a],  # noqa: E731
                                                capture_output=True,
                                                text=True, timeout=5, check=True).stdout.strip()
                _git_tags = {"mlflow.source.git.commit": run("rev-parse", "HEAD"),
                             "xp.git.dirty": str(bool(run("status", "--porcelain", "--untracked-files=no"))).lower()}
            except (OSError, subprocess.SubprocessError):
                pass
    return _git_tags


_git_tags: dict[str, str] | None = None


def versions(distributions: Iterable[str]) -> dict[str, str]:
    return dict(_versions(("xp", *distributions)))


@functools.lru_cache(maxsize=None)
def _versions(distributions: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Read once per process: a study's worker would read every distribution's metadata for every trial."""
    import platform
    from importlib import metadata

    out = [("python", platform.python_version())]
    for dist in distributions:
        try:
            out.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            out.append((dist, "not installed"))
    return tuple(out)
