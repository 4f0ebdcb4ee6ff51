"""Ingest against a real cluster: a registry and two Pumps as processes, a SQLite
upstream driven by TxnWriter with a workload that includes DDL, windows read by
the ``binlake`` data source and written to Delta.

The change table must hold exactly the workload's row changes (per table id
and op, as the Pumps serve them) and replaying it must rebuild the upstream's
final rows; ingesting a window twice, or backfilling windows out of order,
must leave identical tables.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pumpkit import commit, prewrite, wait_until, write_one
from pyspark.sql import SparkSession

from binlake import errors, failpoint, tso
from binlake.client.reader import pull_window
from binlake.lake import ingest
from binlake.lake.decoding.image import image_values
from binlake.lake.decoding.rows import OPS
from binlake.lake.pumps import checkpoint
from binlake.lake.pumps import datasource as lake_source
from binlake.lake.pumps.planner import plan_window
from binlake.lake.pumps.pump_check import check_pumps
from binlake.lake.store import ledger as lake_ledger
from binlake.lake.store import location
from binlake.proto import binlog_pb2
from binlake.registry.client import RegistryClient
from binlake.sql import checksum
from binlake.testing.devcluster import DevCluster
from binlake.workload import plan as wplan
from binlake.workload import run as wrun
from binlake.writer.txn_writer import TxnWriter

PUMP_ARGS = ["--stop-write-at-free-bytes", "0", "--fake-binlog-interval-s", "0.3"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    with DevCluster(tmp_path_factory.mktemp("cluster"), pumps=2, pump_args=PUMP_ARGS) as c:
        yield c


def wait_safe(cluster: DevCluster, ts: int) -> None:
    def passed() -> bool:
        try:
            check_pumps(plan_window(cluster.registry_addr, 0, ts))
        except errors.FailedPrecondition:
            return False
        return True

    wait_until(passed, 20, 0.1, f"pumps' safe ts to pass {ts}")


@pytest.fixture(scope="module")
def upstream(cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    url = f"sqlite:///{tmp_path_factory.mktemp('upstream') / 'up.db'}"
    plan = wplan.plan("ddl", 2, 110, 5, large_txn_rows=150, large_txn_every=40, ddl_every=9, table_rows=60)
    with TxnWriter(url, registry=cluster.registry_addr) as writer:
        summary = wrun.run(writer, plan, clients=2, progress=False)
    assert summary.errors == 0, summary.error_messages
    assert summary.ddls >= 12  # two CREATE TABLEs and about ten schema changes
    wait_safe(cluster, summary.end_ts)
    a, b = summary.start_ts, summary.end_ts
    cuts = [a, a + (b - a) // 3, a + 2 * (b - a) // 3, b]
    return {"url": url, "summary": summary, "windows": list(zip(cuts, cuts[1:], strict=False))}


@pytest.fixture(scope="module")
def lake_in_order(spark: SparkSession, cluster: DevCluster, upstream: dict[str, Any],
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    lake = str(tmp_path_factory.mktemp("lake-in-order"))
    results = [ingest.ingest_window(spark, lake, cluster.registry_addr, a, b) for a, b in upstream["windows"]]
    return {"lake": lake, "results": results}


def table_rows(spark: SparkSession, lake: str, name: str, drop: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
    df = spark.read.format("delta").load(location.table_path(lake, name))
    cols = [c for c in df.columns if c not in drop]
    return sorted((tuple(r) for r in df.select(*cols).collect()), key=repr)


def expected_counts(cluster: DevCluster, start: int, end: int) -> dict[tuple[int, str], int]:
    """Row changes per (table id, op) as the Pumps serve them (one copy per transaction)."""
    out: dict[tuple[int, str], int] = {}
    for txn in pull_window(cluster.pump_addrs, start, end):
        for m in binlog_pb2.PrewriteValue.FromString(txn.prewrite_value).mutations:
            for op, n in (("insert", len(m.inserted_rows)), ("update", len(m.updated_rows)),
                          ("delete", len(m.deleted_rows))):
                if n:
                    out[(m.table_id, op)] = out.get((m.table_id, op), 0) + n
    return out


def replay(spark: SparkSession, lake: str) -> dict[int, dict[str, tuple[str, int]]]:
    """The final image of every key per table id: the change table applied in
    (commit_ts, seq) order (a primary-key change removes the old key)."""
    ddl = {(r["table_id"], r["schema_version"]): binlog_pb2.TableInfo.FromString(bytes(r["table_info"]))
           for r in spark.read.format("delta").load(location.table_path(lake, "ddl_history")).collect()
           if r["table_info"] is not None}
    state: dict[int, dict[str, tuple[str, int]]] = {}
    changes = (spark.read.format("delta").load(location.table_path(lake, "changes"))
               .select("table_id", "op", "keys", "before", "after", "schema_version", "commit_ts", "seq")
               .orderBy("commit_ts", "seq").collect())
    for r in changes:
        rows = state.setdefault(r["table_id"], {})
        if r["op"] == "update":
            info = ddl[(r["table_id"], r["schema_version"])]
            before = json.loads(r["before"])
            old_key = json.dumps({k: before[k] for k in sorted(_pk(info))}, separators=(",", ":"),
                                 ensure_ascii=False)
            rows.pop(old_key, None)
        if r["op"] == "delete":
            rows.pop(r["keys"], None)
        else:
            rows[r["keys"]] = (r["after"], r["schema_version"])
    return {tid: {k: (v, ver, ddl[(tid, ver)]) for k, (v, ver) in rows.items()} for tid, rows in state.items()}


def _pk(info: binlog_pb2.TableInfo) -> list[str]:
    names = {c.id: c.name for c in info.columns}
    return [names[i] for i in info.primary_key]


def lake_checksums(spark: SparkSession, lake: str, current: dict[str, binlog_pb2.TableInfo]) -> dict[str, tuple[int, str]]:
    """checksum.checksum's figures for the replayed lake, columns mapped by id to the current definitions."""
    state = replay(spark, lake)
    out = {}
    for name, info in current.items():
        total = xor = count = 0
        json_cols = [c.name for c in info.columns if c.type == binlog_pb2.JSON]
        for after, _ver, old in state.get(info.table_id, {}).values():
            values = image_values(after, old)
            by_id = {c.id: values[c.name] for c in old.columns}
            row = {c.name: by_id.get(c.id) for c in info.columns}
            h = checksum.row_hash(row, json_cols)
            total, xor, count = (total + h) & ((1 << 64) - 1), xor ^ h, count + 1
        out[name] = (count, f"{total:016x}{xor:016x}")
    return out


