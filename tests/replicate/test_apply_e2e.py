"""End to end: a SQLite upstream driven by TxnWriter (a mixed workload with DDL,
plus scripted sharded tables) -> two Pumps -> four ingested windows -> apply to
SQLite, PostgreSQL, MariaDB and DuckDB targets in both modes -> ``binlake diff`` against
the upstream finds no difference.

Also: rules change exactly what they say; applying again changes nothing; a
crash (kill -9 of the apply before a window's commit; parallel mode's workers
failing after their conflict groups committed) and a rerun end equal with the checkpoint at the last
window; a gap in the windows ledger and a target changed by hand stop the
apply with a message naming the window / table and key, committing nothing.
"""

from __future__ import annotations

import decimal
import json
import os
import pathlib
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from dbfixtures import TARGETS, mariadb_server, new_target_url, postgres_server  # noqa: F401
from pumpkit import wait_cluster_safe
from pyspark.sql import SparkSession

from binlake import errors, failpoint
from binlake.lake import ingest
from binlake.registry.client import RegistryClient
from binlake.replicate import checkpoint, runner, table_write, task
from binlake.sql import checksum, diff
from binlake.sql import schema as sc
from binlake.sql.url import open_target
from binlake.testing.devcluster import DevCluster
from binlake.workload import plan as wplan
from binlake.workload import run as wrun
from binlake.writer.txn_writer import TxnWriter

# One cluster, upstream and lake for the module: the setup is most of the time.
pytestmark = [pytest.mark.timeout(1800), pytest.mark.slow]

