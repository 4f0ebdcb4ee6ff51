"""Ingest over Spark Connect: binlake's jobs as clients of an always-on Spark.

One Spark Connect server (started as ``binlake up`` starts it) and one small
cluster for the module. The ingest over Connect must write exactly the window's
rows (through the data source in the server's Python workers, or decoded in
the client and appended by delta-rs, or staged as a Parquet file in the lake
for the server's replace; an earlier attempt's left staged file fences the
table first), its DDLs and its ledger
row; a re-run replaces the window with the same rows. A server killed -9 mid-ingest (after
the window's rows, before its ledger row) fails the Airflow task body with a
message naming the server, and the retry against the restarted server leaves
the window ingested exactly once. Windows of one day ingested at once take
turns for their Delta writes (``lake.writelock``): none loses a commit race;
the same windows in one Spark job (``ingest_windows``) leave the same ledger rows.
The maintenance snapshot and a restore into a database run over Connect too.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import decimal
import logging
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
from pumpkit import free_port, wait_until

from binlake import errors
from binlake.lake import ingest
from binlake.lake.decoding import arrow_batches
from binlake.lake.decoding.rows import CHANGES_DDL
from binlake.lake.pumps.planner import plan_window
from binlake.lake.pumps.pump_check import check_pumps
from binlake.lake.sparkenv import connect
from binlake.lake.sparkenv.connect_server import ConnectServer
from binlake.lake.store import ledger as lake_ledger
from binlake.lake.store import location, staging
from binlake.testing.devcluster import DevCluster
from binlake.workload import plan as wplan
from binlake.workload import run as wrun
from binlake.writer.txn_writer import TxnWriter

pytestmark = pytest.mark.slow

PUMP_ARGS = ["--stop-write-at-free-bytes", "0", "--fake-binlog-interval-s", "0.3"]


@pytest.fixture(scope="module", autouse=True)
def _classic_spark_after_this_module() -> Iterator[None]:
    """A Connect session switches pyspark in this process to Connect mode (environment
    flags); the other modules' shared local session needs it switched back."""
    keys = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
    before = {k: os.environ.get(k) for k in keys}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    srv = ConnectServer(free_port(), tmp_path_factory.mktemp("connect") / "server.log",
                        extra_conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"})
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    with DevCluster(tmp_path_factory.mktemp("cluster"), pumps=2, pump_args=PUMP_ARGS) as c:
        yield c


@pytest.fixture(scope="module")
def upstream_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('upstream') / 'up.db'}"


@pytest.fixture(scope="module")
def windows(cluster: DevCluster, upstream_url: str) -> list[tuple[int, int]]:
    url = upstream_url
    plan = wplan.plan("ddl", 2, 60, 3, large_txn_rows=50, large_txn_every=30, ddl_every=15, table_rows=30)
    with TxnWriter(url, registry=cluster.registry_addr) as writer:
        summary = wrun.run(writer, plan, clients=2, progress=False)
    assert summary.errors == 0, summary.error_messages

    def passed() -> bool:
        try:
            check_pumps(plan_window(cluster.registry_addr, 0, summary.end_ts))
        except errors.FailedPrecondition:
            return False
        return True

    wait_until(passed, 20, 0.1, "the pumps' safe ts to pass the workload")
    mid = (summary.start_ts + summary.end_ts) // 2
    return [(summary.start_ts, mid), (mid, summary.end_ts)]


def _count(spark: Any, lake: str, table: str, start_ts: int, end_ts: int, column: str = "commit_ts") -> int:
    return int(spark.read.format("delta").load(location.table_path(lake, table))
               .where(f"{column} >= {start_ts} AND {column} < {end_ts}").count())


