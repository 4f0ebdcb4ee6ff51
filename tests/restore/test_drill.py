"""Restore drills: an untouched lake passes every proof, and a drill fails with its one
line for each reason it exists: a change row deleted from the lake (the restore paths
disagree), a row changed by hand in an apply target (the apply proof), a snapshot
file removed (the restore fails), an objective below what the machine can do.

One small lake for the module: a ``mixed`` workload (DDL included) through two Pumps,
one window ingested, a snapshot inside it, the history tables, and one apply
target (SQLite) with a route that renames a table. Each damage is undone after its
test (Delta's RESTORE, the file put back), so the tests share it in any order.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import sqlite3
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
from conftest import Upstream, ingest_all, run_captured
from pyspark.sql import SparkSession

from binlake import cli
from binlake.drill.run import choose
from binlake.lake.store import drills
from binlake.replicate import runner, task
from binlake.restore import history, rebuild, snapshot
from binlake.testing.devcluster import DevCluster
from binlake.workload import plan as wplan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


class Lake:
    def __init__(self, up: Upstream, lake: str, task_file: pathlib.Path, target: str, snapshot_ts: int) -> None:
        self.up, self.lake, self.task_file, self.target, self.snapshot_ts = up, lake, task_file, target, snapshot_ts

    def argv(self, *more: str, tasks: bool = True, upstream: bool = True) -> list[str]:
        """A drill of this lake; ``tasks``/``upstream`` False: without the apply or the
        upstream proof (a test of another proof spares their Spark jobs)."""
        return ["drill", "--lake", self.lake, *(["--tasks", str(self.task_file)] if tasks else []),
                *(["--upstream", self.up.url] if upstream else []), "--registry", self.up.registry, "--json", *more]


@pytest.fixture(scope="module")
def drill_lake(cluster: DevCluster, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    root = tmp_path_factory.mktemp("drill")
    plan = wplan.plan("mixed", 1, 50, 3, large_txn_rows=30, large_txn_every=25, ddl_every=15, table_rows=30,
                      accounts=10)
    up = run_captured(f"sqlite:///{root / 'up.db'}", cluster.registry_addr, plan, 2, None)
    # One window (each ingest is a few Spark jobs and waits on the Pumps); the snapshot
    # splits it, so the snapshot path has changes after its base.
    lake = str(root / "lake")
    ingest_all(spark, lake, cluster.registry_addr, [up.start_ts, up.end_ts])
    snapshot.take(spark, lake, up.captures[0].ts)
    history.update(spark, lake)
    target = f"sqlite:///{root / 'replica.db'}"
    doc = {"name": "replica", "lake": lake, "target": target, "mode": "consistent",
           "routes": [{"schema_pattern": "*", "table_pattern": "accounts", "target_table": "accounts_copy"}]}
    t = task.parse(doc)
    runner.Applier(spark, t).run()
    task_file = root / "replica.toml"
    task_file.write_text(
        f'name = "replica"\nlake = "{lake}"\ntarget = "{target}"\nmode = "consistent"\n'
        '[[routes]]\nschema_pattern = "*"\ntable_pattern = "accounts"\ntarget_table = "accounts_copy"\n')
    yield Lake(up, lake, task_file, target, up.captures[0].ts)


def run_drill(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, Any] | None, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 and out.strip() else None), err.strip()


def test_an_untouched_lake_passes_every_proof(
        drill_lake: Lake, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    report = tmp_path / "drills.html"
    # At the lake's end every table is quiet since the ts: the upstream proof compares them all.
    code, d, err = run_drill(capsys, drill_lake.argv("--ts", str(drill_lake.up.end_ts - 1), "--seed", "5",
                                                     "--count", "2", "--report", str(report)))
    assert code == 0, err
    assert d is not None and d["verdict"] == "passed"
    proofs = d["details"]["proofs"]
    tables = d["tables"].split(",")
    # Every proof compared something: the whole history, the snapshot path and the history
    # tables; the routed apply target; the upstream.
    assert proofs["paths"]["verdict"] == "passed" and proofs["paths"]["compared"] >= 2 * len(tables)
    assert proofs["apply"]["verdict"] == "passed" and proofs["apply"]["compared"] >= 1
    assert proofs["upstream"]["verdict"] == "passed" and proofs["upstream"]["compared"] == len(tables)
    assert d["rows"] > 0 and d["bytes"] > 0 and d["restore_s"] > 0 and 0 < d["proving_share"] < 1
    assert d["seed"] == 5 and d["rpo_s"] is not None
    # Recorded: the drills table, lake status (and its JSON), the report's plots.
    rows = drills.read(drill_lake.lake)
    assert rows[-1]["drill_id"] == d["drill_id"] and rows[-1]["verdict"] == "passed"
    assert cli.main(["lake", "status", "--lake", drill_lake.lake, "--registry", drill_lake.up.registry]) == 0
    out = capsys.readouterr().out
    assert re.search(r"last drill\s+.*passed", out), out
    assert cli.main(["lake", "status", "--lake", drill_lake.lake, "--registry", drill_lake.up.registry,
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["last_drill"]["drill_id"] == d["drill_id"]
    page = parse_report(report)
    assert set(page.plots) == {"plot-restore_s", "plot-rpo_s"}
    assert [float(v) for v in page.plots["plot-restore_s"]] == pytest.approx([r["restore_s"] for r in rows], rel=1e-4)
    assert page.rows == len(rows) and not page.external


class Report(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, list[str]] = {}
        self.rows = 0
        self.external = False
        self._svg: str | None = None
        self._tbody = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "svg":
            self._svg = a.get("id") or ""
            self.plots[self._svg] = []
        elif tag == "circle" and self._svg is not None:
            self.plots[self._svg].append(str(a["data-value"]))
        elif tag == "tbody":
            self._tbody = True
        elif tag == "tr" and self._tbody:
            self.rows += 1
        if tag in ("script", "link", "img") or any(k in ("src", "href") for k in a):
            self.external = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._svg = None


def parse_report(path: pathlib.Path) -> Report:
    r = Report()
    r.feed(path.read_text(encoding="utf-8"))
    return r


def last_failure(lake: str) -> dict[str, Any]:
    row = drills.read(lake)[-1]
    assert row["verdict"] == "failed"
    return row


def test_a_row_changed_by_hand_in_an_apply_target_fails_the_apply_proof(
        drill_lake: Lake, capsys: pytest.CaptureFixture[str]) -> None:
    path = drill_lake.target.removeprefix("sqlite:///")
    db = sqlite3.connect(path)
    (key, old), = db.execute("SELECT id, owner FROM accounts_copy ORDER BY id LIMIT 1").fetchall()
    db.execute("UPDATE accounts_copy SET owner = 'changed by hand' WHERE id = ?", (key,))
    db.commit()
    try:
        code, _d, err = run_drill(capsys, drill_lake.argv("--tables", "accounts", "--ts", str(drill_lake.up.end_ts - 1),
                                                          upstream=False))
    finally:
        db.execute("UPDATE accounts_copy SET owner = ? WHERE id = ?", (old, key))
        db.commit()
        db.close()
    assert code == 2
    line = err.splitlines()[-1]
    assert "proof (apply)" in line and "accounts_copy" in line and f'key ["{key}"]' in line, err
    assert f'["{key}"]' in (last_failure(drill_lake.lake)["proof_apply"] or "")


def test_a_change_row_deleted_from_the_lake_fails_the_paths_proof(
        drill_lake: Lake, spark: SparkSession, capsys: pytest.CaptureFixture[str]) -> None:
    # The last change of a row that nothing touched after the snapshot: the whole history
    # then rebuilds that row differently, the snapshot path (and the apply) as before. The
    # drill sums the history from the proven snapshot: the rows below it no longer digest
    # as recorded, and the table's history rebuilt key by key names the row.
    path = os.path.join(drill_lake.lake, "changes")
    tbl, version = _delete_last_change_below_snapshot(drill_lake, spark)
    try:
        code, _d, err = run_drill(capsys, drill_lake.argv("--tables", tbl, "--ts", str(drill_lake.up.end_ts - 1),
                                                          tasks=False, upstream=False))
    finally:
        spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF {version}")
    assert code == 2, err
    line = err.splitlines()[-1]
    assert "proof (paths)" in line and tbl in line and "key [" in line and "whole history" in line, err


def test_each_snapshot_table_is_proven_against_its_whole_history_rebuilt_key_by_key(
        drill_lake: Lake, spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    from binlake.restore import proven, restore, sparksum
    from binlake.restore import tables as restore_tables

    s = drill_lake.snapshot_ts
    entries = [e for e in snapshot.catalog(spark, drill_lake.lake) if e.snapshot_ts == s and e.table_id]
    assert entries and all(e.proof is not None for e in entries)
    # The recorded sum (change rows added and taken away, no grouping by key) equals the
    # table rebuilt key by key from the whole history, for a workload with DDL.
    p = restore.plan(spark, drill_lake.lake, s, None, "changes")
    frames = restore_tables.frames(spark, p)
    rebuilt = sparksum.frames_checksums([(t.info.name, frames[t.table_id], t.info) for t in p.tables])
    by_id = {t.table_id: t.info.name for t in p.tables}
    changes = rebuild.changes_frame(spark, drill_lake.lake).filter(F.col("commit_ts") <= s)
    counts = {int(r["table_id"]): int(r["n"]) for r in changes.groupBy("table_id").agg(F.count("*").alias("n")).collect()}
    for e in entries:
        assert e.proof is not None
        assert e.proof.whole[:2] == rebuilt[by_id[e.table_id]][:2], e.tbl
        assert e.proof.changes[0] == counts.get(e.table_id, 0), e.tbl
        assert e.proof.columns == proven.signature(e.info) and e.proof.chained_from_ts == 0


def test_small_tables_summed_in_this_process_equal_their_sums_in_spark(
        drill_lake: Lake, spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    from binlake import tso
    from binlake.restore import layout, proven, sparksum

    lake, s, end = drill_lake.lake, drill_lake.snapshot_ts, drill_lake.up.end_ts - 1
    schema = rebuild.load_schema(spark, lake, tso.MAX_TS)
    asks = [(f"{i.db}.{i.name}", tid, end) for tid, i in sorted(rebuild.tables_at(schema, end).items())]
    summed_here: list[str] = []
    terms = proven._driver_terms

    def spy(spark_: Any, changes: Any, schema_: Any, tables: Any) -> Any:
        summed_here.extend(t[0] for t in tables)
        return terms(spark_, changes, schema_, tables)

    monkeypatch.setattr(proven, "_driver_terms", spy)
    # From the lake's start and from the proven snapshot (its recorded sums plus the terms
    # after it): the same whole history either way.
    records = {(e.snapshot_ts, e.table_id): e.proof for e in snapshot.catalog(spark, lake) if e.proof is not None}
    for recs in ({}, records):
        here, _ = proven.measure(spark, lake, schema, asks, recs, driver=True)
        there, _ = proven.measure(spark, lake, schema, asks, recs, driver=False)
        assert {n: w.sum for n, w in here.items()} == {n: w.sum for n, w in there.items()}
    ready = {n for n, t, ts in asks if proven.driver_ready(schema, t, ts)}
    # Some tables went through this process; those a JSON column or a retyped column keeps
    # in Spark did not.
    assert ready and set(summed_here) == ready and len(ready) < len(asks), (ready, asks)
    # A snapshot table summed here from its files equals its sum in Spark.
    compared = 0
    for e in snapshot.catalog(spark, lake):
        if e.snapshot_ts != s or not e.table_id:
            continue
        path = layout.snapshot_table(lake, s, e.table_id)
        mine = proven.table_sum(path, e.info)
        if mine is None:
            continue
        frame = spark.read.format("delta").load(path)
        assert mine == sparksum.frames_checksums([("t", frame, e.info)])["t"], e.tbl
        compared += 1
    assert compared >= 1


def test_a_wide_table_summed_in_this_process_equals_its_sum_in_spark(
        spark: SparkSession, tmp_path: pathlib.Path) -> None:
    """Every type ``proven.DRIVER_TYPES`` admits (ints, strings, decimals, a double,
    datetimes, a date, nulls): its terms and its snapshot table summed here and in Spark."""
    from binlake import tso
    from binlake.restore import layout, proven, sparksum, synthetic

    lake = str(tmp_path / "wide")
    last = synthetic.build_lake(spark, lake, 1500, 3000, 400_000_000_000_000_000, shape="wide")
    schema = rebuild.load_schema(spark, lake, tso.MAX_TS)
    ((table_id, info),) = rebuild.tables_at(schema, last).items()
    assert {c.type for c in info.columns} == set(proven.DRIVER_TYPES)
    assert proven.driver_ready(schema, table_id, last)
    asks = [("w", table_id, last)]
    here, _ = proven.measure(spark, lake, schema, asks, {}, driver=True)
    there, _ = proven.measure(spark, lake, schema, asks, {}, driver=False)
    assert here["w"].sum == there["w"].sum and here["w"].sum[0] == 1500
    # The snapshot proves itself (both sides here); its table, summed here, equals Spark's sum.
    snapshot.take(spark, lake, last)
    path = layout.snapshot_table(lake, last, table_id)
    mine = proven.table_sum(path, info)
    assert mine is not None
    assert mine == sparksum.frames_checksums([("t", spark.read.format("delta").load(path), info)])["t"]
    assert mine[:2] == there["w"].sum[:2]


def _delete_last_change_below_snapshot(drill_lake: Lake, spark: SparkSession) -> tuple[str, int]:
    """Delete the last change of a row that nothing touched after the snapshot; returns
    the table's name and the changes table's version to RESTORE."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    changes = DeltaTable.forPath(spark, os.path.join(drill_lake.lake, "changes"))
    version = changes.history(1).collect()[0]["version"]
    end = drill_lake.up.end_ts - 1
    alive = rebuild.tables_at(rebuild.load_schema(spark, drill_lake.lake, end), end)
    last = (changes.toDF().filter(F.col("table_id").isin(list(alive)) & F.col("keys").isNotNull())
            .groupBy("table_id", "tbl", "keys")
            .agg(F.max("commit_ts").alias("ts")).filter(f"ts < {drill_lake.snapshot_ts}").orderBy("ts", "table_id", "keys")
            .limit(1).collect())
    assert last, "every row of the workload changed after the snapshot"
    keys, ts = last[0]["keys"], last[0]["ts"]
    changes.delete((F.col("table_id") == last[0]["table_id"]) & (F.col("keys") == keys) & (F.col("commit_ts") == ts))
    return alive[last[0]["table_id"]].name, version