# ---------------------------------------------------------------- the change table
def test_windows_hold_exactly_the_workloads_row_changes(
    spark: SparkSession, cluster: DevCluster, upstream: dict[str, Any], lake_in_order: dict[str, Any]
) -> None:
    lake, results = lake_in_order["lake"], lake_in_order["results"]
    summary = upstream["summary"]
    changes = spark.read.format("delta").load(location.table_path(lake, "changes"))

    got = {(r["table_id"], r["op"]): r["count"] for r in changes.groupBy("table_id", "op").count().collect()}
    assert got == expected_counts(cluster, summary.start_ts, summary.end_ts)
    per_op = {op: sum(n for (_, o), n in got.items() if o == op) for op in OPS}
    assert per_op == {"insert": summary.inserts, "update": summary.updates, "delete": summary.deletes}

    assert sum(r.rows for r in results) == changes.count() == sum(got.values())
    assert sum(r.txns for r in results) == summary.transactions
    assert sum(r.ddls for r in results) == summary.ddls
    assert all(r.duplicates == 0 and not r.replaced and r.pumps == ("pump1", "pump2") for r in results)
    # The per-table counts of the ledger name tables as they were named then.
    ledger: dict[str, int] = {}
    for r in results:
        for key, n in r.rows_per_table_op.items():
            ledger[key] = ledger.get(key, 0) + n
    assert sum(ledger.values()) == changes.count()
    by_name = {f"{r['db']}.{r['tbl']}:{r['op']}": r["count"]
               for r in changes.groupBy("db", "tbl", "op").count().collect()}
    assert ledger == by_name

    # Order inside a transaction is kept: seq runs 0..n-1 per transaction.
    seqs = changes.groupBy("start_ts").agg({"seq": "max", "*": "count"}).collect()
    assert all(r["max(seq)"] == r["count(1)"] - 1 for r in seqs)
    assert {r["commit_date"] for r in changes.select("commit_date").distinct().collect()} == {
        tso.to_datetime(summary.start_ts).date(), tso.to_datetime(summary.end_ts).date()}

    ddl = spark.read.format("delta").load(location.table_path(lake, "ddl_history"))
    assert ddl.count() == summary.ddls
    windows = table_rows(spark, lake, "windows")
    assert [(w[0], w[1]) for w in windows] == upstream["windows"]
    assert all(w[8] == "done" for w in windows)


