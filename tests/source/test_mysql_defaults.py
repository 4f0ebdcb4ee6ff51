"""Column DEFAULTs from a MariaDB upstream through ``binlake source mysql``, the
lake, a restore and an apply.

The reported case first: 200 rows, then ``ADD COLUMN n INT NOT NULL DEFAULT 7``;
``binlake restore --target sqlite:///...`` must succeed and equal the upstream
(it failed with ``NOT NULL constraint failed: t.n`` when definitions carried no
defaults). Then one ADD COLUMN per type with a constant default, an implicit
default (NOT NULL without DEFAULT: MariaDB gives existing rows 0) and
``DEFAULT CURRENT_TIMESTAMP`` (existing rows get the ALTER's time), and a later
``SET DEFAULT`` that only rows inserted after it take.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from pumpkit import wait_until
from srckit import Cluster, Replay, SourceThread, sql
from test_mysql_source import fresh_db, source, wait_caught_up

from binlake import cli, errors
from binlake.registry.client import RegistryClient
from binlake.sql import checksum
from binlake.stack.localdb import LocalMariaDB

pytestmark = [pytest.mark.skipif(not LocalMariaDB.available(), reason="MariaDB not installed (apt-get install "
                                 "mariadb-server); CI always has it"), pytest.mark.slow]

ADD_EACH_TYPE = (
    "ALTER TABLE t ADD COLUMN u BIGINT UNSIGNED DEFAULT 18446744073709551615, "
    "ADD COLUMN price DECIMAL(10,2) NOT NULL DEFAULT 1.5, ADD COLUMN ratio DOUBLE DEFAULT -2.5, "
    "ADD COLUMN label VARCHAR(20) NOT NULL DEFAULT 'it''s', ADD COLUMN raw VARBINARY(4) DEFAULT x'6162', "
    "ADD COLUMN day DATE DEFAULT '2024-02-29', ADD COLUMN at DATETIME(6) NOT NULL DEFAULT '2024-01-02 03:04:05.000006', "
    "ADD COLUMN tod TIME DEFAULT '23:59:58', ADD COLUMN ok BOOL NOT NULL DEFAULT TRUE, "
    "ADD COLUMN doc JSON DEFAULT '{\"a\": 1}', ADD COLUMN zero INT NOT NULL, ADD COLUMN plain INT, "
    "ADD COLUMN created DATETIME DEFAULT CURRENT_TIMESTAMP")


def _ts(cluster: Cluster) -> int:
    with RegistryClient(cluster.registry.addr) as reg:
        return reg.get_ts()


def _wait_safe(cluster: Cluster, ts: int) -> None:
    from binlake.lake.pumps import datasource as lake_source
    from binlake.lake.pumps.planner import plan_window

    def passed() -> bool:
        try:
            lake_source.check_pumps(plan_window(cluster.registry.addr, 0, ts))
        except errors.FailedPrecondition:
            return False
        return True

    wait_until(passed, 30, 0.1, "the Pump's safe ts to pass the end")


def test_added_columns_read_their_defaults_downstream(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path,
                                                      spark: Any) -> None:
    from binlake.lake import ingest
    from binlake.replicate import runner, task
    from binlake.sql import diff

    db = fresh_db(mdb)
    url = mdb.url_for(db)
    sql(mdb, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))", db=db)
    t0 = _ts(cluster)
    src = SourceThread(source(mdb, cluster, tmp_path / "src", db)).start()
    assert src.source.ready.wait(60), "source did not start"
    try:
        sql(mdb, "INSERT INTO t (id, v) SELECT seq, CONCAT('r', seq) FROM seq_1_to_200",
            "ALTER TABLE t ADD COLUMN n INT NOT NULL DEFAULT 7", db=db)
        wait_caught_up(mdb, src.source)
        ts0 = _ts(cluster)
        sums0 = checksum.checksum(url, schema=Replay().apply(cluster.binlogs()).schema())
        sql(mdb, "UPDATE t SET v = 'between' WHERE id = 1", ADD_EACH_TYPE,
            "INSERT INTO t (id, v, n, label, zero) VALUES (201, 'new', 1, 'own', 5)",
            "INSERT INTO t (id, v, zero) VALUES (202, 'x', 0)",
            db=db)
        wait_caught_up(mdb, src.source)
        ts1 = _ts(cluster)
        sums1 = checksum.checksum(url, schema=Replay().apply(cluster.binlogs()).schema())
        sql(mdb, "ALTER TABLE t ALTER COLUMN n SET DEFAULT 9, ALTER COLUMN label DROP DEFAULT",
            "UPDATE t SET v = 'later' WHERE id = 2", "INSERT INTO t (id, v, label, zero) VALUES (203, 'after', 'l', 0)", db=db)
        wait_caught_up(mdb, src.source)
        end = _ts(cluster)
    finally:
        src.stop()
    rows = {r[0]: r[1:] for r in sql(mdb, "SELECT id, n, zero, plain, created IS NOT NULL FROM t", db=db)}
    assert rows[3] == (7, 0, None, 1) and rows[203] == (9, 0, None, 1)  # what the upstream shows
    replay = Replay().apply(cluster.binlogs())
    n_col = next(c for c in replay.table("t")[0].columns if c.name == "n")
    assert n_col.default_value.value.int_value == 9  # the definition follows SET DEFAULT
    _wait_safe(cluster, end)
    lake = str(tmp_path / "lake")
    ingest.ingest_window(spark, lake, cluster.registry.addr, t0, end + 1, partitions=1)
    schema = replay.schema()

    # The reported case, as a user runs it: the restore succeeds and equals the upstream then.
    target0 = f"sqlite:///{tmp_path / 'r0.db'}"
    assert cli.main(["restore", "--lake", lake, "--ts", str(ts0), "--target", target0]) == 0
    assert checksum.checksum(target0, ["t"], schema=schema) == sums0
    # Every type, the implicit default and CURRENT_TIMESTAMP, before the later SET DEFAULT.
    target1 = f"sqlite:///{tmp_path / 'r1.db'}"
    assert cli.main(["restore", "--lake", lake, "--ts", str(ts1), "--target", target1]) == 0
    assert checksum.checksum(target1, ["t"], schema=schema) == sums1
    # At the end, after SET DEFAULT: equal to MariaDB now.
    target2 = f"sqlite:///{tmp_path / 'r2.db'}"
    assert cli.main(["restore", "--lake", lake, "--ts", str(end), "--target", target2]) == 0
    assert checksum.checksum(target2, ["t"], schema=schema) == checksum.checksum(url, ["t"], schema=schema)
    # An apply to another MariaDB database: binlake diff finds nothing.
    applied = mdb.create_database(f"{db}_applied")
    runner.Applier(spark, task.Task(name="mdbdefaults", lake=lake, target=applied, mode="consistent")).run()
    report = diff.diff_databases(url, applied, tables=["t"])
    assert report.ok, report.summary()
