"""Backend discovery through the `xp.backends` entry-point group."""

import sys

import pytest

from plugin_fixtures import install_test_plugins
from xp.run.backend import Backend
from xp.errors import PluginError
from xp.run.entry_points import Registry


@pytest.fixture
def third_party(tmp_path, monkeypatch):
    install_test_plugins(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for mod in [m for m in sys.modules if m.startswith("xp_testplugins")]:
        del sys.modules[mod]


def test_builtin_gluon_is_registered_through_entry_points():
    reg = Registry()
    assert "gluon" in reg.names()
    cls = reg.load("gluon")
    assert issubclass(cls, Backend) and cls.__module__ == "xp_plugins.gluon"


def test_unknown_backend_lists_installed_ones():
    with pytest.raises(PluginError, match=r"backend='nope': no such backend; installed: .*gluon"):
        Registry().load("nope")


def test_third_party_plugin_is_discovered_and_loaded(third_party):
    reg = Registry()
    assert {"gluon", "failing", "broken"} <= set(reg.names())
    assert reg.load("failing").__name__ == "FailingBackend"


def test_broken_plugin_fails_only_when_selected(third_party):
    reg = Registry()  # listing does not import anything
    assert "xp_testplugins.broken" not in sys.modules
    assert reg.load("gluon")
    with pytest.raises(PluginError, match=r"backend='broken': plugin .* failed to import: ModuleNotFoundError"):
        reg.load("broken")


def test_entry_point_that_is_not_a_backend_is_refused(third_party):
    with pytest.raises(PluginError, match="is not a subclass of xp.run.backend.Backend"):
        Registry().load("notabackend")


def test_duplicate_names_raise(tmp_path, monkeypatch):
    install_test_plugins(tmp_path, extra="gluon = xp_testplugins.failing:FailingBackend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match=r"backend 'gluon' is registered twice"):
        Registry()


def test_same_entry_point_seen_twice_is_not_a_clash():
    from importlib.metadata import EntryPoint

    ep = EntryPoint("gluon", "xp_plugins.gluon:GluonBackend", "xp.backends")
    assert Registry([ep, ep]).names() == ["gluon"]
