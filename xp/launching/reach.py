"""Whether a launch's hosts reach its tracking store: processes on other hosts (a launch's rank 0, a Slurm sweep's
jobs) write to the store the command names, so it must be one every host reaches."""

from __future__ import annotations

import socket

from xp.errors import ConfigError, redact


def check_reachable(uri: str, hosts: list[str], host_ip: str | None, key: str = "tracking_uri",
                    fix: str | None = None) -> None:
    """Processes on other hosts (a launch's rank 0, a Slurm sweep's jobs) use the store `key` names: it must be
    one every host reaches (and, for a server, one that answers)."""
    from urllib.parse import urlparse

    if hosts and all(_this_machine(h) for h in hosts):
        return  # (the hosts are this machine: a Ray cluster of it, say)
    u = urlparse(uri)
    where, at = ", ".join(hosts), host_ip or "ADDRESS"
    fix = fix or (f"use an MLflow tracking server the hosts reach (make server HOST={at}, then "
                  f"tracking_uri=http://{at}:5000) or PostgreSQL (tracking_uri=postgresql://USER:PASSWORD@HOST/DB)")
    if u.scheme in ("sqlite", "file", ""):
        raise ConfigError(f"{key}={redact(uri)}: a file on this machine, which the workers on {where} cannot "
                          f"reach; {fix}")
    host = u.hostname or ""
    if host == "localhost" or host.startswith("127.") or host == "::1":
        raise ConfigError(f"{key}={redact(uri)}: {host} is each host's own loopback, not this machine, for the "
                          f"workers on {where}; {fix}")
    if u.scheme in ("http", "https"):
        port = u.port or (443 if u.scheme == "https" else 80)
        try:
            socket.create_connection((host, port), timeout=5).close()
        except OSError as e:
            raise ConfigError(f"{key}={redact(uri)}: no server answers at {host}:{port} "
                              f"({e.strerror or type(e).__name__}); start one (make server HOST={at})") from None


def _this_machine(host: str) -> bool:
    """`host` is an address (not a name: no lookup) of this machine (only those can be bound)."""
    import ipaddress

    try:
        ipaddress.IPv4Address(host)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
        return True
    except (ValueError, OSError):
        return False
