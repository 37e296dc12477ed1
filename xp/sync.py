"""Deliver what runs left undelivered in their spools (xp.tracking.leftovers): those whose process was killed, or
whose store was away when they ended.

    python -m xp.sync                       every spool left undelivered on this machine
    python -m xp.sync FOLDER [FOLDER ...]   those spools (a run's output folder's mlflow-spool/)
    python -m xp.sync --tracking-uri URI    only the spools of that store

Exit 0 when everything was delivered, 1 when a store is still away (its spool is kept), 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xp.errors import one_line
from xp.tracking.leftovers import WAIT_S, deliver, pending
from xp.tracking.spool import RUN


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xp.sync", description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", type=Path, help="spool folders (default: every undelivered one)")
    ap.add_argument("--tracking-uri", help="only the spools of this store")
    ap.add_argument("--wait", type=float, default=WAIT_S, help="seconds a store may stay away (per spool)")
    args = ap.parse_args(argv)
    for f in args.folders:
        if not (f / RUN).is_file():
            print(f"xp.sync: error: {f}: not a spool folder (it has no {RUN}: a run's output folder holds one as "
                  "mlflow-spool/ while its records wait)", file=sys.stderr)
            return 2
    folders = args.folders or pending(args.tracking_uri)
    if not folders:
        print("xp.sync: nothing waits for delivery")
        return 0
    ok = True
    for f in folders:
        try:
            waiting, line = deliver(f, args.wait)
        except Exception as e:
            waiting, line = 1, f"{f}: {type(e).__name__}: {one_line(e)[:300]}"
        delivered = not waiting
        ok &= delivered
        print(("xp.sync: " if delivered else "xp.sync: error: ") + line, file=sys.stdout if delivered else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