PUMP_ARGS = ["--stop-write-at-free-bytes", "0", "--fake-binlog-interval-s", "0.3"]
SHARD_COLS = [sc.ColumnDef("id", "int", False), sc.ColumnDef("status", "string", length=16),
              sc.ColumnDef("amount", "decimal", precision=10, scale=2)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    with DevCluster(tmp_path_factory.mktemp("cluster"), pumps=2, pump_args=PUMP_ARGS) as c:
        yield c


def _script(writer: TxnWriter) -> None:
    """Tables the rules tests look at: two shards, users, audit."""
    for name in ("orders_01", "orders_02"):
        writer.create_table(name, SHARD_COLS, ["id"])
    writer.create_table("users", [sc.ColumnDef("id", "int", False), sc.ColumnDef("name", "string")], ["id"])
    writer.create_table("audit", [sc.ColumnDef("id", "int", False), sc.ColumnDef("msg", "string")], ["id"])

    def fill(t: Any) -> None:
        for i in range(1, 6):
            t.insert("orders_01", {"id": i, "status": "test" if i == 2 else "ok", "amount": f"{i}.25"})
            t.insert("orders_02", {"id": i, "status": "test" if i == 4 else "new", "amount": f"{i * 10}.5"})
            t.insert("users", {"id": i, "name": f"u{i}"})
            t.insert("audit", {"id": i, "msg": "m"})

    writer.run(fill)

    def change(t: Any) -> None:
        t.update("orders_01", {"id": 1}, {"status": "paid"})
        t.delete("orders_02", {"id": 5})
        t.delete("users", {"id": 3})
        t.update("users", {"id": 1}, {"name": "first"})

    writer.run(change)


@pytest.fixture(scope="module")
def upstream(cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    url = f"sqlite:///{tmp_path_factory.mktemp('upstream') / 'up.db'}"
    with RegistryClient(cluster.registry_addr) as reg:
        t0 = reg.get_ts()
    plan = wplan.plan("mixed", 2, 90, 3, large_txn_rows=60, large_txn_every=40, ddl_every=8, table_rows=40)
    with TxnWriter(url, registry=cluster.registry_addr) as writer:
        _script(writer)
        summary = wrun.run(writer, plan, clients=2, progress=False)
    assert summary.errors == 0, summary.error_messages
    assert summary.ddls >= 8
    end = summary.end_ts

    wait_cluster_safe(cluster.registry_addr, end, 20)
    a, b = summary.start_ts, end
    cuts = [t0, a + (b - a) // 3, a + 2 * (b - a) // 3, b]
    return {"url": url, "windows": list(zip(cuts, cuts[1:], strict=False))}


@pytest.fixture(scope="module")
def lake(spark: SparkSession, cluster: DevCluster, upstream: dict[str, Any],
         tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("lake"))
    for a, b in upstream["windows"]:
        ingest.ingest_window(spark, path, cluster.registry_addr, a, b)
    return path


def make_task(lake: str, target: str, mode: str = "consistent", **kw: Any) -> task.Task:
    return task.Task(name=f"t{uuid.uuid4().hex[:6]}", lake=lake, target=target, mode=mode, **kw)


def read_checkpoint(url: str, name: str) -> checkpoint.Checkpoint | None:
    with open_target(url) as t, t.engine.connect() as conn:
        return checkpoint.read(conn, name)


@pytest.mark.parametrize("kind, mode", [(kind, mode) for kind in TARGETS for mode in ("consistent", "parallel")])
def test_apply_equals_upstream(spark: SparkSession, lake: str, upstream: dict[str, Any], kind: str, mode: str,
                               request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> None:
    url = new_target_url(kind, request, tmp_path, "r")
    t = make_task(lake, url, mode)
    summary = runner.Applier(spark, t).run()
    assert summary.windows == 3
    assert summary.ddls >= 12 and summary.changes > 500
    report = diff.diff_databases(upstream["url"], url, chunk_size=50)
    assert report.ok, report.summary()
    assert checksum.checksum(upstream["url"]) == checksum.checksum(url)
    end = upstream["windows"][-1][1]
    assert read_checkpoint(url, t.name) == checkpoint.Checkpoint(end, upstream["windows"][-1][0], end)
    # Once more: nothing left to apply, nothing changes.
    again = runner.Applier(spark, t).run()
    assert again.windows == 0 and again.changes == 0
    assert checksum.checksum(upstream["url"]) == checksum.checksum(url)


def test_same_changes_twice_change_nothing(spark: SparkSession, lake: str, upstream: dict[str, Any],
                                           tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'twice.db'}"
    t = make_task(lake, url)
    w = upstream["windows"]
    runner.Applier(spark, t).run()
    before = checksum.checksum(url)
    # Put the checkpoint back to just after the last window's last DDL (where a crash
    # between a MySQL DDL and the next commit leaves it): the rest of the window, every
    # row change after that DDL, is applied a second time, in safe mode.
    last_ddl = spark.read.format("delta").load(f"{lake}/ddl_history").where(
        f"commit_ts >= {w[-1][0]} AND commit_ts < {w[-1][1]}").agg({"commit_ts": "max"}).first()[0]
    resume = last_ddl + 1 if last_ddl is not None else w[-1][0]
    rest = spark.read.format("delta").load(f"{lake}/changes").where(
        f"commit_ts >= {resume} AND commit_ts < {w[-1][1]}").count()
    assert rest > 0
    with open_target(url) as tgt, tgt.engine.begin() as conn:
        checkpoint.write(conn, t.name, resume, w[-1][0], w[-1][1])
    safe = t.model_copy(update={"safe_mode_until_ts": w[-1][1]})
    again = runner.Applier(spark, safe).run()
    assert again.windows == 1 and again.changes == rest and again.ddls == 0
    assert checksum.checksum(url) == before
    assert diff.diff_databases(upstream["url"], url).ok


def test_rules_change_exactly_what_they_say(spark: SparkSession, lake: str, upstream: dict[str, Any],
                                            tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'rules.db'}"
    t = make_task(lake, url, filter={"block": ["*.audit"]},
                  event_filters=[{"tables": ["main.users"], "ignore": ["delete"]}],
                  routes=[{"schema_pattern": "main", "table_pattern": "~orders_\\d+", "target_table": "orders",
                           "extract_table_column": "source_table"}],
                  expr_filters=[{"table": "main.~orders_.*", "insert_value_expr": "status = 'test'"}])
    runner.Applier(spark, t).run()
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        names = set(sa.inspect(conn).get_table_names())
        orders = sorted(conn.exec_driver_sql("SELECT source_table, id, status, amount FROM orders").all())
        users = sorted(conn.exec_driver_sql("SELECT id, name FROM users").all())
    engine.dispose()
    assert "audit" not in names and "orders_01" not in names and "orders_02" not in names
    assert [(s, i, st, decimal.Decimal(a)) for s, i, st, a in orders] == [
        ("orders_01", 1, "paid", decimal.Decimal("1.25")), ("orders_01", 3, "ok", decimal.Decimal("3.25")),
        ("orders_01", 4, "ok", decimal.Decimal("4.25")), ("orders_01", 5, "ok", decimal.Decimal("5.25")),
        ("orders_02", 1, "new", decimal.Decimal("10.5")), ("orders_02", 2, "new", decimal.Decimal("20.5")),
        ("orders_02", 3, "new", decimal.Decimal("30.5"))]
    assert users == [(1, "first"), (2, "u2"), (3, "u3"), (4, "u4"), (5, "u5")]  # the delete of 3 was ignored
    # Every other table is exactly the upstream's.
    others = sorted(n for n in names if n not in ("orders", "users") and not n.startswith("_binlake_"))
    assert others
    assert diff.diff_databases(upstream["url"], url, tables=others).ok


def test_gap_in_the_ledger_names_the_missing_window(spark: SparkSession, lake: str, upstream: dict[str, Any],
                                                    tmp_path: pathlib.Path) -> None:
    w = upstream["windows"]
    gap_lake = tmp_path / "gap-lake"
    shutil.copytree(lake, gap_lake)
    spark.sql(f"DELETE FROM delta.`{gap_lake / 'windows'}` WHERE start_ts = {w[1][0]}")
    url = f"sqlite:///{tmp_path / 'gap.db'}"
    t = make_task(str(gap_lake), url)
    with pytest.raises(errors.FailedPrecondition, match=rf"window \[{w[1][0]}, {w[1][1]}\) .* is missing"):
        runner.Applier(spark, t).run()
    assert read_checkpoint(url, t.name) is None  # nothing applied past the gap's check
    assert runner.Applier(spark, t).run(until_ts=w[0][1]).windows == 1  # up to the gap works


def test_target_changed_by_hand_stops_with_table_and_key(spark: SparkSession, lake: str, upstream: dict[str, Any],
                                                         tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'hand.db'}"
    t = make_task(lake, url)
    w = upstream["windows"]
    # A row some window after the first updates or deletes before any DDL on its table
    # in that window (and before anything re-inserts it), removed by hand. Which window
    # holds one depends on where the workload's windows were cut, so look in each.
    ddls = spark.read.format("delta").load(f"{lake}/ddl_history").select("commit_ts", "table_id").collect()
    changes = spark.read.format("delta").load(f"{lake}/changes").orderBy("commit_ts", "seq").collect()
    victim = None
    for k in range(1, len(w)):
        start, end = w[k]
        touched: set[tuple[str, Any]] = set()
        for r in (c for c in changes if start <= c.commit_ts < end):
            if any(start <= d.commit_ts <= r.commit_ts and d.table_id == r.table_id for d in ddls):
                continue  # the table changed shape in this window before this row
            image = json.loads(r.before or r.after)
            if r.op != "insert" and (r.tbl, image["id"]) not in touched:
                victim = (r.tbl, image["id"])
                break
            touched.add((r.tbl, json.loads(r.after or r.before)["id"]))
        if victim is not None:
            break
    assert victim is not None, "no window after the first updates or deletes a row it did not insert"
    runner.Applier(spark, t).run(until_ts=start)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM {victim[0]} WHERE id = {victim[1]}")
    engine.dispose()
    before = checksum.checksum(url)
    with pytest.raises(table_write.TargetDiverged,
                       match=rf"target table {victim[0]}: the row with key id={victim[1]} .* not in the target"):
        runner.Applier(spark, t).run()
    assert checksum.checksum(url) == before  # no partial window committed
    assert read_checkpoint(url, t.name).ts == start


def _cli_apply(task_file: pathlib.Path, *extra: str, fail: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env["BINLAKE_SPARK_MASTER"] = "local[1]"
    if fail:
        env[failpoint.ENV] = fail
    return subprocess.run([sys.executable, "-m", "binlake.cli", "apply", "--task", str(task_file), *extra],
                          env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("kind", ["sqlite", "duckdb"])
def test_kill_before_commit_then_rerun(spark: SparkSession, lake: str, upstream: dict[str, Any], kind: str,
                                       request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> None:
    url = new_target_url(kind, request, tmp_path, "crash")
    w = upstream["windows"]
    task_file = tmp_path / "task.toml"
    task_file.write_text(f'name = "crash"\nlake = "{lake}"\ntarget = "{url}"\nmode = "consistent"\n')
    t = task.load(task_file)
    runner.Applier(spark, t).run(until_ts=w[1][1])
    before = checksum.checksum(url)
    proc = _cli_apply(task_file, fail="apply-before-commit:exit")
    assert proc.returncode == 137, proc.stderr[-2000:]
    assert read_checkpoint(url, "crash").ts == w[1][1]  # window 3 was being written: nothing of it shows
    assert checksum.checksum(url) == before
    summary = runner.Applier(spark, t).run()
    assert summary.windows == 1  # the last window, which the crash left out
    assert diff.diff_databases(upstream["url"], url).ok
    assert read_checkpoint(url, "crash").ts == w[-1][1]


@pytest.mark.parametrize("kind", ["sqlite", "duckdb"])
def test_workers_failed_after_their_groups_then_rerun(spark: SparkSession, lake: str, upstream: dict[str, Any],
                                                    kind: str, request: pytest.FixtureRequest,
                                                    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = new_target_url(kind, request, tmp_path, "pcrash")
    w = upstream["windows"]
    t = make_task(lake, url, "parallel")
    runner.Applier(spark, t).run(until_ts=w[0][1])
    monkeypatch.setenv(failpoint.ENV, "apply-after-group:raise")
    with pytest.raises(failpoint.FailpointError):
        runner.Applier(spark, t).run()
    monkeypatch.delenv(failpoint.ENV)
    cp = read_checkpoint(url, t.name)
    assert cp is not None and cp.ts < w[-1][1]
    with open_target(url) as tgt, tgt.engine.connect() as conn:
        groups = conn.execute(sa.select(sa.func.count()).select_from(checkpoint.table)
                              .where(checkpoint.table.c.grp >= 0)).scalar_one()
    assert groups >= 1  # some groups of the batch went in before the crash
    runner.Applier(spark, t).run()
    assert diff.diff_databases(upstream["url"], url).ok
    assert read_checkpoint(url, t.name).ts == w[-1][1]


def test_status_and_bad_input(spark: SparkSession, lake: str, upstream: dict[str, Any],
                              tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'status.db'}"
    t = make_task(lake, url)
    w = upstream["windows"]
    runner.Applier(spark, t).run(until_ts=w[1][1])
    st = runner.Applier(spark, t).status()
    assert st["checkpoint_ts"] == w[1][1] and st["windows_behind"] == 1 and st["lag_s"] > 0
    with pytest.raises(errors.Unavailable, match="cannot reach target"):
        runner.Applier(spark, make_task(lake, "postgresql://u:pw@127.0.0.1:1/x")).run()
    with pytest.raises(errors.InvalidArgument, match="Airflow Connection id"):
        runner.Applier(spark, make_task(lake, "my_conn"))
    bad = make_task(lake, f"sqlite:///{tmp_path / 'bad.db'}",
                    expr_filters=[{"table": "main.users", "insert_value_expr": "no_such_column = 1"}])
    with pytest.raises(errors.InvalidArgument, match=r"expr_filters.0.insert_value_expr .* over main\.users \(id, name\)") \
            as refused:
        runner.Applier(spark, bad).run()
    assert "no_such_column" in str(refused.value) and "__binlake" not in str(refused.value)
