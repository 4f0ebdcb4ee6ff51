"""Column DEFAULTs through the lake: rows that predate an ``ADD COLUMN ... DEFAULT``
read the default the upstream gave them, in a restore, a snapshot, a history table
and an apply; a later ``SET DEFAULT`` changes only rows inserted after it.

The upstream is SQLite written through TxnWriter (the writer's DDL and the
database agree on every value); the truth is the upstream itself, copied at a
TSO taken while every writer is idle.
"""

from __future__ import annotations

import datetime as dt
import decimal
import pathlib
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import ingest_all
from pumpkit import wait_cluster_safe
from pyspark.sql import SparkSession

from binlake.registry.client import RegistryClient
from binlake.replicate import runner, task
from binlake.restore import checks, history, restore, snapshot
from binlake.restore import tables as restore_tables
from binlake.sql import checksum, diff
from binlake.sql import schema as sc
from binlake.testing.devcluster import DevCluster
from binlake.writer.txn_writer import TxnWriter

# A cluster, a TxnWriter upstream and four ingests: minutes on two loaded cores.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# One ADD COLUMN per type, NOT NULL and nullable, each with a constant default.
ADDED = [
    sc.ColumnDef("n", "int", False, default=7),
    sc.ColumnDef("u", "uint", True, default=2**63 + 5),
    sc.ColumnDef("price", "decimal", False, precision=10, scale=2, default=decimal.Decimal("1.50")),
    sc.ColumnDef("ratio", "float", True, default=2.5),
    sc.ColumnDef("label", "string", False, length=20, default="it's"),
    sc.ColumnDef("note", "string", True, default="a\\b"),
    sc.ColumnDef("raw", "bytes", True, default=b"\x00\xff"),
    sc.ColumnDef("day", "date", True, default=dt.date(2024, 2, 29)),
    sc.ColumnDef("at", "datetime", False, default=dt.datetime(2024, 1, 2, 3, 4, 5, 6)),
    sc.ColumnDef("tod", "time", True, default=dt.time(23, 59, 58, 1)),
    sc.ColumnDef("ok", "bool", False, default=True),
    sc.ColumnDef("doc", "json", True, default={"a": [1, "x"]}),
    sc.ColumnDef("plain", "int", True),  # no default: NULL in the rows before
]


def _copy(url: str, to: pathlib.Path) -> str:
    src = sqlite3.connect(url.removeprefix("sqlite:///"))
    dst = sqlite3.connect(to)
    src.backup(dst)
    src.close()
    dst.close()
    return f"sqlite:///{to}"