def test_a_change_row_deleted_below_a_proven_snapshot_fails_the_next_snapshot(
        drill_lake: Lake, spark: SparkSession) -> None:
    tbl, version = _delete_last_change_below_snapshot(drill_lake, spark)
    at = drill_lake.up.end_ts - 1
    try:
        with pytest.raises(snapshot.SnapshotDisproved) as info:
            snapshot.take(spark, drill_lake.lake, at)
    finally:
        spark.sql(f"RESTORE TABLE delta.`{os.path.join(drill_lake.lake, 'changes')}` TO VERSION AS OF {version}")
        shutil.rmtree(pathlib.Path(drill_lake.lake) / "snapshots" / f"ts={at}", ignore_errors=True)
    line = str(info.value)
    # Below the proven snapshot the rows no longer digest as recorded (or, for a table whose
    # columns changed since, its history summed from the lake's start misses the row).
    assert f".{tbl} " in line and "\n" not in line, line
    assert "changed since it was proven" in line or "does not equal its whole history" in line, line
    # Not taken: no marker, so no restore uses it.
    assert all(e.snapshot_ts != at for e in snapshot.catalog(spark, drill_lake.lake))


def test_a_before_image_that_does_not_follow_its_key_fails_the_paths_proof(
        drill_lake: Lake, spark: SparkSession, capsys: pytest.CaptureFixture[str]) -> None:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    path = os.path.join(drill_lake.lake, "changes")
    changes = DeltaTable.forPath(spark, path)
    version = changes.history(1).collect()[0]["version"]
    end = drill_lake.up.end_ts - 1
    alive = rebuild.tables_at(rebuild.load_schema(spark, drill_lake.lake, end), end)
    # An update after the snapshot that did not move its row: its before image is read by
    # no rebuild (only a moved key's is), so the restore and every rebuild stay as they were.
    row = (changes.toDF().filter(F.col("table_id").isin(list(alive)) & (F.col("op") == "update")
                                 & (F.col("commit_ts") > drill_lake.snapshot_ts) & (F.col("before") != F.col("after")))
           .orderBy("commit_ts", "seq").limit(1).collect())
    assert row, "no update after the snapshot"
    r = row[0]
    changes.update((F.col("commit_ts") == r["commit_ts"]) & (F.col("seq") == r["seq"]) &
                   (F.col("table_id") == r["table_id"]), {"before": F.col("after")})
    tbl = alive[r["table_id"]].name
    try:
        code, _d, err = run_drill(capsys, drill_lake.argv("--tables", tbl, "--ts", str(end), tasks=False,
                                                          upstream=False))
    finally:
        spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF {version}")
    assert code == 2, err
    line = err.splitlines()[-1]
    assert "proof (paths)" in line and tbl in line and "before image" in line, err