def test_ingest_over_connect(server: ConnectServer, cluster: DevCluster, windows: list[tuple[int, int]],
                             upstream_url: str, tmp_path: pathlib.Path) -> None:
    lake = str(tmp_path / "lake")
    spark = connect.connect(server.url, "binlake-test")
    try:
        assert connect.is_remote(spark)
        # The first window through the data source in the server's Python workers, the
        # second decoded in this process (the default for small windows) and appended.
        results = [ingest.ingest_window(spark, lake, cluster.registry_addr, *windows[0], decode_here=0),
                   ingest.ingest_window(spark, lake, cluster.registry_addr, *windows[1])]
        assert sum(r.rows for r in results) > 0 and sum(r.ddls for r in results) > 0
        for r in results:
            assert _count(spark, lake, location.CHANGES, r.start_ts, r.end_ts) == r.rows
            assert _count(spark, lake, location.DDL_HISTORY, r.start_ts, r.end_ts) == r.ddls
        ledger = lake_ledger.read_windows(spark, lake)
        assert [(w["start_ts"], w["end_ts"], w["rows"]) for w in ledger] == [
            (r.start_ts, r.end_ts, r.rows) for r in results]
        # A re-run replaces the window: same rows, one ledger row; decoded here, the
        # rows are exactly those the data source wrote.
        first = _rows(spark, lake, *windows[0])
        again = ingest.ingest_window(spark, lake, cluster.registry_addr, *windows[0])
        assert again.replaced and again.rows == results[0].rows
        assert _rows(spark, lake, *windows[0]) == first
        # Decoded rows go to the table by delta-rs (new) or through a staged file in the
        # lake (a replace), which is removed once written.
        assert not any(pathlib.Path(staging.staging_dir(lake)).iterdir())
        # A window's rows are appended only when the table holds none of them. An attempt
        # whose write did not return leaves its staged file (it may still be writing on the
        # server): the next attempt removes it and fences the table (a property change,
        # which fails every Delta transaction begun before it) before it looks.
        w, other = ingest._Window(*windows[1]), str(tmp_path / "other")
        rows = spark.read.format("delta").load(location.table_path(lake, location.CHANGES)).where(
            f"commit_ts >= {w.start_ts} AND commit_ts < {w.end_ts}")
        assert not ingest._may_append(other, w)  # no table yet: replace (which creates it)
        ingest._write_rows(rows, location.table_path(other, location.CHANGES), w, append=False)
        assert not ingest._may_append(other, w) and ingest._may_append(other, ingest._Window(*windows[0]))
        batches = rows.limit(5).toArrow().to_batches()
        with pytest.raises(RuntimeError), staging.arrow_frame(spark, other, batches, CHANGES_DDL,
                                                              ingest._stage_name(w)):
            raise RuntimeError("the write did not return")
        assert len(staging.left_over(other)) == 1
        ingest._fence_earlier(spark, other, w, lambda: None)
        assert staging.left_over(other) == []
        props = {r[0]: r[1] for r in spark.sql(
            f"SHOW TBLPROPERTIES delta.`{location.table_path(other, location.CHANGES)}`").collect()}
        assert props[ingest.FENCE_PROPERTY].startswith(f"{w.start_ts}-{w.end_ts}-")
        assert _count(spark, other, location.CHANGES, w.start_ts, w.end_ts) == results[1].rows
        assert len(lake_ledger.read_windows(spark, lake)) == 2
        # The ddl_history merge (SQL MERGE: Delta's Python API needs a server plugin)
        # adds each DDL once, however often it is given.
        ddls, _lost = ingest._history_from_pumps(cluster.registry_addr, [(0, windows[-1][1])])
        merged = str(tmp_path / "merged")
        for _ in range(2):
            ingest._merge_ddls(spark, merged, ddls)
            ingest._merge_ddls(spark, merged, ddls[:1])
        assert spark.read.format("delta").load(merged).count() == len(ddls) > 0
        # Maintenance's OPTIMIZE/VACUUM is SQL, so it runs over Connect too; the tables keep their rows.
        from binlake.restore import maintenance

        done = maintenance.optimize_vacuum(spark, lake, 168)
        assert {location.table_path(lake, t) for t in (location.CHANGES, location.WINDOWS)} <= set(done)
        for r in results:
            assert _count(spark, lake, location.CHANGES, r.start_ts, r.end_ts) == r.rows
        # The maintenance snapshot and the restore (rebuild, load) are DataFrame and SQL
        # jobs: over Connect the restored target equals the upstream at the window end.
        from binlake.restore import restore, snapshot

        ts = windows[-1][1] - 1
        taken = snapshot.take(spark, lake, ts)
        assert taken.tables and {e.snapshot_ts for e in snapshot.catalog(spark, lake)} == {ts}
        restored = restore.run(spark, lake, ts, target=f"sqlite:///{tmp_path / 'target.db'}", verify_url=upstream_url)
        assert restored.verified is not None and restored.verified.startswith("clean")
    finally:
        spark.stop()


