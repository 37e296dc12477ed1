"""Anything left behind reaches the store: what a killed or stopped process, or a run that ended while its store
was away, left in its spool (xp.tracking.spool) is drained by the next command on that store (`deliver_left`, at
its first run there, and `end_orphans` then ends the runs their gone processes left RUNNING), or by hand
(`python -m xp.sync`, xp/sync.py).
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from xp.errors import one_line, redact
from xp.states import RunStatus
from xp.tracking.ending import end_for
from xp.processes import same_process
from xp.tracking.spool import RUN, Drain, pending_index

log = logging.getLogger("xp")

WAIT_S = 30.0  # how long one spool's store may stay away before sync gives up on it


def pending(uri: str | None = None, any_host: bool = True) -> list[Path]:
    """Spool folders whose process is gone with records undelivered (to `uri`, or any store); not `any_host`: of
    this host's processes only (hosts that share a file system share the index; another's may live)."""
    out, here = [], socket.gethostname()
    for entry in sorted(pending_index().glob("*")) if pending_index().is_dir() else []:
        try:
            folder = Path(entry.read_text().strip())
        except OSError:
            continue  # its entry went: delivered meanwhile
        try:
            meta = json.loads((folder / RUN).read_text())
        except (OSError, ValueError):
            if folder.parent.is_dir():  # delivered meanwhile, or removed by its user
                entry.unlink(missing_ok=True)
            # else another host's spool, on a disk of its own (the index is in the home folder, which hosts share):
            # left for that host (found by benchmarks/chaos.py: a worker on one host removed another's entries, whose
            # records then reached the store from nobody, a run left RUNNING or without its model)
            continue
        if same_process(meta.get("pid", 0), meta.get("started", -1)) or not any_host and meta.get("host") != here:
            continue  # its run is still going (or may be, elsewhere): its own process or the service delivers it
        if uri is None or meta["uri"] == uri:
            out.append(folder)
    return out


def deliver(folder: Path, wait_s: float = WAIT_S) -> tuple[int, str]:
    """(records that still wait, one line saying what happened) for one spool folder."""
    from xp.tracking.stores import open_client

    meta = json.loads((folder / RUN).read_text())
    if same_process(meta.get("pid", 0), meta.get("started", -1)):
        return 0, f"{folder}: its run is still going (process {meta['pid']}), which delivers it itself"
    client = functools.partial(open_client, meta["uri"])
    drain = Drain(folder, meta["uri"], meta["run_id"], client)
    n, uri, ended = drain.left(), redact(meta["uri"]), drain.left("end") > 0
    deadline, was = time.monotonic() + wait_s, None
    try:
        while drain.left():
            try:
                if was is None:  # a run ended (by its end record, or as an orphan) takes no more records: reopen it
                    was = client().get_run(drain.run_id).info.status
                    if was != RunStatus.RUNNING:
                        client().update_run(drain.run_id, status=RunStatus.RUNNING)
                if drain.deliver_some():
                    continue
            except Exception as e:
                if getattr(e, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":
                    shutil.rmtree(folder, ignore_errors=True)
                    (pending_index() / folder.name).unlink(missing_ok=True)
                    return 0, f"{folder}: run {drain.run_id} no longer exists in {uri}; its {n} records dropped"
                was = None  # (not reopened: asked again)
            if time.monotonic() > deadline:
                break
            time.sleep(1.0)
    finally:  # a run reopened here ends as it was (by its process, end_orphans or end_lost), a stop or not
        if was not in (None, RunStatus.RUNNING) and not (ended and not drain.left("end")):
            client().set_terminated(drain.run_id, was)
    if drain.close(0):
        return 0, f"delivered {n} records of run {drain.run_id} to {uri}"
    return (left := drain.left()), f"{uri} is still away: {left} of {n} records of run {drain.run_id} wait in {folder}"


def deliver_left(uri: str, wait_s: float, run_id: str | None = None, any_host: bool = True) -> int:
    """What gone processes left for store `uri` (run `run_id`'s) delivered in wait_s, a line each: before a run is
    written again, at a sweep's end, at a command's first run (this host's: not `any_host`). Returns what waits."""
    deadline, left = time.monotonic() + wait_s, 0
    for folder in pending(uri, any_host):
        if run_id is not None and not folder.name.startswith(run_id + "-"):
            continue
        try:
            waiting, line = deliver(folder, max(0.0, deadline - time.monotonic()))
        except Exception as e:  # one spool's trouble does not keep the others
            waiting, line = 1, f"{folder}: {type(e).__name__}: {one_line(e)[:300]}"
        (log.warning if waiting else log.info)(line)
        left += waiting
    return left


def end_orphans(client: Any, uri: str, experiment_id: str) -> list[str]:
    """What gone processes left for the store delivered (deliver_left), then the runs of this experiment still
    RUNNING whose process of this host is gone (SIGKILL, out of memory) ended FAILED. A run whose process still
    lives, or of another host, is not touched."""
    deliver_left(uri, 5.0, any_host=False)
    host, ended = socket.gethostname(), list[str]()
    try:
        runs = client.search_runs([experiment_id], f"attributes.status = '{RunStatus.RUNNING}'", max_results=1000)
    except Exception:
        return ended
    for run in runs:
        tags = run.data.tags
        if tags.get("xp.host") != host or not str(tags.get("xp.pid", "")).isdigit():
            continue
        pid = int(tags["xp.pid"])
        if same_process(pid, tags.get("xp.pid_started")):
            continue  # its process lives (the same one: the start time matches)
        # gone since deliver_left looked (it was ending): what it left goes first, which may end the run as its
        # process meant (found by benchmarks/chaos.py: a COMPLETE trial's run ended FAILED here, its end in a spool)
        deliver_left(uri, 5.0, run.info.run_id, any_host=False)
        try:
            if client.get_run(run.info.run_id).info.status != RunStatus.RUNNING:
                continue
        except Exception:
            continue  # (the store went away: the next command looks again)
        end_for(client, run.info.run_id, f"process {pid} on {host} was gone", RunStatus.FAILED)
        log.warning("ended MLflow run %s FAILED: it was left RUNNING by process %d, which is gone",
                    run.info.run_id, pid)
        ended.append(run.info.run_id)
    return ended