def test_an_objective_below_what_the_machine_can_do_fails_the_drill(
        drill_lake: Lake, spark: SparkSession, capsys: pytest.CaptureFixture[str]) -> None:
    code, _d, err = run_drill(capsys, drill_lake.argv("--seed", "2", "--count", "1", "--rto-s", "0.001",
                                                      tasks=False, upstream=False))
    assert code == 2
    assert "RTO objective missed" in err.splitlines()[-1] and "rto_s 0.001s" in err, err
    row = last_failure(drill_lake.lake)
    assert "RTO objective missed" in (row["failure"] or "")
    # The recorded seed and until-ts draw the same ts and tables again (a replay).
    again = choose(spark, drill_lake.lake, ts=None, tables=None, seed=row["seed"], until_ts=row["until_ts"], count=1)
    assert (again.ts, ",".join(again.tables)) == (row["ts"], row["tables"]) and row["seed"] == 2
    other = choose(spark, drill_lake.lake, ts=None, tables=None, seed=None, until_ts=None, count=1)
    assert other.seed is not None and other.until_ts >= row["until_ts"]


def test_a_snapshot_file_removed_fails_the_restore(drill_lake: Lake, capsys: pytest.CaptureFixture[str]) -> None:
    snaps = pathlib.Path(drill_lake.lake) / "snapshots"
    files = sorted(p for p in snaps.rglob("*.parquet") if "accounts" in str(p) or "_delta_log" not in str(p))
    victim = files[0]
    kept = victim.with_name(victim.name + ".moved")
    victim.rename(kept)
    try:
        code, _d, err = run_drill(capsys, drill_lake.argv("--ts", str(drill_lake.up.end_ts - 1), tasks=False,
                                                          upstream=False))
    finally:
        kept.rename(victim)
    assert code == 2
    assert "restore at" in err.splitlines()[-1] and "failed" in err.splitlines()[-1], err
    assert last_failure(drill_lake.lake)["verdict"] == "failed"
