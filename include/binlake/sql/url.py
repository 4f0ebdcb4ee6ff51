"""Database URLs binlake accepts, and connecting to one.

Every role that writes to or reads a SQL database by URL (the apply's targets,
``binlake diff``, the command-line checks of ``binlake.cli.argcheck``) parses it
here, so a URL is accepted or refused the same way everywhere.
"""

from __future__ import annotations

import pathlib
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from binlake import errors

_DRIVERS = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg",
            "mysql": "mysql+pymysql", "mariadb": "mysql+pymysql"}
_ALLOWED = {"sqlite", "sqlite+pysqlite", "postgresql+psycopg", "mysql+pymysql", "mariadb+pymysql"}


def normalize_url(url: str) -> sa.engine.URL:
    """``url`` parsed, with bare ``postgresql://`` / ``mysql://`` given binlake's drivers;
    ``errors.InvalidArgument`` for anything else."""
    if not isinstance(url, str) or not url.strip():
        raise errors.InvalidArgument(f"target must be a database URL such as sqlite:///replica.db, got {url!r}")
    try:
        parsed = sa.engine.make_url(url.strip())
    except sa.exc.ArgumentError:
        raise errors.InvalidArgument(
            f"target {url!r} is not a database URL: use sqlite:///PATH, postgresql://USER@HOST/DB "
            "or mysql://USER@HOST/DB") from None
    name = parsed.drivername
    if name in _DRIVERS:
        parsed = parsed.set(drivername=_DRIVERS[name])
    elif name not in _ALLOWED:
        raise errors.InvalidArgument(
            f"target {parsed.render_as_string(hide_password=True)!r}: unsupported database {name!r} "
            "(use sqlite, postgresql[+psycopg] or mysql[+pymysql])")
    if parsed.drivername.startswith("mariadb"):
        parsed = parsed.set(drivername="mysql+pymysql")
    if parsed.drivername.startswith("sqlite") and not parsed.database:
        raise errors.InvalidArgument("target sqlite:// needs a file path (sqlite:///PATH): an in-memory "
                                     "database would vanish with the connection")
    return parsed


def open_engine(url: str) -> sa.engine.Engine:
    """An engine for the database at ``url`` (a target, or one to check), answering now (one
    round trip); a SQLite file's directory is created. ``errors.Unavailable`` if it does not."""
    parsed = normalize_url(url)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.drivername.startswith("sqlite"):
        # A parallel apply writes from several connections: wait for the lock, do not fail.
        kwargs["connect_args"] = {"timeout": 120}
        path = pathlib.Path(parsed.database or "")
        path.parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(parsed, **kwargs)
    if parsed.drivername.startswith("sqlite"):
        sa.event.listen(engine, "connect", _sqlite_on_connect)
        sa.event.listen(engine, "begin", _sqlite_on_begin)
    shown = parsed.render_as_string(hide_password=True)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.DBAPIError as exc:
        engine.dispose()
        raise errors.Unavailable(f"cannot reach target {shown}: {errors.first_line(exc)}") from None
    return engine


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    # SQLAlchemy emits BEGIN itself: pysqlite's implicit transactions start only at
    # the first INSERT/UPDATE/DELETE, which would leave a leading DDL outside the
    # window's transaction. WAL keeps readers (diff, status) from blocking the apply.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()


def _sqlite_on_begin(conn: Connection) -> None:
    # Take the write lock at the start: parallel groups then wait for each other
    # (busy timeout) instead of failing when a read lock cannot be upgraded.
    conn.exec_driver_sql("BEGIN IMMEDIATE")
