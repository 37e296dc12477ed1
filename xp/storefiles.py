"""A SQLite store's file (MLflow's tracking database, Optuna's study storage): its first use serialised across
processes, and a new one's schema copied from a template.

MLflow and Optuna create or migrate a new SQLite file's schema when they open it. Two processes doing that
at the same moment race through the migrations and can leave the file half-migrated for good (measured:
`_alembic_tmp_params already exists`, `duplicate column name: step`). An exclusive lock on a file beside the
database (`NAME.db.lock`), held only while a process opens the store, makes the second process wait for the
first to finish: it then finds the schema complete and only checks it.

A PostgreSQL store has the same race (two commands at once on a new database: `duplicate key value violates unique
constraint "pg_type_typname_nsp_index"` as both create Optuna's tables, found by benchmarks/chaos.py): there the
lock is the database's own, an advisory lock held on a connection of its own while the process opens the store.

A store left half-migrated by an older crash (or by xp before this lock) is detected when opening it fails
inside the migrations, and named in one line with what to do.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
from pathlib import Path
from typing import Callable, Iterator

from xp.errors import ConfigError, one_line

WAIT_S = 120.0  # how long a process waits for another to finish creating the store before giving up

# what SQLAlchemy/alembic say when a schema was left between two revisions
_HALF_MIGRATED = ("_alembic_tmp_", "online migration expected", "duplicate column name", "no such index",
                  "already exists", "no such column", "no such table")


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///PATH` URI, or None for any other store."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    path = uri[len(prefix):].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


@contextlib.contextmanager
def first_use(uri: str, what: str, wait_s: float = WAIT_S,
              seed: Callable[[Path], None] | None = None) -> Iterator[None]:
    """Hold the store's creation lock while the body opens the store (no-op for servers and other databases).
    An error raised inside that looks like an unfinished migration becomes one line naming the file and the fix.
    `seed(path)`: writes a new store's schema (under the lock) before the body opens it."""
    path = sqlite_path(uri)
    if path is None:
        with _server_lock(uri, wait_s):
            yield
        return
    lock = path.with_name(path.name + ".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(f"{what}={uri}: cannot create {lock} ({e.strerror}); point it at a writable place") from None
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise ConfigError(f"{what}={uri}: another process has been creating this store for over "
                                      f"{wait_s:.0f} s (it holds {lock}); wait for it or stop it") from None
                time.sleep(0.05)
        existed = path.exists() and path.stat().st_size > 0
        if not existed and seed is not None:
            seed(path)
        try:
            yield
        except Exception as e:
            if existed and any(s in str(e).lower() for s in _HALF_MIGRATED):
                raise ConfigError(half_migrated(path, what, e)) from e
            raise
    finally:
        os.close(fd)  # releases the lock


LOCK_KEY = 0x78705F6669727374  # pg_advisory_lock's key for xp's first use of a store ("xp_first")


@contextlib.contextmanager
def _server_lock(uri: str, wait_s: float) -> Iterator[None]:
    """A PostgreSQL store: its advisory lock LOCK_KEY held on a connection of its own (waiting up to `wait_s`) while
    the body opens the store. Any other store, or a server that does not answer: no lock (opening it says why)."""
    if not uri.startswith(("postgresql:", "postgresql+psycopg:")):
        yield
        return
    try:
        import psycopg

        conn = psycopg.connect(uri.replace("postgresql+psycopg:", "postgresql:", 1), connect_timeout=10,
                               autocommit=True)
    except Exception:  # away, refused, a driver missing: the store's own open says so in its words
        yield
        return
    try:
        conn.execute(f"SET lock_timeout = {int(wait_s * 1000)}")
        conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
    except Exception:  # waited past wait_s, or the server went away: open without it
        conn.close()
        yield
        return
    try:
        yield
    finally:
        conn.close()  # ends the session: the lock goes with it


def half_migrated(path: Path, what: str, error: BaseException) -> str:
    return (f"{what}=sqlite:///{path}: this database was left half-migrated (its schema stopped between two "
            f"versions: {one_line(error)[:160]}), by a crash or by several processes creating it at once before "
            f"xp serialised that; move it aside (mv {path} {path}.broken) and run again for a new one, or restore "
            f"it from a backup")


def optuna_schema(path: Path) -> None:
    """A new SQLite study storage starts as a copy of an empty one with Optuna's schema (its tables and version
    rows; no study): creating them costs 0.15-0.3 s on every new file."""
    import optuna

    def create(url: str) -> None:
        optuna.storages.RDBStorage(url).engine.dispose()

    schema_from_template(path, f"optuna-{optuna.__version__}", create)


def schema_from_template(path: Path, name: str, create: Callable[[str], None]) -> None:
    """Write the new SQLite file `path` as a copy of an empty database that `create(sqlite_url)` made once per
    `name` (a library and its version) in xp's cache folder. Anything unexpected (no cache folder, a library's
    function gone): nothing is written, and the library creates the schema itself, as it would without xp."""
    import shutil
    import tempfile

    try:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xp"
        template = cache / f"{name}-schema.db"
        if not template.exists():
            cache.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cache, suffix=".db")
            os.close(fd)
            try:
                create(f"sqlite:///{tmp}")
                os.replace(tmp, template)  # whole or absent: a reader never sees it half-written
            finally:
                Path(tmp).unlink(missing_ok=True)
        new = path.with_name(f".{path.name}.{os.getpid()}.new")
        os.close(os.open(new, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o666))  # the mode a new database gets
        try:
            shutil.copyfile(template, new)
            os.replace(new, path)
        finally:
            new.unlink(missing_ok=True)
    except Exception as e:  # noqa: BLE001 - only a shortcut: the library still creates the schema its own way
        logging.getLogger("xp").debug(f"new store {path}: no schema template ({one_line(e)})")


def write_ahead(path: Path) -> None:
    """Put the SQLite file `path` (no other process has it open) in write-ahead-log mode, which the file (and a
    copy of it) keeps for every connection: a commit appends to `NAME-wal` instead of writing a rollback journal,
    the database and both their syncs, and readers do not block the writer. Measured: 0.09 ms of CPU a commit, not 0.29; the
    tracking service's CPU a trial in benchmarks/study_scale.py 25-27 ms, not 31-38. The file then needs its
    `-wal` beside it until SQLite folds it back (at the last connection's close): copy a live store with
    `sqlite3 FILE .backup`, not `cp`."""
    import sqlite3

    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA journal_mode=WAL").fetchall()
    finally:
        db.close()
