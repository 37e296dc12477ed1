"""Plugins, discovered through entry-point groups: backends in `xp.backends`, launchers in `xp.launchers`.

Built-in plugins register through the same entry points a third-party
package would use; nothing here imports a plugin until it is selected.
Only registered classes can be instantiated: no `_target_` strings from the
command line.
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import Any, Iterable

from xp.run.backend import Backend
from xp.errors import PluginError, one_line
from xp.models import _installed

GROUP = "xp.backends"


class Registry:
    """The plugins of one entry-point group (default: backends), each a subclass of `base`."""

    def __init__(self, entry_points: Iterable[metadata.EntryPoint] | None = None, group: str = GROUP,
                 base: type = Backend, kind: str = "backend"):
        self.group, self.base, self.kind = group, base, kind
        eps = _installed(group) if entry_points is None else entry_points
        self._eps: dict[str, metadata.EntryPoint] = {}
        for ep in eps:
            seen = self._eps.get(ep.name)
            # The same distribution can be found twice on sys.path; only a clash is an error.
            if seen is not None and seen.value != ep.value:
                raise PluginError(f"{kind} {ep.name!r} is registered twice in {group}: "
                                  f"{seen.value} and {ep.value}; uninstall one of them")
            self._eps[ep.name] = ep

    def names(self) -> list[str]:
        return sorted(self._eps)

    def load(self, name: str) -> type[Any]:  # a subclass of `base`
        ep, kind = self._eps.get(name), self.kind
        if ep is None:
            installed = ", ".join(self.names()) or "none (is xp installed? pip install -e .)"
            raise PluginError(f"{kind}={name!r}: no such {kind}; installed: {installed}")
        try:
            cls = ep.load()
        except Exception as e:  # a broken plugin fails here, only when selected
            raise PluginError(f"{kind}={name!r}: plugin {ep.value} failed to import: "
                              f"{type(e).__name__}: {one_line(e)}") from e
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise PluginError(f"{kind}={name!r}: {ep.value} is not a subclass of "
                              f"{self.base.__module__}.{self.base.__qualname__}")
        return cls