def test_concurrent_windows_of_one_day_take_turns(server: ConnectServer, cluster: DevCluster,
                                                  windows: list[tuple[int, int]], tmp_path: pathlib.Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    # Four windows of the same commit_date into a new lake at once, each in its own
    # session as four backfill tasks would: before the lock, their replaceWhere
    # commits failed each other (ConcurrentAppend) and went round the retries.
    lake = str(tmp_path / "lake")
    lo, hi = windows[0][0], windows[-1][1]
    bounds = [lo + (hi - lo) * i // 4 for i in range(5)]
    parts = list(zip(bounds, bounds[1:], strict=False))
    caplog.set_level(logging.INFO, logger="binlake.lake.ingest")
    sessions = [connect.connect(server.url, f"binlake-test-{i}") for i in range(len(parts))]
    try:
        with concurrent.futures.ThreadPoolExecutor(len(parts)) as pool:
            results = list(pool.map(lambda sp: ingest.ingest_window(sp[0], lake, cluster.registry_addr, *sp[1]),
                                    zip(sessions, parts, strict=True)))
        assert not [r.getMessage() for r in caplog.records if "concurrent Delta commit" in r.getMessage()]
        ledger = lake_ledger.read_windows(sessions[0], lake)
        assert [(w["start_ts"], w["end_ts"], w["rows"]) for w in ledger] == [
            (r.start_ts, r.end_ts, r.rows) for r in results]
        assert _count(sessions[0], lake, location.CHANGES, lo, hi) == sum(r.rows for r in results) > 0

        # The same windows in one Spark job (a run's batch): one row per window in the
        # ledger, each exactly what the window's own ingest wrote, and the same rows.
        batched = str(tmp_path / "batched")
        before = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        together = ingest.ingest_windows(sessions[0], batched, cluster.registry_addr, parts)
        # A run that started before that batch and reaches the write lock after it writes nothing.
        assert ingest.ingest_windows(sessions[0], batched, cluster.registry_addr, parts[:2], done_since=before) == []
        keys = ("start_ts", "end_ts", "pumps", "rows_per_pump", "rows_per_table_op", "txns", "rows", "ddls", "status")
        assert [{k: w[k] for k in keys} for w in lake_ledger.read_windows(sessions[0], batched)] == [
            {k: w[k] for k in keys} for w in ledger]
        assert [(r.start_ts, r.end_ts, r.rows) for r in together] == [(r.start_ts, r.end_ts, r.rows) for r in results]
        for a, b in [(lo, hi), *parts]:
            assert _count(sessions[0], batched, location.CHANGES, a, b) == _count(sessions[0], lake, location.CHANGES, a, b)
            assert (_count(sessions[0], batched, location.DDL_HISTORY, a, b)
                    == _count(sessions[0], lake, location.DDL_HISTORY, a, b))
        # A batch stops before the window that would take it over max_rows (the first always goes;
        # a window with no rows, which a loaded machine's timing can leave, takes it over nothing).
        capped = ingest.ingest_windows(sessions[0], str(tmp_path / "capped"), cluster.registry_addr, parts,
                                       max_rows=results[0].rows)
        want: list[tuple[int, int]] = []
        for r in results:
            if want and sum(n for _ts, n in want) + r.rows > results[0].rows:
                break
            want.append((r.start_ts, r.rows))
        assert len(want) < len(results), "the cap leaves a window out"
        assert [(r.start_ts, r.rows) for r in capped] == want
    finally:
        for spark in sessions:
            spark.stop()


def test_server_killed_mid_ingest_then_retry_exactly_once(
        server: ConnectServer, cluster: DevCluster, windows: list[tuple[int, int]], tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowException
    from binlake_airflow import ingest_tasks

    lake = str(tmp_path / "lake")
    start_ts, end_ts = windows[1]
    monkeypatch.setenv(connect.REMOTE_ENV, server.url)
    planned = {"lake": lake, "registry": cluster.registry_addr, "start_ts": start_ts, "end_ts": end_ts,
               "mode": "connect"}

    killed: list[str] = []

    def kill_before_ledger(message: str) -> None:
        # The window's rows are committed, its ledger row is not: the worst moment.
        if message.startswith("recording the window") and not killed:
            killed.append(message)
            server.kill()

    with pytest.raises(AirflowException) as failed:
        ingest_tasks.ingest_window_task(planned, progress=kill_before_ledger)
    assert killed
    text = str(failed.value)
    assert f"Spark Connect server at {server.url}" in text and "retry" in text and "Traceback" not in text
    assert not (pathlib.Path(lake) / "windows" / "_delta_log").exists() or not _ledger_has(lake, start_ts)

    server.start()
    result = ingest_tasks.ingest_window_task(planned)
    spark = connect.connect(server.url, "binlake-test")
    try:
        assert _count(spark, lake, location.CHANGES, start_ts, end_ts) == result["rows"] > 0
        ledger = lake_ledger.read_windows(spark, lake)
        assert [(w["start_ts"], w["end_ts"]) for w in ledger] == [(start_ts, end_ts)]
    finally:
        spark.stop()


def _rows(spark: Any, lake: str, start_ts: int, end_ts: int) -> list[tuple[Any, ...]]:
    frame = spark.read.format("delta").load(location.table_path(lake, location.CHANGES))
    return sorted(tuple(r) for r in frame.where(f"commit_ts >= {start_ts} AND commit_ts < {end_ts}").collect())


def _ledger_has(lake: str, start_ts: int) -> bool:
    from deltalake import DeltaTable

    rows = DeltaTable(os.path.join(lake, "windows")).to_pyarrow_table().to_pylist()
    return any(r["start_ts"] == start_ts for r in rows)


def test_history_tables_and_parallel_apply_over_connect(server: ConnectServer, cluster: DevCluster,
                                                        windows: list[tuple[int, int]], upstream_url: str,
                                                        tmp_path: pathlib.Path) -> None:
    """The maintenance job's history tables and the apply DAG's parallel mode need no
    local Spark: the history tables are built, MERGEd window by window (a column
    added meanwhile filled as the upstream filled it, SQL text), rewound and applied
    again over Connect, ending equal to the tables built in one pass; the parallel
    apply reads the lake over Connect and its workers write the target."""
    import shutil

    from binlake import codec
    from binlake.proto import binlog_pb2
    from binlake.replicate import runner, task
    from binlake.restore import columns, history, layout
    from binlake.sql import diff

    lake = str(tmp_path / "lake")
    lo, hi = windows[0][0], windows[-1][1]
    ddls, _lost = ingest._history_from_pumps(cluster.registry_addr, [(lo, hi)])
    # Windows cut at the workload's first ADD COLUMN, so the history tables built
    # from the first are MERGEd across the added column.
    added = next(t.commit_ts for t in ddls if b"ADD COLUMN" in t.ddl_query.upper())
    bounds = [(lo, added), (added, hi)]
    spark = connect.connect(server.url, "binlake-test")
    try:
        # fill_sql's text read back typed over Connect (quotes and backslashes included).
        cases = [(binlog_pb2.INT, "bigint", -7, -7), (binlog_pb2.STRING, "string", "it's \\ \"x\"", "it's \\ \"x\""),
                 (binlog_pb2.DECIMAL, "decimal(10,2)", decimal.Decimal("12.30"), decimal.Decimal("12.30")),
                 (binlog_pb2.BYTES, "binary", b"\x00\xff'", bytearray(b"\x00\xff'")),
                 (binlog_pb2.DATETIME, "timestamp_ntz", dt.datetime(2024, 2, 29, 1, 2, 3, 4),
                  dt.datetime(2024, 2, 29, 1, 2, 3, 4)),
                 (binlog_pb2.INT, "string", 5, "5")]
        exprs = []
        for col_type, target, value, _want in cases:
            src = binlog_pb2.ColumnInfo(id=1, name="c", type=col_type,
                                        sql_type="decimal(10,2)" if col_type == binlog_pb2.DECIMAL else "")
            exprs.append(columns.fill_sql(codec.encode_value(value, col_type), src, target))
        got = spark.sql("SELECT " + ", ".join(f"{e} AS c{i}" for i, e in enumerate(exprs))).collect()[0]
        assert list(got) == [want for *_rest, want in cases]

        whats: list[str] = []
        for a, b in bounds:
            ingest.ingest_window(spark, lake, cluster.registry_addr, a, b)
            whats += [what for _n, what in history.update(spark, lake).tables]
        assert "built" in whats and any(w.startswith("applied") for w in whats)
        merged = _history_tables(spark, lake)
        # The second window ingested again: the tables holding it are rewound to its
        # start (its versions deleted, the ones it closed reopened) and it is applied again.
        ingest.ingest_window(spark, lake, cluster.registry_addr, *bounds[1])
        assert any(w.startswith("applied") for _n, w in history.update(spark, lake).tables)
        assert _history_tables(spark, lake) == merged
        shutil.rmtree(os.path.join(lake, layout.HISTORY))
        assert {what for _n, what in history.update(spark, lake).tables} == {"built"}
        assert _history_tables(spark, lake) == merged and merged

        # The apply DAG's parallel mode over the same session: the target ends equal to the upstream.
        target = f"sqlite:///{tmp_path / 'parallel.db'}"
        t = task.Task(name="pconnect", lake=lake, target=target, mode="parallel", parallel_tasks=3)
        summary = runner.Applier(spark, t).run()
        assert summary.windows == len(bounds) and summary.rows_written > 0
        assert diff.diff_databases(upstream_url, target).ok
    finally:
        spark.stop()


def _history_tables(spark: Any, lake: str) -> dict[str, list[tuple[Any, ...]]]:
    """Each history table's rows (columns by name, sorted), by table name."""
    from binlake.restore import history

    out = {}
    for row in history.catalog(spark, lake).values():
        frame = spark.read.format("delta").load(row["path"])
        names = sorted(frame.columns)
        out[f"{row['db']}.{row['tbl']}"] = sorted((tuple(r[n] for n in names) for r in frame.collect()), key=repr)
    return out


def test_lost_ledger_append_leaves_one_ledger_row(server: ConnectServer, cluster: DevCluster,
                                                  windows: list[tuple[int, int]], tmp_path: pathlib.Path) -> None:
    """An attempt whose client died while the server still ran its ledger append, and
    its retry: the window has exactly one ledger row (the lost append fails at commit
    or was there before the retry looked, and is replaced)."""
    import threading
    import time

    from pyspark.sql import functions as F

    lake = str(tmp_path / "lake")
    spark = connect.connect(server.url, "binlake-test")
    lost_session = connect.connect(server.url, "binlake-test-lost")
    try:
        first = ingest.ingest_window(spark, lake, cluster.registry_addr, *windows[0])
        assert first.rows > 0
        a, b = windows[1]
        now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        row = (a, b, ["pump1"], {"pump1": 1}, {}, 1, 1, 0, "done", now)
        path = location.table_path(lake, location.WINDOWS)
        outcome: list[BaseException | None] = []

        def lost_attempt() -> None:
            # What _record does, slowed on the server: the Delta transaction has begun
            # (it reads the table's version before running the query) when the UDF sleeps.
            slow = F.udf(lambda v: (time.sleep(6), v)[1], "long")
            try:
                with staging.arrow_frame(lost_session, lake, [arrow_batches.ledger_batch([row])], ingest.WINDOWS_DDL,
                                         f"windows-{a}-{b}") as df:
                    df.withColumn("txns", slow("txns")).write.format("delta").mode("append").save(path)
                outcome.append(None)
            except Exception as exc:  # the fenced write fails (its file gone, or at commit)
                outcome.append(exc)

        thread = threading.Thread(target=lost_attempt)
        thread.start()
        wait_until(lambda: bool(staging.left_over(lake)), 30, 0.05, "the lost attempt's staged ledger rows")
        time.sleep(2)  # its job runs on the server: the client is gone, as far as the retry knows
        ingest._record(spark, lake, [(*row[:9], dt.datetime.now(dt.UTC).replace(tzinfo=None))], lambda: None)
        thread.join(60)
        assert outcome, "the lost attempt did not end"
        from deltalake import DeltaTable

        held = [(r["start_ts"], r["end_ts"]) for r in DeltaTable(path).to_pyarrow_table().to_pylist()]
        assert sorted(held) == [windows[0], (a, b)]
        assert staging.left_over(lake) == []
    finally:
        lost_session.stop()
        spark.stop()
