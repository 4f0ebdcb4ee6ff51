"""The lake's pure helpers: window coverage and overlap rules, partition cuts,
the data source's options, and binlake errors recovered from Spark failures."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from binlake import errors, tso
from binlake.cli.args import window_args
from binlake.lake import commands, ingest
from binlake.lake.decoding.schema_history import SchemaHistory
from binlake.lake.pumps import pump_pull
from binlake.lake.pumps.pump_check import check_pumps
from binlake.lake.pumps.pump_pull import pull_resumable
from binlake.lake.pumps.read_options import ReadOptions
from binlake.lake.pumps.window_index import WindowIndex, index_streams
from binlake.lake.sparkenv.spark_errors import binlake_error
from binlake.lake.store import ledger, location
from binlake.proto import binlog_pb2
from binlake.sql import schema as sc
from binlake.sql.schema import ColumnDef, new_table

DAY = tso.compose(86_400_000)


def w(s: int, e: int) -> dict[str, int]:
    return {"start_ts": s, "end_ts": e}


def test_uncovered_ranges() -> None:
    assert ledger.uncovered([], 0, 100) == [(0, 100)]
    assert ledger.uncovered([w(10, 20), w(30, 40)], 0, 100) == [(0, 10), (20, 30), (40, 100)]
    assert ledger.uncovered([w(30, 40), w(0, 30)], 0, 35) == []
    assert ledger.uncovered([w(0, 50)], 10, 20) == []
    assert ledger.uncovered([w(60, 70)], 0, 50) == [(0, 50)]


def test_overlap_rules() -> None:
    windows = [w(10, 20), w(20, 30)]
    assert ingest.check_overlap(windows, 10, 20) is True  # the same bounds: replaced
    assert ingest.check_overlap(windows, 30, 40) is False  # adjacent: fine
    assert ingest.check_overlap(windows, 0, 10) is False
    with pytest.raises(errors.FailedPrecondition, match=r"overlaps the ingested window \[10, 20\)"):
        ingest.check_overlap(windows, 15, 20)
    with pytest.raises(errors.FailedPrecondition, match=r"\[20, 30\)"):
        ingest.check_overlap(windows, 25, 45)


def txn(commit_ts: int, start_ts: int, rows: int, table_id: int = 100) -> binlog_pb2.Binlog:
    """A committed transaction inserting ``rows`` rows into ``table_id``."""
    mutation = binlog_pb2.TableMutation(table_id=table_id, inserted_rows=[b"r"] * rows,
                                        sequence=[binlog_pb2.INSERT] * rows)
    return binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=start_ts, commit_ts=commit_ts,
                             prewrite_value=binlog_pb2.PrewriteValue(mutations=[mutation]).SerializeToString())


def test_partition_cuts_fall_between_transactions() -> None:
    def splits(streams: dict[str, list[binlog_pb2.Binlog]]) -> dict[str, list[int]]:
        # 3 partitions of at least 100 row changes: a cut after every 100 or more.
        return index_streams(1, 1_000, streams, partitions=3, min_rows_per_partition=100).splits

    txns = [txn(100, 1, 50), txn(100, 2, 50), txn(110, 3, 50), txn(120, 4, 50), txn(130, 5, 50)]
    assert splits({"p1": txns}) == {"p1": [110, 130]}
    # Two transactions sharing a commit_ts are never cut apart.
    assert splits({"p1": [txn(100, 1, 100), txn(100, 2, 100), txn(105, 3, 1)]}) == {"p1": [105]}
    # Copies a Pump skips (p1, the lower id, holds start_ts 2 too) do not count.
    assert splits({"p1": [txn(100, 2, 50)], "p2": txns}) == {"p2": [120]}


def test_the_scan_keeps_the_same_state_for_ten_times_the_transactions() -> None:
    """The scan's memory does not grow with the window's transactions: three Pumps,
    every 97th transaction held by two of them, 10x the transactions for about the
    same peak of memory allocated while scanning (the counts stay exact)."""
    import tracemalloc

    def stream(pump: int, n: int) -> Iterator[binlog_pb2.Binlog]:
        for i in range(n):  # generated as read: only the scan's own state stays
            if pump == i % 3 or (i % 97 == 0 and pump == (i + 1) % 3):
                yield txn(1_000 + 2 * i, 999 + 2 * i, 1 + i % 5, 100 + i % 7)

    def scan(n: int) -> tuple[WindowIndex, int]:
        tracemalloc.start()
        try:
            index = index_streams(1, 10**9, {f"p{k}": stream(k, n) for k in range(3)}, partitions=4,
                                  min_rows_per_partition=1)
            return index, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    peaks = []
    for n in (1_500, 15_000):
        index, peak = scan(n)
        peaks.append(peak)
        dups = [999 + 2 * i for i in range(0, n, 97)]
        assert (index.total_txns, index.duplicates) == (n, len(dups))
        # A copy is skipped by the higher pump id of the two holding it.
        assert index.skip == {f"p{k}": [999 + 2 * i for i in range(0, n, 97) if max(i % 3, (i + 1) % 3) == k]
                              for k in (1, 2)}
        assert index.total_rows == sum(1 + i % 5 for i in range(n))
        owner = [min(i % 3, (i + 1) % 3) if i % 97 == 0 else i % 3 for i in range(n)]  # the lowest id emits
        assert index.rows == {f"p{k}": sum(1 + i % 5 for i in range(n) if owner[i] == k) for k in range(3)}
        assert sorted((t, i + u + d) for _ts, t, i, u, d in index.table_counts) == sorted(
            (100 + k, sum(1 + i % 5 for i in range(k, n, 7))) for k in range(7))
        per_part = -(-index.total_rows // 4)
        assert all(len(bounds) <= index.rows[p] // per_part for p, bounds in index.splits.items())
    # The readers' bounded queues fill more or less as the threads are scheduled (a
    # loaded machine: about 2x at most); state kept per transaction grows 8x here.
    assert peaks[1] < 3 * peaks[0] and peaks[1] < 1 << 20, f"scan memory grew with the transactions: {peaks}"


def test_window_index_travels_as_json() -> None:
    info = new_table(100, "app", "t", [ColumnDef("id", "int", False)], ["id"], None, 1)
    ddl = binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=5, commit_ts=9, ddl_query=b"CREATE TABLE t",
                            ddl_table=info)
    index = WindowIndex(1, 100, ddls=[("pump1", ddl)], skip={"pump2": [7]}, splits={"pump1": [50]})
    back = WindowIndex.from_json(index.to_json())
    assert (back.start_ts, back.end_ts, back.ddls, back.skip, back.splits) == (1, 100, [("pump1", ddl)],
                                                                                {"pump2": [7]}, {"pump1": [50]})
    with pytest.raises(errors.InvalidArgument, match="window_index"):
        WindowIndex.from_json('{"start_ts": 1}')


def test_table_op_counts_name_tables_as_they_were_then() -> None:
    v1 = new_table(100, "app", "t", [ColumnDef("id", "int", False)], ["id"], None, 1)
    history = SchemaHistory.from_tables([v1], commit_ts=1)
    rename = binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=48, commit_ts=50, ddl_query=b"RENAME TABLE t TO t2",
                               ddl_table=sc.rename_table(v1, "t2", 2))
    update = binlog_pb2.TableMutation(table_id=100, updated_rows=[b"r"], sequence=[binlog_pb2.UPDATE])
    delete = binlog_pb2.TableMutation(table_id=100, deleted_rows=[b"r"] * 3, sequence=[binlog_pb2.DELETE_ROW] * 3)
    streams = {
        "p1": [txn(10, 9, 2), binlog_pb2.Binlog(
            tp=binlog_pb2.COMMIT, start_ts=11, commit_ts=12,
            prewrite_value=binlog_pb2.PrewriteValue(mutations=[update]).SerializeToString()), txn(70, 69, 1)],
        # The rename, and a transaction of its commit_ts: it used the definition before the rename.
        "p2": [rename, txn(50, 49, 4), binlog_pb2.Binlog(
            tp=binlog_pb2.COMMIT, start_ts=59, commit_ts=60,
            prewrite_value=binlog_pb2.PrewriteValue(mutations=[delete]).SerializeToString())],
    }
    index = index_streams(1, 100, streams)
    history.apply(rename)
    assert ingest._table_op_counts(index, history) == {
        "app.t:insert": 6, "app.t:update": 1, "app.t2:delete": 3, "app.t2:insert": 1}
    # One count per table and stretch between its DDLs, not one per transaction.
    assert index.table_counts == [(10, 100, 6, 1, 0), (60, 100, 1, 0, 3)]


OPTS = {"registry": "127.0.0.1:8230", "start_ts": "10", "end_ts": "20"}


def test_read_options() -> None:
    o = ReadOptions.parse({**OPTS, "pumps": "pump1, pump2", "Kind": "ddl", "sub_window": "5"})
    assert (o.start_ts, o.end_ts, o.pumps, o.kind, o.sub_window) == (10, 20, ["pump1", "pump2"], "ddl", 5)
    assert ReadOptions.parse(OPTS).kind == "changes"


@pytest.mark.parametrize(("options", "message"), [
    ({"start_ts": "1", "end_ts": "2"}, "'registry'"),
    ({**OPTS, "registry": "nohost"}, "HOST:PORT"),
    ({**OPTS, "end_ts": ""}, "'end_ts' .* is required"),
    ({**OPTS, "start_ts": "abc"}, "'start_ts' must be an integer"),
    ({**OPTS, "end_ts": "10"}, "is empty"),
    ({**OPTS, "end_ts": str(1 << 64)}, r"\[0, 2\^63\)"),
    ({**OPTS, "kind": "rows"}, "'kind' must be one of changes, ddl"),
    ({**OPTS, "sub_window": "-3"}, "'sub_window' must be a positive"),
    ({**OPTS, "pumps": " , "}, "lists no pump"),
    ({**OPTS, "colour": "red"}, "unknown option"),
])
def test_bad_read_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=message):
        ReadOptions.parse(options)


def test_binlake_errors_are_recovered_from_spark_messages() -> None:
    text = ("org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
            '  File "x.py", line 1, in read\n'
            "binlake.errors.OutOfRange: window [1, 2) starts below pump pump1's GC ts 5\n\n  at org.apache...")
    err = binlake_error(RuntimeError(text))
    assert isinstance(err, errors.OutOfRange) and str(err) == "window [1, 2) starts below pump pump1's GC ts 5"
    err = binlake_error(RuntimeError("binlake.lake.decoding.decode.UnknownTableError: table id 7 has no definition"))
    assert isinstance(err, errors.FailedPrecondition) and "table id 7" in str(err)
    assert binlake_error(RuntimeError("java.lang.OutOfMemoryError")) is None


def test_window_predicate_bounds_the_partitions() -> None:
    start = tso.compose(1_795_000_000_000)
    where = ingest._window_predicate(start, start + DAY)
    assert where == ("commit_date >= DATE'2026-11-18' AND commit_date <= DATE'2026-11-19' "
                     f"AND commit_ts >= {start} AND commit_ts < {start + DAY}")


def test_lake_paths_and_argument_checks(tmp_path: object) -> None:
    assert location.table_path("s3a://bucket/lake/", "changes") == "s3a://bucket/lake/changes"
    assert location.table_path("/data/lake", "windows") == "/data/lake/windows"
    with pytest.raises(ValueError, match="unknown lake table"):
        location.table_path("/data/lake", "snapshots")
    with pytest.raises(errors.InvalidArgument, match="lake must be"):
        location.check_lake("  ")
    with pytest.raises(TypeError, match="SparkSession"):
        ingest.ingest_window(None, "/tmp/lake", "127.0.0.1:1", 1, 2)
    with pytest.raises(errors.InvalidArgument, match="empty"):
        ingest.ingest_window(argparse.Namespace(read=1), "/tmp/lake", "127.0.0.1:1", 2, 2)
    with pytest.raises(errors.InvalidArgument, match="pumps must be a list"):
        ingest.ingest_window(argparse.Namespace(read=1), "/tmp/lake", "127.0.0.1:1", 1, 2, pumps="pump1")


def test_cli_window_arguments() -> None:
    def ns(**kw: object) -> argparse.Namespace:
        return argparse.Namespace(**{"start_ts": None, "end_ts": None, "start": None, "end": None, **kw})

    assert window_args(ns(start_ts=1, end=5)) == (1, 5)
    with pytest.raises(errors.InvalidArgument, match="once"):
        window_args(ns(start_ts=1, start=2, end_ts=5))
    with pytest.raises(errors.InvalidArgument, match="needs a start"):
        window_args(ns(end_ts=5))
    with pytest.raises(errors.InvalidArgument, match="empty"):
        window_args(ns(start_ts=5, end_ts=5))
    assert commands.pump_list(" a, b ,") == ["a", "b"] and commands.pump_list(None) is None
    with pytest.raises(errors.InvalidArgument, match="at least one"):
        commands.pump_list(",")


def test_pump_reads_resume_after_a_transient_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    from binlake.client import reader

    txns = [binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=s, commit_ts=c)
            for s, c in ((5, 10), (18, 20), (19, 20), (25, 30))]
    calls: list[int] = []

    def flaky(addr: str, lo: int, hi: int, node_id: str = "") -> object:
        calls.append(lo)
        for t in txns:
            if lo <= t.commit_ts < hi:
                if len(calls) == 1 and t.commit_ts == 30:
                    raise errors.Unavailable(f"reading from pump {node_id}: connection reset")
                yield t

    monkeypatch.setattr(reader, "pull_pump", flaky)
    monkeypatch.setattr(pump_pull.time, "sleep", lambda _s: None)
    got = [(t.commit_ts, t.start_ts) for t in pull_resumable("pump1", "127.0.0.1:1", 0, 100)]
    assert got == [(10, 5), (20, 18), (20, 19), (30, 25)]
    assert calls == [0, 20]  # resumed at the last commit_ts handed out, its transactions skipped

    def refused(addr: str, lo: int, hi: int, node_id: str = "") -> object:
        calls.append(lo)
        raise errors.FailedPrecondition("window end is above pump pump1's safe ts")
        yield  # pragma: no cover

    monkeypatch.setattr(reader, "pull_pump", refused)
    calls.clear()
    with pytest.raises(errors.FailedPrecondition):
        list(pull_resumable("pump1", "127.0.0.1:1", 0, 100))
    assert calls == [0]  # a refusal is not retried

    def down(addr: str, lo: int, hi: int, node_id: str = "") -> object:
        raise errors.Unavailable("pump pump1 unreachable")
        yield  # pragma: no cover

    monkeypatch.setattr(reader, "pull_pump", down)
    with pytest.raises(errors.Unavailable, match="unreachable"):
        list(pull_resumable("pump1", "127.0.0.1:1", 0, 100))


def test_unreachable_pump_is_named() -> None:
    from binlake.lake.pumps.planner import WindowPlan
    from binlake.registry.model import NodeRecord

    port = __import__("pumpkit").free_port()
    plan = WindowPlan(10, 20, (NodeRecord("pump7", "pump", f"127.0.0.1:{port}"),))
    with pytest.raises(errors.Unavailable, match=rf"pump pump7 at 127.0.0.1:{port} is unreachable .*\[10, 20\)"):
        check_pumps(plan, timeout_s=2.0)