def test_replayed_changes_equal_the_upstreams_final_rows(
    spark: SparkSession, upstream: dict[str, Any], lake_in_order: dict[str, Any]
) -> None:
    current = checksum.load_schema(upstream["url"])
    expected = checksum.checksum(upstream["url"])
    assert set(expected) == set(current) and all(rows > 0 for rows, _ in expected.values())
    assert lake_checksums(spark, lake_in_order["lake"], current) == expected


# ---------------------------------------------------------------- idempotence
@pytest.mark.slow  # a crash or a backfill of several windows: 2-3 min at load 20
def test_reingest_and_out_of_order_backfill_leave_identical_tables(
    spark: SparkSession, cluster: DevCluster, upstream: dict[str, Any], lake_in_order: dict[str, Any],
    tmp_path: pathlib.Path,
) -> None:
    lake_a = lake_in_order["lake"]
    before = {name: table_rows(spark, lake_a, name) for name in ("changes", "ddl_history")}
    w1, w2, w3 = upstream["windows"]
    again = ingest.ingest_window(spark, lake_a, cluster.registry_addr, *w2)
    assert again.replaced and again.rows == lake_in_order["results"][1].rows
    for name in ("changes", "ddl_history"):
        assert table_rows(spark, lake_a, name) == before[name], name

    # Backfill out of order, the first two at once into a lake that does not exist
    # yet (as a DAG with several active runs does): Delta conflicts are retried.
    lake_b = str(tmp_path / "lake-backfilled")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(ingest.ingest_window, spark, lake_b, cluster.registry_addr, *w) for w in (w3, w1)]:
            done.result()
    ingest.ingest_window(spark, lake_b, cluster.registry_addr, *w2)
    for name in ("changes", "ddl_history"):
        assert table_rows(spark, lake_b, name) == before[name], name
    assert table_rows(spark, lake_b, "windows", drop=("ingested_at",)) == \
        table_rows(spark, lake_a, "windows", drop=("ingested_at",))


def _ingest_killed_at(cluster: DevCluster, lake: str, window: tuple[int, int], point: str) -> None:
    """``binlake ingest`` of ``window`` in its own process, killed (as by kill -9) at failpoint ``point``."""
    env = {**os.environ, failpoint.ENV: f"{point}:exit"}
    crashed = subprocess.run(
        [sys.executable, "-m", "binlake.cli", "--log-level", "WARNING", "ingest", "--registry", cluster.registry_addr,
         "--start-ts", str(window[0]), "--end-ts", str(window[1]), "--lake", lake, "--master", "local[1]"],
        env=env, capture_output=True, text=True, timeout=300)
    assert crashed.returncode == 137, crashed.stderr[-2000:]


