"""horovodrun, with its rendezvous server bound to 127.0.0.1.

Horovod 0.28's HTTP rendezvous server (gloo) listens on every interface; xp's local
launches keep every socket on the loopback interface, so this runs horovodrun's own
entry point with the server's port search bound to 127.0.0.1:
`python -m xp.horovodrun ARGS` = `horovodrun ARGS`.
"""

from __future__ import annotations

from typing import Any, Callable

from xp.launch import LOOPBACK, free_port


def loopback_port(server_factory: Callable[[tuple[str, int]], Any]) -> tuple[Any, int]:
    for _ in range(100):
        port = free_port()
        try:
            return server_factory((LOOPBACK, port)), port
        except OSError:
            continue  # taken between the probe and the bind: another one
    raise RuntimeError(f"no free port on {LOOPBACK} for Horovod's rendezvous server")


def main() -> None:
    import horovod.runner.http.http_server as http_server
    from horovod.runner.launch import run_commandline

    http_server.find_port = loopback_port
    run_commandline()


if __name__ == "__main__":
    main()
