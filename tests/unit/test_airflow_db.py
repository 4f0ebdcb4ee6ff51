"""Airflow's SQLite metadata database: writers wait for the lock, readers never block them."""

from __future__ import annotations

import pathlib
import sqlite3
import threading
import time

import pytest

from binlake.stack import airflow_db
from binlake.stack import supervisor as stack


def test_every_local_airflow_points_at_the_connect_args(tmp_path: pathlib.Path) -> None:
    env = stack.local_airflow(tmp_path)
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"] == "binlake.stack.airflow_db.SQLITE_CONNECT_ARGS"
    assert airflow_db.SQLITE_CONNECT_ARGS["timeout"] >= 30


def test_wal_lets_a_writer_commit_while_a_reader_holds_a_transaction(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "airflow.db"
    assert airflow_db.use_wal(db) == "wal"
    setup = sqlite3.connect(db)
    setup.execute("CREATE TABLE dag_run (id INTEGER PRIMARY KEY)")
    setup.commit()
    setup.close()
    # A reader in the middle of a read transaction (as the API server's polls are).
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM dag_run").fetchone() == (0,)
    # In the rollback journal, this writer's commit would wait for the reader and fail
    # after its timeout; in WAL it commits at once.
    writer = sqlite3.connect(db, timeout=1)
    started = time.monotonic()
    writer.execute("INSERT INTO dag_run (id) VALUES (1)")
    writer.commit()
    assert time.monotonic() - started < 1
    assert reader.execute("SELECT count(*) FROM dag_run").fetchone() == (0,)  # its snapshot
    reader.execute("COMMIT")
    assert reader.execute("SELECT count(*) FROM dag_run").fetchone() == (1,)
    reader.close()
    writer.close()


def test_a_writer_waits_for_the_lock_instead_of_failing(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "airflow.db"
    airflow_db.use_wal(db)
    first = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    first.execute("CREATE TABLE t (x INTEGER)")
    first.execute("BEGIN IMMEDIATE")  # holds the write lock
    threading.Timer(0.5, lambda: first.execute("COMMIT")).start()
    second = sqlite3.connect(db, **{k: v for k, v in airflow_db.SQLITE_CONNECT_ARGS.items()
                                    if k != "check_same_thread"})
    second.execute("INSERT INTO t VALUES (1)")  # waits ~0.5 s, then succeeds
    second.commit()
    assert second.execute("SELECT count(*) FROM t").fetchone() == (1,)
    second.close()
    first.close()


def test_use_wal_checks_its_input() -> None:
    with pytest.raises(TypeError, match="pathlib.Path"):
        airflow_db.use_wal("airflow.db")  # type: ignore[arg-type]
