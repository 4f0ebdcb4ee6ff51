"""Airflow's metadata database on this machine (``binlake up``, the demo, the DAG tests).

``binlake up`` keeps it on a throwaway PostgreSQL server of its own
(``binlake.stack.localdb.LocalPostgres``, data in ``<data>/airflow/postgres``)
whenever the PostgreSQL server binaries are installed: the scheduler, the DAG
processor, the API server, the triggerer and the ``airflow`` CLI (a backfill, a
trigger) all write it at once, which PostgreSQL's row locks and MVCC take in
their stride. ``choose`` says which database a stack gets.

SQLite is the fallback (no PostgreSQL binaries, ``--airflow-db sqlite``, or a
stack whose metadata is in SQLite already). SQLite takes one writer at a time;
two settings keep the writers from failing each other with "database is locked":

* ``SQLITE_CONNECT_ARGS`` (Airflow's ``[database] sql_alchemy_connect_args``
  names it): a writer waits up to ``timeout`` seconds for the lock instead of
  SQLite's 5, which a scheduler's transaction can exceed on two busy cores;
* ``use_wal``: the write-ahead log, so readers (the API server, the scheduler's
  polls) never block a writer and a writer never blocks them; with the default
  rollback journal a reader that wants to write while another writer waits is
  refused at once, whatever the timeout. The mode is stored in the file, so it
  is set once, after ``airflow db migrate``.

Even so, ``airflow backfill create`` can be refused half way on SQLite (a stale
snapshot no timeout waits out); on PostgreSQL it is not.
"""

from __future__ import annotations

import pathlib
import sqlite3
from typing import Any

from binlake import errors

# Read by Airflow (conf.getimport) in every one of its processes; Airflow adds
# check_same_thread=False to it for SQLite.
SQLITE_CONNECT_ARGS: dict[str, Any] = {"timeout": 60}

# The import path Airflow's [database] sql_alchemy_connect_args takes.
CONNECT_ARGS_PATH = f"{__name__}.SQLITE_CONNECT_ARGS"

AUTO, POSTGRES, SQLITE = "auto", "postgres", "sqlite"
CHOICES = (AUTO, POSTGRES, SQLITE)
# The database of Airflow's metadata inside the stack's PostgreSQL server.
DATABASE = "airflow"


def postgres_dir(home: pathlib.Path) -> pathlib.Path:
    """Where a stack with Airflow home ``home`` keeps its PostgreSQL server (data, socket, log)."""
    return home / "postgres"


def choose(requested: str, home: pathlib.Path) -> tuple[str, str]:
    """(``postgres`` or ``sqlite``, why SQLite when it is) for a stack whose Airflow home is ``home``.

    ``auto`` takes PostgreSQL when its server can start here, except for a stack
    whose metadata is already in SQLite (its runs and connections stay where they
    are; ``--airflow-db postgres`` on a new data dir moves to PostgreSQL).
    ``postgres`` when it cannot start is FailedPrecondition saying why.
    """
    from binlake.stack.localdb import LocalPostgres

    if requested not in CHOICES:
        raise ValueError(f"requested must be one of {', '.join(CHOICES)}, got {requested!r}")
    if not isinstance(home, pathlib.Path):
        raise TypeError(f"home must be a pathlib.Path, got {type(home).__name__}")
    if requested == SQLITE:
        return SQLITE, "--airflow-db sqlite"
    pg_dir = postgres_dir(home)
    if requested == AUTO and (home / "airflow.db").exists() and not (pg_dir / "data" / "PG_VERSION").exists():
        return SQLITE, f"this stack's Airflow metadata is in {home / 'airflow.db'} already"
    problem = LocalPostgres(pg_dir).startable()
    if problem:
        if requested == POSTGRES:
            raise errors.FailedPrecondition(f"--airflow-db postgres: {problem}")
        return SQLITE, problem
    return POSTGRES, ""


def postgres_urls(server: Any) -> tuple[str, str]:
    """The SQLAlchemy URLs (sync, async) of Airflow's database on the running ``server``
    (a ``LocalPostgres``), creating the database on first use.

    Airflow 3 opens an async engine too, by default through asyncpg, which binlake
    does not install: psycopg 3 (installed for the upstreams) serves both modes."""
    import psycopg

    if not server.running:
        raise errors.FailedPrecondition(f"{server!r} is not running")
    with psycopg.connect(host="127.0.0.1", port=server.port, user="postgres", dbname="postgres",
                         connect_timeout=5, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
    if exists is None:
        server.create_database(DATABASE)
    # psycopg2: the driver Airflow's PostgreSQL support is tested with; psycopg 3 for async.
    where = f"postgres@127.0.0.1:{server.port}/{DATABASE}"
    return f"postgresql+psycopg2://{where}", f"postgresql+psycopg://{where}"


def use_wal(db: pathlib.Path) -> str:
    """Switch the SQLite file ``db`` to the write-ahead log; returns the journal mode now in force."""
    if not isinstance(db, pathlib.Path):
        raise TypeError(f"db must be a pathlib.Path, got {type(db).__name__}")
    conn = sqlite3.connect(db, timeout=60)
    try:
        (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        return str(mode)
    finally:
        conn.close()
