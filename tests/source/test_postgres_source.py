"""The PostgreSQL logical-decoding source against a real PostgreSQL
(wal_level=logical) and a real registry + Pump: every supported column type,
a column added mid-stream (a DDL binlog from the RELATION message), TRUNCATE,
a restart from the checkpoint, and a table without REPLICA IDENTITY FULL refused."""

from __future__ import annotations

import os
import pathlib

import psycopg
import pytest
from pumpkit import wait_until
from srckit import Cluster, Replay, SourceThread

from binlake import errors, oracle
from binlake.source.postgres.source import PostgresSource
from binlake.testing.devdb import LocalPostgres

pytestmark = pytest.mark.skipif(not LocalPostgres.available(), reason="PostgreSQL not installed (apt-get install "
                                "postgresql); CI always has it")


def run_sql(url: str, *stmts: str) -> None:
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        for s in stmts:
            conn.execute(s)  # type: ignore[arg-type]


def caught_up(src: PostgresSource, transactions: int) -> None:
    wait_until(lambda: src.transactions >= transactions, timeout=60, what=f"{transactions} transactions sent")


def test_types_ddl_truncate_and_restart(pg: LocalPostgres, cluster: Cluster, tmp_path: pathlib.Path) -> None:
    url = pg.create_database("shop")
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    run_sql(url, """CREATE TABLE t (id INT PRIMARY KEY, s SMALLINT, b BIGINT, ok BOOLEAN, r REAL, d DOUBLE PRECISION,
        n NUMERIC(30,10), tx TEXT, vc VARCHAR(20), ch CHAR(4), by BYTEA, dt DATE, ts TIMESTAMP(6),
        tz TIMESTAMPTZ, tm TIME, j JSONB, u UUID)""", "ALTER TABLE t REPLICA IDENTITY FULL")
    data = tmp_path / "src"

    def new_source() -> SourceThread:
        s = SourceThread(PostgresSource(dsn, slot="binlake", publication="binlake", registry=cluster.registry.addr,
                                        data_dir=str(data), create=True)).start()
        assert s.source.ready.wait(60)
        return s

    src = new_source()
    try:
        run_sql(url,
                "INSERT INTO t VALUES (1, -32768, 9223372036854775807, true, 1.5, 1e300, "
                "'-12345678901234567890.0123456789', 'ünïcödé', 'vc', 'ab', '\\x00ff', '2024-02-29', "
                "'2024-01-01 12:34:56.789012', '2024-01-01 12:00:00+02', '23:59:59.5', '{\"a\": [1, null]}', "
                "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11')",
                "INSERT INTO t (id) VALUES (2)",
                "UPDATE t SET tx = 'changed', id = 3 WHERE id = 2")
        caught_up(src.source, 3)
    finally:
        src.stop()
    src = new_source()  # restart from the checkpoint
    try:
        run_sql(url, "ALTER TABLE t ADD COLUMN extra INT", "UPDATE t SET extra = 7 WHERE id = 1",
                "DELETE FROM t WHERE id = 3", "TRUNCATE t", "INSERT INTO t (id, extra) VALUES (5, 5)")
        caught_up(src.source, 3)  # counted afresh by the restarted source: update, delete, insert
    finally:
        src.stop()
    binlogs = cluster.binlogs()
    replay = Replay().apply(binlogs)
    assert replay.checksums() == oracle.checksum(url, schema=replay.schema())
    assert sum(1 for b in binlogs if not b.ddl_query) == 6
    info, rows = replay.table("t")
    assert [r["id"] for r in rows] == [5] and info.previous_table_id  # truncated: a new table id


def test_replica_identity_not_full_refused(pg: LocalPostgres, cluster: Cluster, tmp_path: pathlib.Path) -> None:
    url = pg.create_database("plain")
    run_sql(url, "CREATE TABLE p (id INT PRIMARY KEY)")
    src = PostgresSource(url.replace("postgresql+psycopg://", "postgresql://"), slot="s2", publication="p2",
                         registry=cluster.registry.addr, data_dir=str(tmp_path / "src"), create=True)
    with pytest.raises(errors.FailedPrecondition, match="REPLICA IDENTITY FULL"):
        src.run()
    assert os.path.isdir(tmp_path / "src")
