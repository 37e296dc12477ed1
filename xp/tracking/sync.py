"""Deliver the records of runs that ended while their tracking store was away (xp.tracking.spool).

    python -m xp.sync                       every spool left undelivered on this machine
    python -m xp.sync FOLDER [FOLDER ...]   those spools (a run's output folder's mlflow-spool/)
    python -m xp.sync --tracking-uri URI    only the spools of that store

Exit 0 when everything was delivered, 1 when a store is still away (its spool is kept), 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from pathlib import Path

from xp.errors import one_line, redact
from xp.states import RunStatus
from xp.tracking.spool import RUN, Spool, pending_index, same_process, waiting

log = logging.getLogger("xp")

WAIT_S = 30.0  # how long one spool's store may stay away before sync gives up on it


def pending(uri: str | None = None) -> list[Path]:
    """Spool folders left undelivered (to `uri`, or to any store)."""
    out = []
    for entry in sorted(pending_index().glob("*")) if pending_index().is_dir() else []:
        try:
            folder = Path(entry.read_text().strip())
        except OSError:  # its run's process delivered it and took the entry away since the listing
            continue
        try:
            meta = json.loads((folder / RUN).read_text())
        except (OSError, ValueError):
            entry.unlink(missing_ok=True)  # delivered, or removed by its user
            continue
        if same_process(meta.get("pid", 0), meta.get("started", -1)):
            continue  # its run is still going: its own process delivers it
        if not waiting(folder):
            shutil.rmtree(folder, ignore_errors=True)  # a killed process's spool, all of it delivered
            entry.unlink(missing_ok=True)
            continue
        if uri is None or meta["uri"] == uri:
            out.append(folder)
    return out


_offered: set[str] = set()  # the stores this process has looked for waiting records of


def offer_pending(uri: str) -> None:
    """Runs that ended while this store was away left their records in spools: say how to deliver them. Once a
    process and store: a study's worker starts a run a trial, and the listing reads every running run's spool."""
    if uri in _offered:
        return
    _offered.add(uri)
    left = pending(uri)
    if left:
        log.warning("%d earlier run(s) have records waiting for %s (it was away when they ended); deliver them "
                    "with: python -m xp.sync", len(left), redact(uri))


def deliver(folder: Path, wait_s: float = WAIT_S) -> tuple[bool, str]:
    """(delivered everything, one line saying what happened) for one spool folder."""
    import functools

    from xp.tracking.stores import open_client

    meta = json.loads((folder / RUN).read_text())
    if same_process(meta.get("pid", 0), meta.get("started", -1)):
        return False, f"{folder}: its run is still going (process {meta['pid']}), which delivers it itself"
    spool = Spool.load(folder, functools.lru_cache(None)(open_client))
    n, uri = spool.left(), redact(spool.uri)
    ended = spool.ends()
    deadline = time.monotonic() + wait_s
    was = None
    while spool.left():
        try:
            if was is None:  # a run ended (by its end record, or as an orphan) takes no more records: reopen it
                was = spool.client().get_run(spool.run_id).info.status
                if was != RunStatus.RUNNING:
                    spool.client().update_run(spool.run_id, status=RunStatus.RUNNING)
        except Exception as e:
            if getattr(e, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":
                return False, f"{folder}: run {spool.run_id} no longer exists in {uri}; nothing delivered"
            was = None
            if time.monotonic() > deadline:
                break
            time.sleep(1.0)
            continue
        if not spool.deliver_some():
            if time.monotonic() > deadline:
                break
            time.sleep(1.0)
    left = spool.left()
    if not left and not ended and was not in (None, RunStatus.RUNNING):
        spool.client().set_terminated(spool.run_id, was)  # as it was: its process ended it, or the reaper did
    done = spool.close(0)
    if done:
        return True, f"delivered {n} records of run {spool.run_id} to {uri}"
    return False, f"{uri} is still away: {left} of {n} records of run {spool.run_id} wait in {folder}"


def deliver_left(uri: str, run_id: str, wait_s: float = WAIT_S, among: list[Path] | None = None) -> bool:
    """Deliver what gone processes left in spools of run `run_id` (a line each); True if they left any. Before a
    process writes to a run again (resumed, attached) or ends a gone process's run: its history stays whole and
    in order, and a run that had ended keeps its end. `among`: the pending spools, if listed already."""
    folders = [f for f in (pending(uri) if among is None else among) if f.name.startswith(run_id + "-")]
    for folder in folders:
        delivered, line = deliver(folder, wait_s)
        (log.info if delivered else log.warning)(line)
    return bool(folders)


def deliver_pending(uri: str, wait_s: float) -> int:
    """Deliver every spool gone processes left for `uri`, within wait_s in all (a line each); returns the records
    that still wait."""
    deadline, left = time.monotonic() + wait_s, 0
    for folder in pending(uri):
        try:
            delivered, line = deliver(folder, max(0.0, deadline - time.monotonic()))
        except Exception as e:  # one spool's trouble does not keep the others
            delivered, line = False, f"{folder}: {type(e).__name__}: {one_line(e)[:300]}"
        (log.info if delivered else log.warning)(line)
        if not delivered:
            left += waiting(folder)
    return left


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
            delivered, line = deliver(f, args.wait)
        except Exception as e:
            delivered, line = False, f"{f}: {type(e).__name__}: {one_line(e)[:300]}"
        ok &= delivered
        print(("xp.sync: " if delivered else "xp.sync: error: ") + line, file=sys.stdout if delivered else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
