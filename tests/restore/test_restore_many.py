"""Restores of many tables: one pass over the lake, against the upstream's own state.

One SQLite upstream runs the ``mixed`` workload over 300 tables (rows, key
changes, and DDL: tables created, renamed, truncated and dropped) in two
slices through TxnWriter and two Pumps, captured between them (``conftest``).
The restore at the mid-workload capture must equal the upstream there, into a
database and as Delta tables; a subset must read nothing of the other tables
beyond the shared scan; a restore killed (exit as kill -9) while tables are
being written must leave only whole tables, and its rerun must finish.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from conftest import Upstream, ingest_all, run_captured
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from binlake import oracle
from binlake.restore import checks, direct, restore
from binlake.source import workload as wl
from binlake.source.workload_ops import DDL
from binlake.testing.devcluster import DevCluster

TABLES = 300
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def many(cluster: DevCluster, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[Upstream, str, list[DDL]]]:
    root = tmp_path_factory.mktemp("many")
    args = {"large_txn_rows": 20, "large_txn_every": 0, "ddl_every": 5, "table_rows": 2, "accounts": 4}
    setup = len(wl.plan("mixed", TABLES, 0, 1, **args))  # the CREATE TABLEs and first rows
    plan = wl.plan("mixed", TABLES, 200, 1, **args)
    cut = setup + 130  # mid-workload: after tables were created, renamed, truncated, dropped
    up = run_captured(f"sqlite:///{root / 'up.db'}", cluster.registry_addr, plan, 2, None, clients=4, at=[cut])
    a, b = up.start_ts, up.end_ts
    lake = str(root / "lake")
    ingest_all(spark, lake, cluster.registry_addr, [a, (a + b) // 2, b])
    ddls = [op for t in plan[setup:cut] for op in t.ops if isinstance(op, DDL)]
    yield up, lake, ddls


def test_a_restore_of_300_tables_equals_the_upstream_mid_workload(
        spark: SparkSession, many: tuple[Upstream, str, list[DDL]], tmp_path: pathlib.Path) -> None:
    up, lake, ddls = many
    cap = up.captures[0]
    kinds = {d.action for d in ddls}
    assert {"create_table", "rename_table", "truncate_table", "drop_table"} <= kinds, kinds
    assert len(cap.checksums) >= TABLES - 10
    target = f"sqlite:///{tmp_path / 'restored.db'}"
    result = restore.run(spark, lake, cap.ts, target=target)
    assert {t.split(".")[1] for t, _n, _b in result.tables} == set(cap.checksums)
    assert oracle.checksum(target, list(cap.checksums)) == cap.checksums
    out = tmp_path / "out"
    restore.run(spark, lake, cap.ts, out=str(out), parallelism=4)
    for t in restore.plan(spark, lake, cap.ts).tables:
        got = checks.delta_checksum(restore.out_path(str(out), t.info), t.info)
        assert got == cap.checksums[t.info.name], t.name


def _jobs(spark: SparkSession) -> int:
    ids = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    return max(ids) + 1 if ids else 0


def test_a_subset_reads_nothing_of_the_other_tables_beyond_the_shared_scan(
        spark: SparkSession, many: tuple[Upstream, str, list[DDL]], tmp_path: pathlib.Path) -> None:
    up, lake, _ = many
    cap = up.captures[0]
    names = sorted(cap.checksums)[:3]
    p_all = restore.plan(spark, lake, cap.ts)
    p_sub = restore.plan(spark, lake, cap.ts, names)
    chosen = {t.table_id for t in p_sub.tables}
    # What leaves the shared scan: only the chosen tables' rows, one per key.
    shared = restore.shared_changes(spark, p_sub)
    per_table = {r["table_id"]: r["n"] for r in shared.groupBy("table_id").agg(F.count("*").alias("n")).collect()}
    assert set(per_table) <= chosen
    assert sum(per_table.values()) == sum(cap.checksums[n][0] for n in names)
    # Spark jobs do not grow with the tables restored: 3 tables or all of them.
    before = _jobs(spark)
    sub = restore.load_target(spark, p_sub, restore.open_target(f"sqlite:///{tmp_path / 'sub.db'}"), "sub")
    mid = _jobs(spark)
    restore.load_target(spark, p_all, restore.open_target(f"sqlite:///{tmp_path / 'all.db'}"), "all")
    after = _jobs(spark)
    # Tables with a retyped column take the typed Spark rebuild (a few jobs each); the
    # others add none: 300 tables cost the 3 tables' jobs plus those few.
    typed = [t for t in p_all.tables if not direct.eligible(p_all.schema, t.table_id, p_all.ts, t.base)]
    assert len(typed) < 20
    assert after - mid <= mid - before + 2 * len(typed) + 2, (mid - before, after - mid, len(typed))
    assert {t for t, _n, _b in sub.tables} == {t.name for t in p_sub.tables}
    assert oracle.checksum(f"sqlite:///{tmp_path / 'sub.db'}", names) == {n: cap.checksums[n] for n in names}


def test_a_restore_killed_mid_way_leaves_only_whole_tables_and_the_rerun_finishes(
        many: tuple[Upstream, str, list[DDL]], spark: SparkSession, tmp_path: pathlib.Path) -> None:
    up, lake, _ = many
    cap = up.captures[0]
    out = tmp_path / "out"
    cmd = [shutil.which("binlake") or "binlake", "restore", "--lake", lake, "--ts", str(cap.ts), "--out", str(out),
           "--parallel", "4", "--json"]
    env = {**os.environ, "BINLAKE_FAILPOINT": "restore-after-table:exit:40"}
    killed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == 137, killed.stderr[-2000:]
    assert not (out / restore.MANIFEST).exists()
    plan = {t.name: t for t in restore.plan(spark, lake, cap.ts).tables}
    # A table is visible once its log holds a commit; a write the kill cut short may
    # leave data files and an empty _delta_log, which no reader takes for a table.
    visible = [d for d in out.iterdir() if any((d / "_delta_log").glob("*.json"))]
    assert 40 <= len(visible) < len(plan)
    for d in visible:  # every table a reader can see is whole
        t = plan[d.name]
        assert checks.delta_checksum(str(d), t.info) == cap.checksums[t.info.name], d.name
    rerun = subprocess.run([*cmd, "--replace"], capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    manifest = json.loads((out / restore.MANIFEST).read_text())
    assert manifest["rows"] == sum(n for n, _ in cap.checksums.values())
    assert len(manifest["tables"]) == len(plan)
