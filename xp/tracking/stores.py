"""Where runs are tracked: the store's URI made absolute, checked before use (a server that answers, a database
that accepts the password), and opened (a new SQLite store created under
its first-use lock). mlflow and sqlalchemy are imported inside the functions."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from xp.errors import ConfigError, one_line, redact

DEFAULT_URI = "sqlite:///mlruns/mlflow.db"


def resolve_uri(configured: str | None = None, cwd: str | Path | None = None) -> str:
    """The tracking URI to use, with a relative SQLite path made absolute against `cwd`.

    Absolute, so that sweep workers, resumed runs and `mlflow ui` all see the same file.
    """
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        path = (Path(cwd or os.getcwd()) / uri[len(prefix):]).resolve()
        uri = prefix + str(path)
    if uri.startswith(prefix):
        folder = Path(uri[len(prefix):]).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"tracking_uri={uri}: cannot create {folder} ({e.strerror}); "
                              "point it at a writable place") from None
    return uri


_reached: set[str] = set()  # databases and servers this process has reached already


def check_server(uri: str, timeout_s: float = 5.0) -> None:
    """An MLflow tracking server must answer (its /health, once per process and URI, within timeout_s)."""
    import urllib.error
    import urllib.request

    if uri in _reached:
        return
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s).close()
    except urllib.error.HTTPError:
        pass  # a server answered; what it says to the API is MLflow's to report
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise ConfigError(f"tracking_uri={redact(uri)}: no MLflow server answers ({one_line(reason)}); start one "
                          "(make server, or mlflow server) or use a database: tracking_uri=sqlite:///mlruns/mlflow.db"
                          ) from e  # (the cause says the server is away: a study's next trial waits for it)
    _reached.add(uri)


def check_database(url: str, what: str) -> None:
    """Connect once to the database of `url` (what: how the user named it) before anything uses it: a wrong
    password or an unreachable server is one line at once, not a minute of retries and a traceback.
    Once per process and URL: a sweep's trials and its study reuse the answer."""
    import re

    import sqlalchemy

    if url in _reached:
        return

    kwargs = {"connect_args": {"connect_timeout": 5}} if url.startswith("postgresql") else {}
    try:
        engine = sqlalchemy.create_engine(url, **kwargs)
        with engine.connect() as conn:  # SQLite opens a file lazily: a read says whether it is a database
            conn.exec_driver_sql("PRAGMA schema_version" if url.startswith("sqlite") else "SELECT 1")
        engine.dispose()
        _reached.add(url)
    except ModuleNotFoundError as e:
        raise ConfigError(f"{what} {redact(url)}: needs the {e.name} driver "
                          "(PostgreSQL: pip install 'psycopg[binary]')") from None
    except Exception as e:
        reason = re.sub(r"\s*\(Background on this error at: \S+\)", "", one_line(e))
        raise ConfigError(f"{what} {redact(url)}: cannot connect ({type(e).__name__}: {reason[:300]})") from e


_clients: dict[str, object] = {}  # one client (and one store: engine, checked schema) per URI and process
_opened: dict[str, tuple] = {}  # a SQLite store's file as its client found it (stamp)


def open_client(uri: str, recheck: bool = False):
    """An MlflowClient on `uri`, opened once per process (a study's worker opens it before its first trial).
    Opening a SQLite store creates or migrates its schema: that happens under the store's first-use lock
    (xp.storefiles), so processes starting together never race through the migrations. `recheck` (a process
    that lives long: the tracking service, at each run): opened again, with MLflow's checks, if the file is no
    longer the one it opened, or its schema's version changed (removed, replaced, migrated or broken since)."""
    if recheck and uri in _clients and _stamp(uri) != _opened.get(uri):
        _forget(uri)
    if uri in _clients:
        _clients[uri] = _clients.pop(uri)  # (the last used last: trim keeps those)
        return _clients[uri]
    from mlflow.tracking import MlflowClient

    from xp.storefiles import first_use

    for name in ("mlflow.store.db.utils", "alembic"):  # creating or migrating a new store's schema is not news
        logging.getLogger(name).setLevel(logging.WARNING)
    if uri.split(":", 1)[0].split("+")[0] in ("postgresql", "mysql", "mssql"):
        check_database(uri, "tracking_uri")  # MLflow would retry a wrong password for a minute
    elif uri.startswith(("http://", "https://")):
        check_server(uri)  # MLflow would retry a server that is not there for minutes
    if uri.startswith(("http://", "https://")):
        # the spool retries a server that went away (xp.spool): MLflow's own retries would only block it for
        # minutes and print urllib3's "Retrying" lines
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    with first_use(uri, "tracking_uri", seed=_mlflow_schema):
        client = _clients[uri] = MlflowClient(tracking_uri=uri)  # (it opens the store)
        _opened[uri] = _stamp(uri)
    return client


