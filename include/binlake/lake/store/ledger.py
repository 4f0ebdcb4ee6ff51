"""The lake's Delta tables as a job finds them: whether a table is there yet
(``is_delta``) and the ``windows`` ledger of ingested windows (``read_windows``),
the record that makes ingests idempotent and that apply and restore read first,
and what of a range no ingested window covers (``uncovered``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from binlake.lake.sparkenv import connect
from binlake.lake.sparkenv.session import configure_spark
from binlake.lake.store.location import WINDOWS, table_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def is_delta(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` holds a Delta table: its log directory exists (a file-system
    check, cheaper than loading the table's state; works over Spark Connect too)."""
    if path.startswith("s3a://"):
        # Every job asks this first about the tables it opens: a session built before
        # the S3 settings were known (a task that read its Connection after starting
        # Spark) gets them here, before its first S3 access.
        configure_spark(spark)
    return connect.delta_log_exists(spark, path)


def read_windows(spark: SparkSession, lake: str) -> list[dict[str, Any]]:
    """Every window of the ``windows`` ledger, by start_ts (empty when nothing was ingested yet).

    A local lake's ledger is read in this process (``arrowread.small_table_rows``);
    elsewhere, or when delta-rs cannot read it, through Spark."""
    # pyarrow and delta-rs are imported when a ledger is read, not with this module.
    from binlake.lake.store import arrowread

    path = table_path(lake, WINDOWS)
    if not is_delta(spark, path):
        return []
    rows = arrowread.small_table_rows(path, None)
    if rows is None:
        rows = [r.asDict(recursive=True) for r in spark.read.format("delta").load(path).collect()]
    # One row per window, the newest: a ledger row appended by an attempt whose
    # client died, committed by the server after the retry's, is the same window twice.
    newest: dict[tuple[int, int], dict[str, Any]] = {}
    for r in rows:
        key = (int(r["start_ts"]), int(r["end_ts"]))
        if key not in newest or str(r.get("ingested_at")) > str(newest[key].get("ingested_at")):
            newest[key] = r
    return [newest[k] for k in sorted(newest)]


def uncovered(windows: Sequence[dict[str, Any]], start_ts: int, end_ts: int) -> list[tuple[int, int]]:
    """The parts of ``[start_ts, end_ts)`` no ingested window covers."""
    gaps: list[tuple[int, int]] = []
    cursor = start_ts
    for s, e in sorted((int(w["start_ts"]), int(w["end_ts"])) for w in windows):
        if e <= cursor:
            continue
        if s >= end_ts:
            break
        if s > cursor:
            gaps.append((cursor, s))
        cursor = max(cursor, e)
    if cursor < end_ts:
        gaps.append((cursor, end_ts))
    return gaps
