"""`python -m xp.tracking status | stop [--every]`: the tracking services (xp.tracking.service) this user's xp
commands started on this machine for the state folder ($XP_STATE_DIR), said or ended. Each is its checkout's (xp's
code, the Python it runs under): `stop` ends this checkout's, `stop --every` every checkout's too. Ending one
loses nothing: each run it serves goes on delivering its own records from its spool, and the next command starts
a service again."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xp.tracking.service import Identity


def main(argv: list[str] | None = None) -> int:
    from xp.tracking import service, services
    from xp.tracking.spool import state_dir

    ap = argparse.ArgumentParser(prog="python -m xp.tracking", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("status", "stop"),
                    help="status: say which services run, whose and what they serve; stop: end this checkout's")
    ap.add_argument("--every", action="store_true", help="stop: other checkouts' services too")
    args = ap.parse_args(argv)
    folder = state_dir() / "service"
    if args.what == "status":
        found = services.running()
        for process, said in found:
            print("\n".join(_described(process, said)))
        if not found:
            print(f"no tracking service runs for {folder}")
        return 0
    ended = services.stop(every=args.every)
    for pid, said in ended:
        print(f"tracking service {pid} ended ({_whose(said)})")
    others = [p for p, said in services.running() if not services.mine(said)]
    if not ended:
        print(f"no tracking service of this checkout ({service.identity().checkout}) ran for {folder}")
    if others:
        print(f"left running: {len(others)} of other checkouts (process {', '.join(str(p.pid) for p in others)}: "
              "python -m xp.tracking status says whose; stop --every ends them)")
    return 0


def _whose(said: Identity | None) -> str:
    from xp.tracking import services

    if said is None:
        return "an xp from before services said whose they are"
    return "this checkout's" if services.mine(said) else f"another checkout's: {said.checkout}"


def _described(process: Any, said: Identity | None) -> list[str]:
    from xp.tracking import service, services

    head = f"tracking service {process.pid} ({_whose(said)})"
    if said is None:
        return [head + f", started {time.ctime(process.create_time())}"]
    if (newer := services.superseded(said, Path(said.state))) is not None:  # (the service's own test: it goes)
        head += f", superseded by service {newer}: it ends once idle"
    serving = services.ask_status(said)
    lines = [head,
             f"  checkout   {said.checkout} (Python {said.python})",
             f"  keyed by   xp's code as of {time.ctime(said.changed_ns / 1e9)}, MLflow {said.mlflow}, SQLAlchemy "
             f"{said.sqlalchemy}, protocol {said.protocol}",
             f"  state      {said.state}",
             f"  started    {time.ctime(said.started)}"]
    if serving is None:
        return lines + ["  serving    (it did not answer)"]
    return lines + [f"  stores     {', '.join(serving.stores) or 'none yet'}",
                    f"  now        {serving.connections} run(s) or command(s) connected; idle {serving.idle_s:.0f} s "
                    f"(it ends after {service.IDLE_S:.0f} s idle)"]


if __name__ == "__main__":
    sys.exit(main())
