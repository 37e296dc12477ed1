"""A third-party plugin distribution written to disk: real entry-point discovery, no mocks."""

from pathlib import Path

FAILING = '''
from xp_plugins.gluon import GluonBackend


class FailingBackend(GluonBackend):
    """Trains one batch, then fails: the run must end FAILED with one line."""
    name = "failing"

    def step(self, batch, lr):
        if getattr(self, "_stepped", False):
            raise RuntimeError("injected failure in step 2")
        self._stepped = True
        return super().step(batch, lr)
'''


def as_package(root: Path, module: Path, package: str, group: str, entries: str) -> Path:
    """`module` written under `root` as the installed distribution `package` (its module, METADATA and the
    entry points `entries` of `group`), as pip would leave it; put `root` on sys.path to find it."""
    pkg = root / package
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(module.read_text())
    info = root / f"{package}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package.replace('_', '-')}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entries}")
    return root


def install_test_plugins(root: Path, extra: str = "") -> Path:
    """Write package xp_testplugins with a failing, a broken and a non-backend plugin, plus its dist-info."""
    pkg = root / "xp_testplugins"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "failing.py").write_text(FAILING)
    (pkg / "broken.py").write_text("import xp_no_such_framework  # noqa\n")
    (pkg / "notabackend.py").write_text("class Thing:\n    pass\n")
    info = root / "xp_testplugins-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: xp-testplugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[xp.backends]\n"
        "failing = xp_testplugins.failing:FailingBackend\n"
        "broken = xp_testplugins.broken:BrokenBackend\n"
        "notabackend = xp_testplugins.notabackend:Thing\n" + extra)
    return root
