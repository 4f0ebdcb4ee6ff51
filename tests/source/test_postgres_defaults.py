"""Column DEFAULTs from a PostgreSQL upstream through ``binlake source postgres``,
the lake, a restore and an apply.

RELATION messages carry no defaults: the source reads them from the catalog
(``pg_attrdef``) and what the rows existing at an ADD COLUMN got from
``pg_attribute.attmissingval``, so rows that predate the column read, downstream,
what PostgreSQL shows for them: the constant of each type, and ``now()`` as of
the ALTER's transaction. A later ``SET DEFAULT`` changes only rows inserted after it.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from pumpkit import wait_until
from srckit import Cluster, Replay, SourceThread
from test_postgres_snapshot import dsn_of, run_sql, started

from binlake import cli, errors
from binlake.registry.client import RegistryClient
from binlake.source.postgres.source import PostgresSource
from binlake.sql import checksum
from binlake.stack.localdb import LocalPostgres

pytestmark = [pytest.mark.skipif(not LocalPostgres.available(), reason="PostgreSQL not installed (apt-get install "
                                 "postgresql); CI always has it"), pytest.mark.slow]

ADD_EACH_TYPE = (
    "ALTER TABLE t ADD COLUMN n INT NOT NULL DEFAULT 7, ADD COLUMN big BIGINT DEFAULT -9223372036854775808, "
    "ADD COLUMN price NUMERIC(10,2) NOT NULL DEFAULT 1.5, ADD COLUMN ratio DOUBLE PRECISION DEFAULT -2.5, "
    "ADD COLUMN label VARCHAR(20) NOT NULL DEFAULT 'it''s', ADD COLUMN raw BYTEA DEFAULT '\\x00ff', "
    "ADD COLUMN day DATE DEFAULT '2024-02-29', ADD COLUMN at TIMESTAMP(6) NOT NULL DEFAULT '2024-01-02 03:04:05.000006', "
    "ADD COLUMN tod TIME DEFAULT '23:59:58', ADD COLUMN ok BOOLEAN NOT NULL DEFAULT true, "
    "ADD COLUMN doc JSONB DEFAULT '{\"a\": 1}', ADD COLUMN plain INT, ADD COLUMN created TIMESTAMPTZ DEFAULT now()")


def _ts(cluster: Cluster) -> int:
    with RegistryClient(cluster.registry.addr) as reg:
        return reg.get_ts()


def _has_row(cluster: Cluster, key: int) -> bool:
    try:
        _info, rows = Replay().apply(cluster.binlogs()).table("t")
    except KeyError:
        return False
    return any(r["id"] == key for r in rows)


def test_added_columns_read_their_defaults_downstream(pg: LocalPostgres, cluster: Cluster, tmp_path: pathlib.Path,
                                                      spark: Any) -> None:
    from binlake.lake import ingest
    from binlake.lake.pumps import datasource as lake_source
    from binlake.lake.pumps.planner import plan_window
    from binlake.replicate import runner, task
    from binlake.sql import diff

    url = pg.create_database("pgdefaults")
    run_sql(url, "CREATE TABLE t (id INT PRIMARY KEY, v TEXT)", "ALTER TABLE t REPLICA IDENTITY FULL",
            "INSERT INTO t SELECT i, 'r' || i FROM generate_series(1, 200) i")
    t0 = _ts(cluster)
    src = SourceThread(PostgresSource(dsn_of(url), slot="pgdefaults", publication="pgdefaults_pub",
                                      registry=cluster.registry.addr, data_dir=str(tmp_path / "src"), create=True,
                                      start="snapshot")).start()
    try:
        started(src)
        run_sql(url, ADD_EACH_TYPE, "UPDATE t SET v = 'between' WHERE id = 1",
                "INSERT INTO t (id, v, n, label) VALUES (201, 'new', 1, 'own')", "INSERT INTO t (id, v) VALUES (202, 'x')")
        wait_until(lambda: _has_row(cluster, 202), timeout=60, what="the source to send row 202")
        ts1 = _ts(cluster)
        sums1 = checksum.checksum(url, schema=Replay().apply(cluster.binlogs()).schema())
        run_sql(url, "ALTER TABLE t ALTER COLUMN n SET DEFAULT 9, ALTER COLUMN label DROP DEFAULT",
                "UPDATE t SET v = 'later' WHERE id = 2", "INSERT INTO t (id, v, label) VALUES (203, 'after', 'l')")
        wait_until(lambda: _has_row(cluster, 203), timeout=60, what="the source to send row 203")
        end = _ts(cluster)
    finally:
        src.stop()
    rows = {r[0]: r[1:] for r in run_sql(url, "SELECT id, n, label, plain FROM t WHERE id IN (3, 203)")}
    assert rows == {3: (7, "it's", None), 203: (9, "l", None)}  # what the upstream shows
    replay = Replay().apply(cluster.binlogs())
    schema = replay.schema()
    cols = {c.name: c for c in schema["t"].columns}
    assert cols["n"].default_value.value.int_value == 9 and cols["n"].existing_value.int_value == 7
    assert cols["created"].default_value.expr == "now()" and cols["created"].existing_value.datetime_micros > 0
    assert replay.checksums() == checksum.checksum(url, schema=schema)

    def passed() -> bool:
        try:
            lake_source.check_pumps(plan_window(cluster.registry.addr, 0, end))
        except errors.FailedPrecondition:
            return False
        return True

    wait_until(passed, 30, 0.1, "the Pump's safe ts to pass the end")
    lake = str(tmp_path / "lake")
    ingest.ingest_window(spark, lake, cluster.registry.addr, t0, end + 1, partitions=1)
    # Restored after the ADD COLUMNs and before SET DEFAULT, then at the end: equal to the upstream then.
    for ts, want in ((ts1, sums1), (end, checksum.checksum(url, ["t"], schema=schema))):
        target = f"sqlite:///{tmp_path / f'r{ts}.db'}"
        assert cli.main(["restore", "--lake", lake, "--ts", str(ts), "--target", target]) == 0
        assert checksum.checksum(target, ["t"], schema=schema) == want
    # An apply to another PostgreSQL database: binlake diff finds nothing.
    applied = pg.create_database("pgdefaults_applied")
    runner.Applier(spark, task.Task(name="pgdefaults", lake=lake, target=applied, mode="consistent")).run()
    report = diff.diff_databases(url, applied, tables=["t"])
    assert report.ok, report.summary()
