"""What the windows ledger lets a restore promise (pure functions, no Spark), and the type mapping."""

from __future__ import annotations

import pytest

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.restore import columns, coverage


def ledger(*bounds: tuple[int, int], status: str = "done") -> list[dict[str, object]]:
    return [{"start_ts": a, "end_ts": b, "status": status} for a, b in bounds]


def test_covered_ts_pass_at_every_edge() -> None:
    w = ledger((100, 200), (200, 300))
    for ts in (100, 101, 199, 200, 201, 299):
        coverage.check(w, ts)
    coverage.check(w, 299, base_ts=150)
    assert coverage.last_restorable(w) == 299


@pytest.mark.parametrize(("ts", "base", "message"), [
    (500, None, r"newest ingested window ends at 500 \(.*\); ingest \[500, 501\)"),
    (10_000, None, r"ingest \[500, 10001\)"),
    (300, None, r"gap \[300, 400\)"),
    (99, None, "before the oldest data the lake holds"),
    (450, None, r"gap \[300, 400\).*ingest \[300, 400\) first"),
    (450, 350, r"gap \[351, 400\)"),
])
def test_uncovered_ts_are_refused_naming_the_window(ts: int, base: int | None, message: str) -> None:
    w = ledger((100, 200), (200, 300), (400, 500))
    with pytest.raises(errors.FailedPrecondition, match=message):
        coverage.check(w, ts, base)


def test_a_gap_stops_the_history_and_unfinished_windows_do_not_count() -> None:
    w = ledger((100, 200), (400, 500)) + ledger((200, 400), status="running")
    assert coverage.last_restorable(w) == 199
    with pytest.raises(errors.FailedPrecondition, match="gap"):
        coverage.check(w, 450)
    with pytest.raises(errors.NotFound, match="no ingested window"):
        coverage.check([], 5)
    with pytest.raises(errors.InvalidArgument, match="TSO"):
        coverage.check(w, -1)


@pytest.mark.parametrize(("code", "sql", "spark"), [
    (binlog_pb2.INT, "int", "bigint"), (binlog_pb2.UINT, "uint", "decimal(20,0)"),
    (binlog_pb2.FLOAT, "", "double"), (binlog_pb2.DECIMAL, "decimal(20,2)", "decimal(20,2)"),
    (binlog_pb2.DECIMAL, "DECIMAL(38,10)", "decimal(38,10)"), (binlog_pb2.DECIMAL, "decimal(65,30)", "string"),
    (binlog_pb2.DECIMAL, "NUMERIC(7)", "decimal(7,0)"), (binlog_pb2.STRING, "string(64)", "string"),
    (binlog_pb2.BYTES, "", "binary"), (binlog_pb2.DATE, "", "date"), (binlog_pb2.DATETIME, "", "timestamp_ntz"),
    (binlog_pb2.TIME, "", "string"), (binlog_pb2.JSON, "", "string"), (binlog_pb2.BOOL, "", "boolean"),
])
def test_codec_types_map_to_spark_types(code: int, sql: str, spark: str) -> None:
    assert columns.spark_type(code, sql) == spark
