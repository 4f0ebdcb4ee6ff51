"""How Airflow's SQLite metadata database is opened on this machine (``binlake up``,
the demo, the DAG tests).

The scheduler, the DAG processor, the API server, the triggerer and the
``airflow`` CLI (a backfill, a trigger) all write one SQLite file, and SQLite
takes one writer at a time. Two settings keep them from failing each other
with "database is locked":

* ``SQLITE_CONNECT_ARGS`` (Airflow's ``[database] sql_alchemy_connect_args``
  names it): a writer waits up to ``timeout`` seconds for the lock instead of
  SQLite's 5, which a scheduler's transaction can exceed on two busy cores;
* ``use_wal``: the write-ahead log, so readers (the API server, the scheduler's
  polls) never block a writer and a writer never blocks them; with the default
  rollback journal a reader that wants to write while another writer waits is
  refused at once, whatever the timeout. The mode is stored in the file, so it
  is set once, after ``airflow db migrate``.
"""

from __future__ import annotations

import pathlib
import sqlite3
from typing import Any

# Read by Airflow (conf.getimport) in every one of its processes; Airflow adds
# check_same_thread=False to it for SQLite.
SQLITE_CONNECT_ARGS: dict[str, Any] = {"timeout": 60}

# The import path Airflow's [database] sql_alchemy_connect_args takes.
CONNECT_ARGS_PATH = f"{__name__}.SQLITE_CONNECT_ARGS"


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
