"""`python -m xp.tracking status | stop`: the tracking service (xp.tracking.service) this user's xp commands
started on this machine, for the state folder ($XP_STATE_DIR), said or ended. Ending it loses nothing: each
run it serves goes on delivering its own records from its spool, and the next command starts a service again."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from xp.tracking import service
    from xp.tracking.spool import state_dir

    ap = argparse.ArgumentParser(prog="python -m xp.tracking", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("status", "stop"), help="status: say which services run; stop: end them")
    args = ap.parse_args(argv)
    folder = state_dir() / "service"
    if args.what == "status":
        found = service.running()
        for p in found:
            print(f"tracking service: process {p.pid}, started {p.create_time():.0f} (epoch s), for {folder}")
        if not found:
            print(f"no tracking service runs for {folder}")
        return 0
    ended = service.stop()
    print(f"tracking service: ended process{'es' if len(ended) > 1 else ''} {', '.join(map(str, ended))}" if ended
          else f"no tracking service ran for {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