@pytest.mark.slow  # a crash or a backfill of several windows: 2-3 min at load 20
def test_ingest_killed_half_way_leaves_no_window_and_a_rerun_repairs_it(
    spark: SparkSession, cluster: DevCluster, upstream: dict[str, Any], lake_in_order: dict[str, Any],
    tmp_path: pathlib.Path,
) -> None:
    """``binlake ingest`` killed (as by kill -9) after the window's change and DDL rows
    are in Delta but before its ``windows`` row: the ledger does not claim the
    window, and running it again leaves what one clean run leaves."""
    lake = str(tmp_path / "lake")
    w1, w2, _ = upstream["windows"]
    ingest.ingest_window(spark, lake, cluster.registry_addr, *w1)
    _ingest_killed_at(cluster, lake, w2, "ingest-before-ledger")
    # Its rows reached the change table, but the ledger only knows the first window ...
    assert spark.read.format("delta").load(location.table_path(lake, "changes")).where(
        f"commit_ts >= {w2[0]} AND commit_ts < {w2[1]}").count() == lake_in_order["results"][1].rows
    assert [(w["start_ts"], w["end_ts"]) for w in lake_ledger.read_windows(spark, lake)] == [w1]
    assert lake_ledger.uncovered(lake_ledger.read_windows(spark, lake), w1[0], w2[1]) == [w2]
    # ... and a re-run replaces the half-written window: the same rows, once.
    again = ingest.ingest_window(spark, lake, cluster.registry_addr, *w2)
    assert again.rows == lake_in_order["results"][1].rows and not again.replaced
    where = f"commit_ts < {w2[1]}"
    for name in ("changes", "ddl_history"):
        got = spark.read.format("delta").load(location.table_path(lake, name)).where(where)
        want = spark.read.format("delta").load(location.table_path(lake_in_order["lake"], name)).where(where)
        assert sorted(map(tuple, got.collect()), key=repr) == sorted(map(tuple, want.collect()), key=repr), name
    assert [(w["start_ts"], w["end_ts"], w["rows"]) for w in lake_ledger.read_windows(spark, lake)] == [
        (r.start_ts, r.end_ts, r.rows) for r in lake_in_order["results"][:2]]


@pytest.mark.slow  # a crash: a CLI run with its own Spark
def test_ingest_killed_inside_its_append_leaves_nothing_of_the_window(
    spark: SparkSession, cluster: DevCluster, upstream: dict[str, Any], lake_in_order: dict[str, Any],
    tmp_path: pathlib.Path,
) -> None:
    """``binlake ingest`` killed (as by kill -9) inside delta-rs's append of a new
    window's change rows, its stream read to the end but not committed: the change
    table holds nothing of the window, and a re-run appends it once."""
    from deltalake import DeltaTable

    lake = str(tmp_path / "lake")
    w1, w2, _ = upstream["windows"]
    ingest.ingest_window(spark, lake, cluster.registry_addr, *w1)
    changes = location.table_path(lake, "changes")
    version = DeltaTable(changes).version()
    _ingest_killed_at(cluster, lake, w2, "ingest-before-append-commit")
    assert DeltaTable(changes).version() == version
    assert spark.read.format("delta").load(changes).where(
        f"commit_ts >= {w2[0]} AND commit_ts < {w2[1]}").count() == 0
    assert [(w["start_ts"], w["end_ts"]) for w in lake_ledger.read_windows(spark, lake)] == [w1]
    again = ingest.ingest_window(spark, lake, cluster.registry_addr, *w2)
    assert again.rows == lake_in_order["results"][1].rows > 0 and not again.replaced
    assert DeltaTable(changes).version() == version + 1  # appended in one commit
    where = f"commit_ts < {w2[1]}"
    got = spark.read.format("delta").load(changes).where(where)
    want = spark.read.format("delta").load(location.table_path(lake_in_order["lake"], "changes")).where(where)
    assert sorted(map(tuple, got.collect()), key=repr) == sorted(map(tuple, want.collect()), key=repr)


