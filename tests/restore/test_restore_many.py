"""Restores of many tables: one pass over the lake, against the upstream's own state.

A SQLite upstream written through TxnWriter (so every change reaches the Pumps)
gets 300 tables and their rows in a few large transactions, then tables renamed,
truncated, dropped and created and keys moved; its state is captured there (the
writer idle, a TSO taken, the checksums read), and more changes and DDL follow
that a restore at the capture must not show. One ingest window holds it all.

The restore at the capture must equal the upstream there, into a database and as
Delta tables; a subset must read nothing of the other tables beyond the shared
scan; a restore killed (exit as kill -9) while tables are being written must leave
only whole tables, and its rerun must finish.

The checks read the restored Delta tables with delta-rs (``checks.delta_checksum``)
and the databases with ``binlake.sql.checksum``: no Spark job per table.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import ingest_all
from pumpkit import wait_cluster_safe
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from binlake.registry.client import RegistryClient
from binlake.restore import checks, direct, restore
from binlake.restore import tables as restore_tables
from binlake.sql import checksum
from binlake.sql import schema as sc
from binlake.testing.devcluster import DevCluster
from binlake.writer.txn_writer import Txn, TxnWriter

TABLES = 300
ROWS = 4  # per table: the point is the table count, not the rows
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

COLS = [sc.ColumnDef("id", "int", False), sc.ColumnDef("v", "string", True, length=40), sc.ColumnDef("n", "int")]


@dataclasses.dataclass(frozen=True)
class Many:
    lake: str
    ts: int  # the capture: every change before it committed below it, every later one above
    checksums: dict[str, tuple[int, str]]  # the upstream's tables at ``ts``


def _rows(name: str, ids: range, tag: str) -> list[dict[str, object]]:
    return [{"id": i, "v": f"{name}-{tag}-{i}", "n": i} for i in ids]


@pytest.fixture(scope="module")
def many(cluster: DevCluster, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Many]:
    root = tmp_path_factory.mktemp("many")
    url = f"sqlite:///{root / 'up.db'}"
    names = [f"t{i:03d}" for i in range(TABLES)]
    with RegistryClient(cluster.registry_addr) as reg, TxnWriter(url, registry=cluster.registry_addr) as w:
        start = reg.get_ts()
        for n in names:
            w.create_table(n, COLS, ["id"])

        def fill(t: Txn) -> None:  # one transaction over every table
            for n in names:
                t.insert_many(n, _rows(n, range(ROWS), "a"))

        w.run(fill)
        # Along the way: tables renamed, truncated, dropped and created; rows changed
        # and keys moved after the truncate, in the renamed and the new tables.
        w.rename_table("t001", "r001")
        w.truncate_table("t002")
        w.drop_table("t003")
        w.create_table("late", COLS, ["id"])
        w.drop_table("t004")
        w.create_table("t004", COLS, ["id"])  # the name again, a new table

        def change(t: Txn) -> None:
            t.insert_many("t002", _rows("t002", range(10, 13), "b"))
            t.insert_many("late", _rows("late", range(3), "b"))
            t.insert_many("t004", _rows("t004", range(2), "b"))
            t.update("r001", {"id": 0}, {"id": 100, "v": "moved"})
            t.delete("t005", {"id": 1})
            for n in names[10:]:
                t.update(n, {"id": 2}, {"v": f"{n}-b"})

        w.run(change)
        cut = reg.get_ts()
        checksums = checksum.checksum(url)
        # After the capture: what a restore at it must not show.
        w.run(lambda t: [t.update(n, {"id": 3}, {"v": "after"}) for n in names[10:]])
        w.rename_table("t006", "r006")
        w.truncate_table("t007")
        w.drop_table("t008")
        w.create_table("later", COLS, ["id"])
        end = reg.get_ts()
    wait_cluster_safe(cluster.registry_addr, end)
    lake = str(root / "lake")
    ingest_all(spark, lake, cluster.registry_addr, [start, end + 1])
    yield Many(lake, cut, checksums)


def test_a_restore_of_300_tables_equals_the_upstream_mid_workload(
        spark: SparkSession, many: Many, tmp_path: pathlib.Path) -> None:
    assert len(many.checksums) == TABLES  # t003 and the first t004 dropped; late and the second t004 created
    assert {"r001", "late", "t004", "t006", "t007", "t008"} <= set(many.checksums)
    assert many.checksums["t002"][0] == 3 and many.checksums["r001"][0] == ROWS
    target = f"sqlite:///{tmp_path / 'restored.db'}"
    result = restore.run(spark, many.lake, many.ts, target=target)
    assert {t.split(".")[1] for t, _n, _b in result.tables} == set(many.checksums)
    assert checksum.checksum(target, list(many.checksums)) == many.checksums
    out = tmp_path / "out"
    restore.run(spark, many.lake, many.ts, out=str(out), parallelism=4)
    for t in restore.plan(spark, many.lake, many.ts).tables:
        got = checks.delta_checksum(restore.out_path(str(out), t.info), t.info)
        assert got == many.checksums[t.info.name], t.name


def _jobs(spark: SparkSession) -> int:
    ids = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    return max(ids) + 1 if ids else 0


def test_a_subset_reads_nothing_of_the_other_tables_beyond_the_shared_scan(
        spark: SparkSession, many: Many, tmp_path: pathlib.Path) -> None:
    names = ["r001", "t002", "t100"]
    p_all = restore.plan(spark, many.lake, many.ts)
    p_sub = restore.plan(spark, many.lake, many.ts, names)
    chosen = {t.table_id for t in p_sub.tables}
    # What leaves the shared scan: only the chosen tables' rows, one per live key (r001's
    # moved key 0 and t002's rows before the truncate are gone already).
    shared = restore_tables.shared_changes(spark, p_sub)
    per_table = {r["table_id"]: r["n"] for r in shared.groupBy("table_id").agg(F.count("*").alias("n")).collect()}
    assert set(per_table) == chosen
    assert sum(per_table.values()) == sum(many.checksums[n][0] for n in names)
    # Spark jobs do not grow with the tables restored: 3 tables or all of them (every
    # table here is decoded from the one-pass result, none takes a typed rebuild).
    assert all(direct.eligible(p_all.schema, t.table_id, p_all.ts, t.base) for t in p_all.tables)
    before = _jobs(spark)
    sub = restore.load_target(spark, p_sub, restore.open_target(f"sqlite:///{tmp_path / 'sub.db'}"), "sub")
    mid = _jobs(spark)
    restore.load_target(spark, p_all, restore.open_target(f"sqlite:///{tmp_path / 'all.db'}"), "all")
    after = _jobs(spark)
    assert after - mid <= mid - before + 2, (mid - before, after - mid)
    assert {t for t, _n, _b in sub.tables} == {t.name for t in p_sub.tables}
    assert checksum.checksum(f"sqlite:///{tmp_path / 'sub.db'}", names) == {n: many.checksums[n] for n in names}


def test_a_restore_killed_mid_way_leaves_only_whole_tables_and_the_rerun_finishes(
        many: Many, spark: SparkSession, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "binlake.cli", "restore", "--lake", many.lake, "--ts", str(many.ts),
           "--out", str(out), "--parallel", "4", "--json"]
    env = {**os.environ, "BINLAKE_FAILPOINT": "restore-after-table:exit:40"}
    killed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == 137, killed.stderr[-2000:]
    assert not (out / restore.MANIFEST).exists()
    plan = {t.name: t for t in restore.plan(spark, many.lake, many.ts).tables}
    # A table is visible once its log holds a commit; a write the kill cut short may
    # leave data files and an empty _delta_log, which no reader takes for a table.
    visible = [d for d in out.iterdir() if any((d / "_delta_log").glob("*.json"))]
    assert 40 <= len(visible) < len(plan)
    for d in visible:  # every table a reader can see is whole
        t = plan[d.name]
        assert checks.delta_checksum(str(d), t.info) == many.checksums[t.info.name], d.name
    rerun = subprocess.run([*cmd, "--replace"], capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    manifest = json.loads((out / restore.MANIFEST).read_text())
    assert manifest["rows"] == sum(n for n, _ in many.checksums.values())
    assert len(manifest["tables"]) == len(plan)
