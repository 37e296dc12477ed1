"""Backend plugins, discovered through the entry-point group `xp.backends`.

Built-in backends register through the same entry points a third-party
package would use; nothing here imports a plugin until it is selected.
Only registered classes can be instantiated: no `_target_` strings from the
command line.
"""

from __future__ import annotations

from importlib import metadata
from typing import Iterable

from xp.backend import Backend
from xp.errors import PluginError, one_line

GROUP = "xp.backends"


class Registry:
    def __init__(self, entry_points: Iterable[metadata.EntryPoint] | None = None):
        eps = metadata.entry_points(group=GROUP) if entry_points is None else entry_points
        self._eps: dict[str, metadata.EntryPoint] = {}
        for ep in eps:
            seen = self._eps.get(ep.name)
            # The same distribution can be found twice on sys.path; only a clash is an error.
            if seen is not None and seen.value != ep.value:
                raise PluginError(f"backend {ep.name!r} is registered twice in {GROUP}: "
                                  f"{seen.value} and {ep.value}; uninstall one of them")
            self._eps[ep.name] = ep

    def names(self) -> list[str]:
        return sorted(self._eps)

    def load(self, name: str) -> type[Backend]:
        ep = self._eps.get(name)
        if ep is None:
            installed = ", ".join(self.names()) or "none (is xp installed? pip install -e .)"
            raise PluginError(f"backend={name!r}: no such backend; installed: {installed}")
        try:
            cls = ep.load()
        except Exception as e:  # a broken plugin fails here, only when selected
            raise PluginError(f"backend={name!r}: plugin {ep.value} failed to import: "
                              f"{type(e).__name__}: {one_line(e)}") from e
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise PluginError(f"backend={name!r}: {ep.value} is not a subclass of xp.backend.Backend")
        return cls
