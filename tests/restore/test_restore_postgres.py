"""Restore against a PostgreSQL upstream: the same truth (the upstream's checksums at
quiesced TSOs) with a workload that changes the schema (add/drop/rename/retype
column, rename/truncate/create/drop table)."""

from __future__ import annotations

import pathlib

import pytest
from conftest import ingest_all, run_captured
from dbfixtures import postgres_server  # noqa: F401
from pyspark.sql import SparkSession

from binlake.restore import checks, restore
from binlake.restore import tables as restore_tables
from binlake.stack.localdb import LocalPostgres
from binlake.testing.devcluster import DevCluster
from binlake.workload import plan as wplan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_restore_equals_a_postgresql_upstream_at_each_capture(
        spark: SparkSession, cluster: DevCluster, postgres_server: LocalPostgres,  # noqa: F811
        tmp_path: pathlib.Path) -> None:
    url = postgres_server.create_database("restore_up")
    plan = wplan.plan("ddl", 2, 90, 11, large_txn_rows=100, large_txn_every=45, ddl_every=6, table_rows=40)
    up = run_captured(url, cluster.registry_addr, plan, 3, None, clients=2)
    lake = str(tmp_path / "lake")
    ingest_all(spark, lake, cluster.registry_addr, [up.start_ts, (up.start_ts + up.end_ts) // 2, up.end_ts])
    for cap in up.captures:
        p = restore.plan(spark, lake, cap.ts)
        frames = restore_tables.frames(spark, p)
        got = {t.info.name: checks.frame_checksum(frames[t.table_id], t.info) for t in p.tables}
        assert got == cap.checksums, f"at {cap.ts}"
