"""The settings a plan carries beside the run itself (launching, elastic membership, a study's trial),
and the small validators every part of the plan is checked with: each names the key, the value given and
what is valid."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from xp.studies.compose import flatten  # (re-exported: xp.run.plan's users read it here)
from xp.errors import ConfigError


@dataclass(frozen=True)
class LaunchSettings:
    """How a distributed run's processes start: the launcher (xp.launching.launcher), its own settings (the config
    group `launcher`, read and checked by the launcher itself) and what every remote launcher shares."""
    launcher: str = "local"  # a registered launcher (launcher=NAME)
    options: dict[str, Any] = field(default_factory=dict)  # the rest of its config group: launcher.KEY=VALUE
    host_ip: str | None = None  # a remote launcher: this machine's address as the hosts reach it
    interface: str | None = None  # a remote launcher: the network interface the workers talk over
    port: int | None = None  # scheduler / rendezvous port; None: a free one
    timeout_s: float = 300.0  # a worker without progress for this long fails the job


@dataclass(frozen=True)
class ElasticSettings:
    """Workers joining and leaving at epoch boundaries (xp.elastic)."""
    enabled: bool = False
    discovery: str | None = None  # file of HOST:SLOTS lines, or an executable printing them
    min_workers: int = 1
    max_workers: int = 64
    poll_s: float = 1.0  # how often the discovery source is read
    wait_s: float = 300.0  # how long to wait for min_workers
    max_restarts: int = 10  # lost workers the job survives
    trace: tuple[tuple[float, int, float], ...] = ()  # a spot trace's rows (xp.run.spot): the members and their price
    trace_speed: float = 1.0  # trace seconds per second of the job
    trace_file: str = ""  # where the trace is read from (again when it changes: xp.run.spot.Feed)


@dataclass(frozen=True)
class StudySettings:
    """The Optuna trial a run is (the study's sweeper sets optuna.* on each trial's command line)."""
    sweep: dict[str, Any]  # the study's settings (the config group sweep, with its overrides)
    study: str  # the Optuna study's name
    storage: str  # its RDB URL
    trial_id: int



def is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> TypeGuard[float]:
    """A finite int or float (a bool is neither here)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def integer(cfg: dict, key: str, lo: int, hi: int | None = None) -> int:
    v = cfg.get(key)
    if not is_int(v) or v < lo or (hi is not None and v > hi):
        valid = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"
        raise ConfigError(f"{key}={v!r}: must be {valid}")
    return v


def number(cfg: dict, key: str, lo: float, hi: float | None = None, *, lo_open: bool = False,
           hi_open: bool = False) -> float:
    v = cfg.get(key)
    if not is_number(v) or not ((v > lo if lo_open else v >= lo) and (hi is None or (v < hi if hi_open else v <= hi))):
        left = f"> {lo}" if lo_open else f">= {lo}"
        right = "" if hi is None else (f" and < {hi}" if hi_open else f" and <= {hi}")
        raise ConfigError(f"{key}={v!r}: must be a number {left}{right}")
    return float(v)


def flag(cfg: dict, key: str) -> bool:
    v = cfg.get(key, False)
    if not isinstance(v, bool):
        raise ConfigError(f"{key}={v!r}: must be true or false")
    return v


def choice(value: Any, key: str, valid: tuple[str, ...] | list[str]) -> str:
    if value not in valid:
        raise ConfigError(f"{key}={value!r}: not supported; valid: {', '.join(valid)}")
    return value


def group(cfg: dict, key: str) -> dict:
    v = cfg.get(key)
    if not isinstance(v, dict) or not isinstance(v.get("name"), str):
        raise ConfigError(f"{key}: missing config group; choose one with {key}=NAME")
    return v


def text(cfg: dict, key: str) -> str | None:
    v = cfg.get(key)
    if v is not None and (not isinstance(v, str) or not v.strip()):
        raise ConfigError(f"{key}={v!r}: must be a non-empty string, or null")
    return v


def launch_settings(cfg: dict) -> LaunchSettings:
    """The launch settings, typed; the launcher's own group it reads and checks itself (Launcher.read_options)."""
    chosen = cfg.get("launcher") or {}
    if not isinstance(chosen, dict) or not isinstance(chosen.get("name"), str) or not chosen["name"]:
        raise ConfigError(f"launcher={chosen!r}: choose a launcher with launcher=NAME (python -m xp --help lists them)")
    settings = LaunchSettings(
        launcher=chosen["name"], options={k: v for k, v in chosen.items() if k != "name"},
        host_ip=text(cfg, "host_ip"), interface=text(cfg, "network_interface"),
        port=None if cfg.get("port") is None else integer(cfg, "port", 1024, 65535),
        timeout_s=300.0 if cfg.get("dist_timeout_s") is None else number(cfg, "dist_timeout_s", 1, 86400))
    if settings.host_ip:
        import ipaddress

        try:
            ipaddress.IPv4Address(settings.host_ip)
        except ValueError:
            raise ConfigError(f"host_ip={settings.host_ip}: must be an IPv4 address of this machine") from None
    return settings


def elastic_settings(e: dict) -> ElasticSettings:
    if not e.get("enabled"):
        return ElasticSettings()
    lo, hi = e.get("min_workers"), e.get("max_workers")
    if not (is_int(lo) and is_int(hi) and 1 <= lo <= hi):
        raise ConfigError(f"elastic.min_workers={lo!r}, elastic.max_workers={hi!r}: need integers with "
                          "1 <= min_workers <= max_workers")
    for key, top in (("poll_s", 3600), ("wait_s", 86400)):
        v = e.get(key)
        if not is_number(v) or not 0.05 <= v <= top:
            raise ConfigError(f"elastic.{key}={v!r}: must be a number of seconds in [0.05, {top}]")
    if not is_int(e.get("max_restarts")) or e["max_restarts"] < 0:
        raise ConfigError(f"elastic.max_restarts={e.get('max_restarts')!r}: must be an integer >= 0")
    trace: tuple[tuple[float, int, float], ...] = ()
    speed = e.get("trace_speed", 1.0)
    if e.get("trace"):
        from xp.run import spot

        trace = spot.load(str(e["trace"]))
        if not is_number(speed) or not 0 < speed <= 1e6:
            raise ConfigError(f"elastic.trace_speed={speed!r}: must be a number > 0 (trace seconds per second)")
        if spot.peak(trace) > hi:
            raise ConfigError(f"elastic.trace={e['trace']}: offers up to {spot.peak(trace)} hosts, more than "
                              f"elastic.max_workers={hi}")
    return ElasticSettings(True, text({"elastic.discovery": e.get("discovery")}, "elastic.discovery"), lo, hi,
                           float(e["poll_s"]), float(e["wait_s"]), e["max_restarts"], trace, float(speed),
                           str(e["trace"]) if trace else "")


def study_settings(cfg: dict) -> StudySettings | None:
    o = cfg.get("optuna") or {}
    if o.get("trial_id") is None:
        return None
    if not isinstance(cfg.get("sweep"), dict) or not o.get("study") or not o.get("storage") \
            or not is_int(o["trial_id"]):
        raise ConfigError("optuna.*: set by a study's sweeper for each trial (sweep, optuna.study, optuna.storage, "
                          "optuna.trial_id together); run studies with python -m xp -m sweep=NAME")
    return StudySettings(dict(cfg["sweep"]), str(o["study"]), str(o["storage"]), int(o["trial_id"]))