def test_the_lake_holds_pump_gc_at_the_end_of_its_contiguous_ledger(
    cluster: DevCluster, upstream: dict[str, Any], lake_in_order: dict[str, Any]
) -> None:
    with RegistryClient(cluster.registry_addr) as reg:
        consumers = {c.consumer_id: c for c in reg.list_consumers()}
    mine = consumers[checkpoint.consumer_id(lake_in_order["lake"])]
    assert mine.checkpoint_ts == upstream["windows"][-1][1]
    assert lake_in_order["lake"] in mine.description


@pytest.mark.slow  # a crash or a backfill of several windows: 2-3 min at load 20
def test_a_crash_before_the_checkpoint_only_holds_gc_longer(
    spark: SparkSession, cluster: DevCluster, upstream: dict[str, Any], tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ingest dies after the window's ledger row but before the lake's checkpoint
    moves: the checkpoint stays at the window start (GC held, nothing lost), and the
    next ingest moves it to the end of the whole contiguous ledger."""
    lake = str(tmp_path / "lake")
    w1, w2, _ = upstream["windows"]
    monkeypatch.setenv(failpoint.ENV, "ingest-before-checkpoint:raise")
    with pytest.raises(failpoint.FailpointError):
        ingest.ingest_window(spark, lake, cluster.registry_addr, *w1)
    monkeypatch.delenv(failpoint.ENV)
    assert [(w["start_ts"], w["end_ts"]) for w in lake_ledger.read_windows(spark, lake)] == [w1]

    def lake_checkpoint() -> int:
        with RegistryClient(cluster.registry_addr) as reg:
            return {c.consumer_id: c.checkpoint_ts for c in reg.list_consumers()}[checkpoint.consumer_id(lake)]

    assert lake_checkpoint() == w1[0]
    ingest.ingest_window(spark, lake, cluster.registry_addr, *w2)
    assert lake_checkpoint() == w2[1]


def test_the_ledger_is_read_as_narrow_as_the_caller_asks(
    spark: SparkSession, lake_in_order: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``read_windows`` with columns and a ts range gives exactly those parts of the
    whole ledger's rows, read here (delta-rs) and through Spark alike."""
    from binlake.lake.store import arrowread

    lake = lake_in_order["lake"]
    for through_spark in (False, True):
        if through_spark:  # what an S3 lake, or a table delta-rs cannot read, takes
            monkeypatch.setattr(arrowread, "small_table_rows", lambda *_args: None)
        whole = lake_ledger.read_windows(spark, lake)
        assert len(whole) == 3 and "rows_per_table_op" in whole[0]
        assert lake_ledger.read_windows(spark, lake, lake_ledger.BOUNDS) == [
            {k: w[k] for k in lake_ledger.BOUNDS} for w in whole]
        middle = whole[1]
        a, b = int(middle["start_ts"]), int(middle["end_ts"])
        assert lake_ledger.read_windows(spark, lake, overlapping=(a, b)) == [middle]
        assert lake_ledger.read_windows(spark, lake, ["rows"], overlapping=(b - 1, b + 1)) == [
            {k: w[k] for k in ("start_ts", "end_ts", "rows", "ingested_at")} for w in whole[1:]]
    with pytest.raises(ValueError, match="ledger's columns"):
        lake_ledger.read_windows(spark, lake, ["start_ts", "colour"])


def test_overlapping_window_is_refused(
    spark: SparkSession, cluster: DevCluster, upstream: dict[str, Any], lake_in_order: dict[str, Any]
) -> None:
    (a, b), (_, c), _ = upstream["windows"]
    with pytest.raises(errors.Conflict, match=rf"overlaps the ingested window \[{a}, {b}\)") as refused:
        ingest.ingest_window(spark, lake_in_order["lake"], cluster.registry_addr, a + 1, c)
    # No retry can change that: schedulers fail the task at once.
    assert errors.is_final(refused.value)


# ---------------------------------------------------------------- duplicates and refusals
def test_transaction_on_two_pumps_is_read_once(
    spark: SparkSession, cluster: DevCluster, upstream: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    """A prewrite retried on a second Pump (both stored it; both resolved it to the
    same commit_ts) is one transaction in the lake, kept from the lowest pump id."""
    info = sorted(checksum.load_schema(upstream["url"]).values(), key=lambda t: t.table_id)[0]
    row = {c.name: None for c in info.columns}
    key_cols = {c.id: c for c in info.columns}
    for col_id in info.primary_key:
        row[key_cols[col_id].name] = 10**12
    for c in info.columns:  # fill NOT NULL columns with a value of their type
        if row[c.name] is None and not c.nullable:
            row[c.name] = _sample(c.type)
    from binlake import codec

    value = binlog_pb2.PrewriteValue(schema_version=info.schema_version, mutations=[binlog_pb2.TableMutation(
        table_id=info.table_id, inserted_rows=[codec.encode_row(row, info)], sequence=[binlog_pb2.INSERT])])
    with RegistryClient(cluster.registry_addr) as reg:
        start = reg.get_ts()
        for addr in cluster.pump_addrs.values():
            pre = prewrite(start)
            pre.prewrite_value = value.SerializeToString()
            write_one(addr, pre)
        commit_ts = reg.get_ts()
        for addr in cluster.pump_addrs.values():
            write_one(addr, commit(start, commit_ts))
    wait_safe(cluster, commit_ts + 1)

    result = ingest.ingest_window(spark, str(tmp_path / "lake"), cluster.registry_addr, start, commit_ts + 1)
    assert (result.txns, result.rows, result.duplicates) == (1, 1, 1)
    assert result.rows_per_pump == {"pump1": 1, "pump2": 0}
    rows = spark.read.format("delta").load(location.table_path(str(tmp_path / "lake"), "changes")).collect()
    assert [(r["start_ts"], r["pump"], r["op"]) for r in rows] == [(start, "pump1", "insert")]


def _sample(col_type: int) -> Any:
    import datetime as dt
    import decimal

    return {binlog_pb2.INT: 1, binlog_pb2.STRING: "x", binlog_pb2.DECIMAL: decimal.Decimal("1.00"),
            binlog_pb2.DATETIME: dt.datetime(2020, 1, 1), binlog_pb2.BYTES: b"x"}[col_type]


def test_window_above_the_safe_ts_fails_clearly(spark: SparkSession, cluster: DevCluster, tmp_path: pathlib.Path) -> None:
    end = tso.compose(int(time.time() * 1000) + 3_600_000)
    with pytest.raises(errors.FailedPrecondition, match=r"above pump pump\d's safe ts \d+ \(20"):
        ingest.ingest_window(spark, str(tmp_path / "lake"), cluster.registry_addr, end - 1000, end)
    assert not (tmp_path / "lake").exists()


def test_window_below_a_pumps_gc_ts_fails_naming_it(spark: SparkSession, registry: Any, pump_factory: Any,
                                                    tmp_path: pathlib.Path) -> None:
    node = pump_factory.start("gcpump")
    with RegistryClient(registry.addr) as reg:
        start = reg.get_ts()
        write_one(node.addr, prewrite(start))
        write_one(node.addr, commit(start, reg.get_ts()))
        wait_until(lambda: node.storage.safe_ts > start + 10, 10, what="safe ts past the transaction")
        gc_ts = node.storage.gc(node.storage.safe_ts)["gc_ts"]
    assert gc_ts > start
    with pytest.raises(errors.OutOfRange, match=rf"below pump gcpump's GC ts {gc_ts} \("):
        ingest.ingest_window(spark, str(tmp_path / "lake"), registry.addr, start, gc_ts)


# ---------------------------------------------------------------- the data source on its own
def test_data_source_reads_a_window_on_its_own(
    spark: SparkSession, cluster: DevCluster, upstream: dict[str, Any], lake_in_order: dict[str, Any]
) -> None:
    """Without ingest's scan handed over, the reader scans the window itself (DDLs,
    duplicates); a window starting at the workload's start needs no earlier history."""
    lake_source.register(spark)
    summary = upstream["summary"]
    opts = {"registry": cluster.registry_addr, "start_ts": str(summary.start_ts), "end_ts": str(summary.end_ts)}
    df = spark.read.format("binlake").options(**opts, sub_window=str((summary.end_ts - summary.start_ts) // 4 + 1)).load()
    assert df.rdd.getNumPartitions() == 2 * 4
    lake = spark.read.format("delta").load(location.table_path(lake_in_order["lake"], "changes"))
    assert sorted(df.collect()) == sorted(lake.select(*df.columns).collect())
    ddl = spark.read.format("binlake").options(**opts, kind="ddl").load()
    assert ddl.count() == summary.ddls
    with pytest.raises(Exception, match="option 'kind' must be one of changes, ddl"):
        spark.read.format("binlake").options(**opts, kind="rows").load()


# ---------------------------------------------------------------- entry points
def test_cli_and_job_entry_points(spark: SparkSession, cluster: DevCluster, upstream: dict[str, Any],
                                  tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    from binlake import cli

    lake = str(tmp_path / "lake")
    (a, b), (_, c), _ = upstream["windows"]
    base = ["--log-level", "WARNING"]
    assert cli.main([*base, "ingest", "--registry", cluster.registry_addr, "--start-ts", str(a), "--end-ts", str(b),
                     "--lake", lake, "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["start_ts"], result["end_ts"], result["replaced"]) == (a, b, False) and result["rows"] > 0

    assert cli.main([*base, "lake", "windows", "--lake", lake, "--json"]) == 0
    windows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(w["start_ts"], w["end_ts"], w["rows"]) for w in windows] == [(a, b, result["rows"])]
    table = sorted(k.split(":")[0] for k in result["rows_per_table_op"])[0]
    assert cli.main([*base, "lake", "changes", "--lake", lake, "--table", table, "--limit", "3", "--json"]) == 0
    changes = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(changes) == 3 and all(f"{ch['db']}.{ch['tbl']}" == table for ch in changes)
    assert [(ch["commit_ts"], ch["seq"]) for ch in changes] == sorted((ch["commit_ts"], ch["seq"]) for ch in changes)

    # A refused window: one line on stderr, exit status 2.
    assert cli.main([*base, "ingest", "--registry", cluster.registry_addr, "--start-ts", str(a + 1),
                     "--end-ts", str(c), "--lake", lake]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("binlake ingest: error: ") and "overlaps the ingested window" in err[-1]

    # The spark-submit entry point: the same window again replaces it.
    spec = importlib.util.spec_from_file_location("ingest_job", pathlib.Path(__file__).parents[2] / "jobs" / "ingest.py")
    job = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(job)
    assert job.main(["--start-ts", str(a), "--end-ts", str(b), "--lake", lake, "--registry", cluster.registry_addr]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["replaced"] and again["rows"] == result["rows"]
    # Exit 3: no retry can help (Airflow fails the task at once) ...
    assert job.main(["--start-ts", str(a + 1), "--end-ts", str(c), "--lake", lake,
                     "--registry", cluster.registry_addr]) == 3
    assert "(retrying cannot help): " in capsys.readouterr().err
    # ... exit 2: a retry may (the window's end is above the Pumps' safe ts).
    ahead = tso.compose(int(time.time() * 1000) + 3_600_000)
    assert job.main(["--start-ts", str(c), "--end-ts", str(ahead), "--lake", lake,
                     "--registry", cluster.registry_addr]) == 2
    assert "safe ts" in capsys.readouterr().err