@pytest.fixture(scope="module")
def defaults_lake(cluster: DevCluster, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("defaults")
    url = f"sqlite:///{root / 'up.db'}"
    with RegistryClient(cluster.registry_addr) as reg, TxnWriter(url, registry=cluster.registry_addr) as w:
        t0 = reg.get_ts()
        w.create_table("items", [sc.ColumnDef("id", "int", False), sc.ColumnDef("v", "string")], ["id"])
        w.run(lambda t: t.insert_many("items", [{"id": i, "v": f"r{i}"} for i in range(1, 41)]))
        ta = reg.get_ts()
        for col in ADDED[:7]:
            w.add_column("items", col)
        w.run(lambda t: t.update("items", {"id": 1}, {"v": "between"}))
        for col in ADDED[7:]:
            w.add_column("items", col)
        # Later rows: some give the new columns, some leave them to their defaults.
        w.run(lambda t: t.insert_many("items", [{"id": 41, "v": "new", "n": 1, "label": "own", "ok": False},
                                                {"id": 42, "v": "new"}]))
        ts1 = reg.get_ts()
        copy1 = _copy(url, root / "cut1.db")
        w.set_default("items", "n", 9)
        w.set_default("items", "label", None)
        w.run(lambda t: t.update("items", {"id": 2}, {"v": "later"}))
        w.run(lambda t: t.insert_many("items", [{"id": 43, "v": "after", "label": "x"}]))
        ts2 = reg.get_ts()
        copy2 = _copy(url, root / "cut2.db")
    wait_cluster_safe(cluster.registry_addr, ts2)
    lake = str(root / "lake")
    # The history tables are built before the columns exist, so the next update adds them.
    ingest_all(spark, lake, cluster.registry_addr, [t0, ta])
    history.update(spark, lake)
    ingest_all(spark, lake, cluster.registry_addr, [ta, ts1 + 1, ts2 + 1])
    yield {"url": url, "lake": lake, "ts1": ts1, "ts2": ts2, "copy1": copy1, "copy2": copy2}


def _checksums(spark: SparkSession, lake: str, ts: int, source: str = "auto") -> dict[str, tuple[int, str]]:
    p = restore.plan(spark, lake, ts, None, source)
    frames = restore_tables.frames(spark, p)
    return {t.info.name: checks.frame_checksum(frames[t.table_id], t.info) for t in p.tables}


def test_the_upstream_filled_the_rows_it_had(defaults_lake: dict[str, Any]) -> None:
    # What the tests below compare with: SQLite gave the 40 rows the defaults, and the
    # later SET DEFAULT only the row inserted after it.
    engine = sa.create_engine(defaults_lake["copy2"])
    with engine.connect() as conn:
        rows = {r[0]: r[1:] for r in conn.exec_driver_sql("SELECT id, n, label, plain FROM items")}
    engine.dispose()
    assert rows[3] == (7, "it's", None) and rows[42] == (7, "it's", None) and rows[43] == (9, "x", None)
    assert rows[41] == (1, "own", None)


def test_restore_into_sqlite_equals_the_upstream_at_both_cuts(
        spark: SparkSession, defaults_lake: dict[str, Any], tmp_path: pathlib.Path) -> None:
    d = defaults_lake
    for ts, copy in ((d["ts1"], d["copy1"]), (d["ts2"], d["copy2"])):
        target = f"sqlite:///{tmp_path / f'r{ts}.db'}"
        result = restore.run(spark, d["lake"], ts, target=target, verify_url=copy)
        assert result.verified is not None and result.verified.startswith("clean"), result.verified
        assert checksum.checksum(target, ["items"], schema=checksum.load_schema(copy)) == checksum.checksum(copy, ["items"])
        assert _checksums(spark, d["lake"], ts) == checksum.checksum(copy, ["items"])


def test_snapshot_and_history_bases_fill_the_same(spark: SparkSession, defaults_lake: dict[str, Any]) -> None:
    d = defaults_lake
    want = checksum.checksum(d["copy2"], ["items"])
    # A snapshot taken before the columns were added, then the changes after it.
    first = spark.read.format("delta").load(f"{d['lake']}/ddl_history").agg({"commit_ts": "min"}).first()[0]
    snapshot.take(spark, d["lake"], first + 1)
    assert _checksums(spark, d["lake"], d["ts2"]) == want
    # The history tables, built before the ADD COLUMNs (in the fixture): the update adds them and
    # gives the versions held what the upstream gave its rows.
    assert "applied" in history.update(spark, d["lake"]).summary()
    assert _checksums(spark, d["lake"], d["ts2"], "history") == want
    assert _checksums(spark, d["lake"], d["ts1"], "history") == checksum.checksum(d["copy1"], ["items"])


def test_apply_creates_the_defaults_and_diff_is_clean(
        spark: SparkSession, defaults_lake: dict[str, Any], tmp_path: pathlib.Path) -> None:
    d = defaults_lake
    target = f"sqlite:///{tmp_path / 'applied.db'}"
    runner.Applier(spark, task.Task(name="defaults", lake=d["lake"], target=target, mode="consistent")).run()
    report = diff.diff_databases(d["copy2"], target, tables=["items"])
    assert report.ok, report.summary()
    # The target's own DEFAULTs are the upstream's now: a row inserted there without the columns gets them.
    # label's DEFAULT was dropped (NOT NULL): an insert must give it, as upstream.
    engine = sa.create_engine(target)
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO items (id, v, label) VALUES (100, 'direct', 'L')")
        row = conn.exec_driver_sql("SELECT n, price, ok, day FROM items WHERE id = 100").one()
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO items (id, v) VALUES (101, 'direct')")
    engine.dispose()
    assert (row[0], decimal.Decimal(str(row[1])), row[2], row[3]) == (9, decimal.Decimal("1.50"), 1, "2024-02-29")