def trim(keep: int) -> None:
    """Close the stores of all but the `keep` URIs opened last (a process that lives long and meets many stores:
    the tracking service). Their clients still work: their connections open again when used."""
    for uri in list(_clients)[:-keep] if keep else list(_clients):
        _close(uri)


def _forget(uri: str) -> None:
    """The store of `uri` closed, and forgotten by MLflow too (it keeps one per URI): opened again at next use."""
    from xp.tracking.gate import private_ok

    _close(uri)
    _reached.discard(uri)
    if private_ok():  # (another MLflow: its cached store stays; a new client still reconnects its engine)
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        _tracking_store_registry._get_store_with_resolved_uri.cache_clear()


def _close(uri: str) -> None:
    """This process's client of `uri` let go, its store's connections closed."""
    client: Any = _clients.pop(uri)
    _opened.pop(uri, None)
    from xp.tracking.gate import private_ok

    try:
        if private_ok():  # (another MLflow's connections close as its client goes)
            client._tracking_client.store.engine.dispose()
    except Exception:  # noqa: BLE001 - (a store without an engine, or one gone)
        pass


def _stamp(uri: str) -> tuple:
    """A SQLite store's file (device, inode) and its schema's version, as they are now; () for other stores."""
    import sqlite3

    from xp.storefiles import sqlite_path

    path = sqlite_path(uri)
    if path is None:
        return ()
    try:
        where = path.stat()
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            tables = db.execute("select count(*) from sqlite_master where type='table'").fetchone()
            version = db.execute("select version_num from alembic_version").fetchone()
        return where.st_dev, where.st_ino, version, tables
    except (OSError, sqlite3.Error) as e:
        return ("unreadable", str(e))


def _mlflow_schema(path: Path) -> None:
    """A new SQLite store starts as a copy of an empty one with MLflow's whole schema: MLflow's own way runs its
    ~60 migrations on every new file (1.3 s; a sweep's or a test's fresh store paid that each time). The copy
    holds no experiment: MLflow adds its default one, with this store's artifact root, as it opens the file. The
    template, and so each copy, is in SQLite's write-ahead-log mode (xp.storefiles.write_ahead)."""
    import mlflow

    from xp.storefiles import schema_from_template, write_ahead
    from xp.tracking.gate import private_ok

    def create(url: str) -> None:
        if not private_ok():  # no template: MLflow's own first open writes its schema (its migrations)
            raise RuntimeError(f"MLflow {mlflow.__version__} is not one xp seeds a store's schema for")
        import sqlalchemy
        from mlflow.store.db.utils import _initialize_tables

        engine = sqlalchemy.create_engine(url)
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
        _initialize_tables(engine)
        engine.dispose()
        write_ahead(Path(str(engine.url.database)))

    schema_from_template(path, f"mlflow-{mlflow.__version__}-wal", create)


def _artifact_root(uri: str) -> str | None:
    """Artifacts of a SQLite store live beside the database; other stores decide for themselves."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "artifacts").as_uri()
    return None


# the store answered and refused the record (a changed param value, a deleted run): sending it again cannot help
REFUSED = ("INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "BAD_REQUEST", "INVALID_STATE")
AWAY = ("Connection refused", "Max retries exceeded", "timed out", "database is locked", "Name or service not known",
        "503", "502")  # what a store that does not answer (now) says, as an error's text has it
BUSY = ("QueuePool limit", "timed out", "database is locked")  # a store too busy to answer now, whatever the error's
# code says (SQLAlchemy's pool exhausted comes as INVALID_STATE): sent again, never left out


def refused(e: Exception) -> bool:
    """Whether `e` says the store answered and refused what it was sent: sending it again cannot help."""
    return getattr(e, "error_code", None) in REFUSED and "active" not in str(e) and \
        not any(marker in str(e) for marker in BUSY)


def away(e: Exception) -> bool:
    """Whether `e` says the store is away (it may come back), rather than that it refused what it was sent."""
    return not refused(e) and any(marker in one_line(e) for marker in AWAY)


def away_reason(e: Exception) -> str:
    """What a store that is away said, in a few words."""
    text = one_line(e)
    return next((marker.lower() for marker in AWAY if marker in text), text[:120])
