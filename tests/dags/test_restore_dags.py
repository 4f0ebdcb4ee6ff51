"""Real runs of ``binlake_restore``, ``binlake_undo`` and ``binlake_maintenance`` (``dag.test`` against a
migrated SQLite metadata database) over a synthetic lake (``restore.synthetic``):
one table, 300 rows, 1,500 changes, five ledger windows.

The truth for the restore is a row-by-row SQLite replay of the same changes.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from hookkit import Webhook
from pumpkit import start_registry
from pyspark.sql import SparkSession

from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeRecord
from binlake.restore import layout, snapshot, synthetic

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

DAGS = pathlib.Path(__file__).resolve().parents[2] / "dags"
ROWS, CHANGES = 300, 1500
T0 = 1_800_000_000_000 << 18


@pytest.fixture(scope="module")
def lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    path = str(tmp_path_factory.mktemp("lake"))
    last = synthetic.build_lake(spark, path, ROWS, CHANGES, T0)
    return path, last


def replayed(spark: SparkSession, lake: str, upto: int) -> dict[int, tuple[int, str, Decimal]]:
    """The table at ``upto``: every change applied in commit order, in Python."""
    rows: dict[int, tuple[int, str, Decimal]] = {}
    for r in (spark.read.format("delta").load(f"{lake}/changes").where(f"commit_ts <= {upto}")
              .orderBy("commit_ts").collect()):
        img = json.loads(r["after"])
        rows[img["id"]] = (img["k"], img["c"], Decimal(img["balance"]))
    return rows


@dataclasses.dataclass
class Run:
    state: str
    tasks: dict[str, str]
    xcoms: dict[str, Any]


def _run(dag: Any, conf: dict[str, Any] | None = None) -> Run:
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    dr = dag.test(run_conf=conf) if conf is not None else dag.test()
    with create_session() as session:
        tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == dag.dag_id,
                                                         TaskInstance.run_id == dr.run_id)).all()
        states = {ti.task_id: str(ti.state) if ti.state else "none" for ti in tis}
        xcoms = {x.task_id: x.value for x in session.scalars(
            select(XComModel).where(XComModel.dag_id == dag.dag_id, XComModel.run_id == dr.run_id,
                                    XComModel.key == "return_value"))}
    xcoms = {k: json.loads(v) if isinstance(v, str) else v for k, v in xcoms.items()}
    return Run(str(dr.state), states, xcoms)


@pytest.fixture
def dags(airflow_db: pathlib.Path) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert not bag.import_errors, bag.import_errors
    return bag.dags


def test_restore_dag_rebuilds_the_table_at_a_ts(
        dags: Any, spark: SparkSession, lake: tuple[str, int], tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path, last = lake
    monkeypatch.setenv("BINLAKE_LAKE_DIR", path)
    monkeypatch.setenv("BINLAKE_SPARK_MASTER", "local[2]")
    ts = T0 + 4 * 1000 + 2  # inside a window, between two commits
    out = tmp_path / "out"
    run = _run(dags["binlake_restore"], {"commit_ts": ts, "out": str(out)})
    assert run.state == "success", run.tasks
    assert run.tasks["load"] == "skipped" and run.tasks["verify"] == "skipped"
    assert run.xcoms["rebuild"]["rows"] == ROWS and run.xcoms["resolve"]["ts"] == ts
    got = {r["id"]: (r["k"], r["c"], r["balance"])
           for r in spark.read.format("delta").load(str(out / "main.bench")).collect()}
    assert got == replayed(spark, path, ts)
    assert json.loads((out / "_binlake_restore.json").read_text())["ts"] == ts


@pytest.mark.parametrize(("conf", "failed", "message"), [
    ({"commit_ts": None, "out": "X"}, "resolve", "exactly one"),
    ({"commit_ts": 5, "datetime": "2026-11-21T08:00:00", "out": "X"}, "resolve", "exactly one"),
    ({"commit_ts": T0 + 4 * CHANGES + 10, "out": "X"}, "check_coverage", "ingest"),
    ({"commit_ts": T0 + 8, "tables": "nope", "out": "X"}, "check_coverage", "no table"),
])
def test_restore_dag_refuses_bad_params_and_writes_nothing(
        dags: Any, lake: tuple[str, int], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        conf: dict[str, Any], failed: str, message: str) -> None:
    path, _ = lake
    monkeypatch.setenv("BINLAKE_LAKE_DIR", path)
    out = tmp_path / "never"
    conf = {**conf, "out": str(out)}
    run = _run(dags["binlake_restore"], conf)
    assert run.state == "failed"
    assert run.tasks[failed] == "failed"
    assert run.tasks.get("rebuild") in ("upstream_failed", "none", None)
    assert not out.exists()


def faithful(spark: SparkSession, lake: str, to: pathlib.Path) -> str:
    """A copy of the synthetic lake whose before images are what each key held (a binlog's):
    the synthetic one writes a placeholder there, which only an undo reads."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    for name in ("ddl_history", "windows"):  # Delta tables are directories: copied as files
        shutil.copytree(f"{lake}/{name}", to / name)
    changes = spark.read.format("delta").load(f"{lake}/changes")
    prev = F.lag("after").over(Window.partitionBy("table_id", "keys").orderBy("commit_ts", "seq"))
    (changes.withColumn("before", F.when(F.col("op") == "update", prev)).write.format("delta")
     .partitionBy("commit_date").save(str(to / "changes")))
    return str(to)


def test_undo_dag_plans_in_a_dry_run_then_reverts(
        dags: Any, spark: SparkSession, lake: tuple[str, int], tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Undo every change from the 1000th on: the target must become the table just before it."""
    from binlake.restore import restore
    from binlake.sql import checksum

    path, last = faithful(spark, lake[0], tmp_path / "lake"), lake[1]
    monkeypatch.setenv("BINLAKE_LAKE_DIR", path)
    monkeypatch.setenv("BINLAKE_SPARK_MASTER", "local[2]")
    first = T0 + 4 * 1000
    target = f"sqlite:///{tmp_path / 'now.db'}"
    restore.run(spark, path, last, target=target)
    now = checksum.checksum(target, ["bench"])

    def rows() -> dict[int, tuple[int, str, Decimal]]:
        engine = sa.create_engine(target)
        with engine.connect() as conn:
            got = {int(i): (int(k), str(c), Decimal(str(b)))
                   for i, k, c, b in conn.exec_driver_sql("SELECT id, k, c, balance FROM bench")}
        engine.dispose()
        return got

    then = replayed(spark, path, first - 1)
    assert rows() != then
    conf = {"start": str(first), "end": str(last + 1), "target": target}
    run = _run(dags["binlake_undo"], conf)
    assert run.state == "success" and run.tasks["undo"] == "skipped", run.tasks
    planned = run.xcoms["plan"]
    assert planned["mode"] == "sql" and planned["tables"][0]["planned"]["update"] > 0, planned
    assert planned["sql"].startswith("BEGIN;") and "INSERT INTO" in planned["sql"]
    assert (pathlib.Path(path) / "undo").is_dir() and planned["sql_file"].startswith(path)
    assert checksum.checksum(target, ["bench"]) == now  # a dry run writes nothing
    run = _run(dags["binlake_undo"], {**conf, "dry_run": False})
    assert run.state == "success" and run.tasks["undo"] == "success", run.tasks
    assert run.xcoms["undo"]["mode"] == "undone"
    assert rows() == then
    # A bad param fails the first task, before any Spark work.
    bad = _run(dags["binlake_undo"], {**conf, "target": None, "dry_run": True})
    assert bad.state == "failed" and bad.tasks["check"] == "failed" and bad.tasks.get("plan") != "success", bad


def test_maintenance_dag_snapshots_history_vacuum_and_a_loud_gc_report(
        dags: Any, spark: SparkSession, lake: tuple[str, int], tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path, last = lake
    registry = start_registry(tmp_path / "registry")
    try:
        with RegistryClient(registry.addr) as reg:
            # A Pump whose GC already passed the lake's end: its binlogs after the lake are gone.
            reg.register(NodeRecord("pump-late", "pump", "127.0.0.1:1", gc_ts=last + 1000))
        monkeypatch.setenv("BINLAKE_LAKE_DIR", path)
        monkeypatch.setenv("BINLAKE_REGISTRY", registry.addr)
        monkeypatch.setenv("BINLAKE_SPARK_MASTER", "local[2]")
        run = _run(dags["binlake_maintenance"])
    finally:
        registry.stop(grace=0.2)
    assert run.tasks["snapshot"] == "success" and run.tasks["history"] == "success", run.tasks
    assert run.tasks["optimize_vacuum"] == "success"
    assert run.tasks["gc_report"] == "failed" and run.state == "failed"
    # The snapshot sits at the ledger's end and equals the replayed table.
    entries = [e for e in snapshot.catalog(spark, path) if e.table_id != layout.MARKER_TABLE_ID]
    assert [e.snapshot_ts for e in entries] == [last]
    got = {r["id"]: (r["k"], r["c"], r["balance"]) for r in spark.read.format("delta").load(entries[0].path).collect()}
    assert got == replayed(spark, path, last)
    hist = spark.read.format("delta").load(layout.history_table(path, 1001))
    assert hist.count() == CHANGES  # one version per change (one change per transaction)
    assert hist.where("_valid_to_ts IS NULL").count() == ROWS


def test_restore_dag_params_are_validated_in_the_trigger_form(dags: Any) -> None:
    from airflow.sdk.definitions.param import ParamsDict

    params = dags["binlake_restore"].params
    assert isinstance(params, ParamsDict)
    for key, bad in (("commit_ts", -1), ("commit_ts", "soon"), ("datetime", "yesterday"), ("target", "nope"),
                     ("tables", "a.b.c"), ("tables", ["a"]), ("rename", "a.b"), ("rename", "a=b=c"),
                     ("into_schema", "a.b")):
        with pytest.raises(Exception):  # noqa: B017 - Airflow raises ParamValidationError
            params.get_param(key).resolve(bad)
    assert params.get_param("commit_ts").resolve(123) == 123
    # tables is optional (no asterisk in the form): empty or absent means every table.
    for empty in (None, "", "main.a, b"):
        assert params.get_param("tables").resolve(empty) == empty
    for good in (None, "", "shop.orders=shop.orders_0903", "a=b, c.d=e"):
        assert params.get_param("rename").resolve(good) == good
    assert params.get_param("into_schema").resolve("restored_0903") == "restored_0903"


def test_a_moved_lake_restores_from_its_new_place(
        spark: SparkSession, lake: tuple[str, int], tmp_path: pathlib.Path) -> None:
    """A lake with a snapshot and history tables: the catalogs name tables relative to the lake, so a copy elsewhere, the old
    directory gone, restores from its own snapshot and history tables."""
    import shutil

    from binlake.restore import history, restore

    path, last = lake
    # A snapshot and history tables (the maintenance run above makes them; alone, here).
    if not [e for e in snapshot.catalog(spark, path) if e.table_id != layout.MARKER_TABLE_ID]:
        snapshot.take(spark, path, last)
    history.update(spark, path)
    moved = str(tmp_path / "elsewhere" / "lake")
    shutil.copytree(path, moved)
    aside = path + ".away"
    shutil.move(path, aside)  # nothing may still point into the old directory
    try:
        ts = T0 + 4 * 1000 + 2
        for catalog in (layout.snapshot_catalog(moved), layout.history_catalog(moved)):
            stored = [r["path"] for r in spark.read.format("delta").load(catalog).collect() if r["path"]]
            assert stored and not any(p.startswith("/") for p in stored), stored
        assert all(e.path.startswith(moved) for e in snapshot.catalog(spark, moved)
                   if e.table_id != layout.MARKER_TABLE_ID)
        assert all(row["path"].startswith(moved) for row in history.catalog(spark, moved).values())
        for source in ("history", "auto"):
            p = restore.plan(spark, moved, last if source == "auto" else ts, None, source)
            out = tmp_path / f"out-{source}"
            restore.write_out(spark, p, str(out), replace=True)
            got = {r["id"]: (r["k"], r["c"], r["balance"])
                   for r in spark.read.format("delta").load(str(out / "main.bench")).collect()}
            assert got == replayed(spark, moved, last if source == "auto" else ts), source
            assert {t.base.kind for t in p.tables} == ({"history"} if source == "history" else {"snapshot"})
    finally:
        shutil.move(aside, path)


def test_drill_dag_proves_a_healthy_lake_and_writes_the_report(
        dags: Any, spark: SparkSession, lake: tuple[str, int], tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from binlake.lake.store import drills

    path, last = lake
    report = tmp_path / "drills.html"
    monkeypatch.setenv("BINLAKE_LAKE_DIR", path)
    monkeypatch.setenv("BINLAKE_SPARK_MASTER", "local[2]")
    monkeypatch.setenv("BINLAKE_DRILL_REPORT", str(report))
    monkeypatch.setenv("BINLAKE_APPLY_TASKS", str(tmp_path / "no-tasks"))
    monkeypatch.setenv("BINLAKE_REGISTRY", "127.0.0.1:1")  # nobody there: the Pumps' lags are left out
    tasks_dir = tmp_path / "no-tasks"
    tasks_dir.mkdir()
    # The synthetic lake's clock is ahead of this one's: its RPO is below any objective.
    run = _run(dags["binlake_drill"], {"seed": 3, "rto_s": 600})
    assert run.state == "success", run.tasks
    assert run.tasks == {"check": "success", "drill": "success", "report": "success", "verdict": "success"}
    figures = run.xcoms["drill"]
    assert figures["verdict"] == "passed" and figures["seed"] == 3 and figures["rows"] > 0
    assert figures["proof_paths"].startswith("passed")
    assert drills.last(path)["drill_id"] == figures["drill_id"]
    page = report.read_text()
    assert page.count('class="point"') == 2 * len(drills.read(path)) - sum(
        1 for r in drills.read(path) if r["rpo_s"] is None)
    # A bad param fails the run in its first task, naming it; the tasks' failure callback
    # POSTs that line to the webhook (the drill's own failures: tests/restore/test_drill.py).
    hook = Webhook()
    monkeypatch.setenv("BINLAKE_DRILL_WEBHOOK", hook.url)
    try:
        bad = _run(dags["binlake_drill"], {"tables": "a.b.c"})
    finally:
        hook.close()
    assert bad.state == "failed" and bad.tasks["check"] == "failed" and bad.tasks["drill"] == "upstream_failed"
    assert bad.tasks["report"] == "success"  # the page is written after a failed run too
    assert [(b["task_id"], b["failure"]) for b in hook.bodies] == [
        ("check", "bad params: tables: give comma-separated TABLE or DB.TABLE names, got 'a.b.c'")], hook.bodies
    assert hook.bodies[0]["report"] == str(report) and "restore drill failed" in hook.bodies[0]["text"]
    # A cluster just brought up: nothing ingested yet, the drill is skipped, not failed.
    # (The drill task's body: a third dag.test here would reuse the last run's params.)
    from airflow.sdk.exceptions import AirflowSkipException
    from binlake_airflow import drill_tasks

    monkeypatch.setenv("BINLAKE_LAKE_DIR", str(tmp_path / "empty-lake"))
    monkeypatch.delenv("BINLAKE_DRILL_WEBHOOK")
    with pytest.raises(AirflowSkipException, match="nothing to drill yet: no window is ingested"):
        drill_tasks.drill(drill_tasks.check({}))
