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


# The ledger's columns what coverage, checkpoints and overlap checks read: a
# window's bounds and state, without its per-Pump and per-table maps.
BOUNDS = ("start_ts", "end_ts", "status", "ingested_at")
# Read whatever is asked: they tell a window's rows apart (``read_windows``).
_ALWAYS = ("start_ts", "end_ts", "ingested_at")


def read_windows(spark: SparkSession, lake: str, columns: Sequence[str] | None = None, *,
                 overlapping: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """Every window of the ``windows`` ledger, by start_ts (empty when nothing was ingested yet).

    ``columns``: only these of the ledger's columns (``BOUNDS`` for a window's
    bounds and state; start_ts, end_ts and ingested_at are always read);
    ``overlapping=(lo, hi)``: only the windows overlapping ``[lo, hi)``. Both go
    to the read itself (column pruning, and file statistics for the range), so a
    caller reads no more of the ledger than it uses.

    A local lake's ledger is read in this process (``arrowread.small_table_rows``);
    elsewhere, or when delta-rs cannot read it, through Spark."""
    from binlake.lake.decoding.rows import WINDOW_COLUMNS

    names = [name for name, _ in WINDOW_COLUMNS]
    wanted: list[str] | None = None
    if columns is not None:
        unknown = [c for c in columns if c not in names] if not isinstance(columns, str) else [columns]
        if unknown:
            raise ValueError(f"columns must be a list of the ledger's columns ({', '.join(names)}), got {columns!r}")
        wanted = [n for n in names if n in set(columns) | set(_ALWAYS)]
    if overlapping is not None:
        lo, hi = overlapping
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (lo, hi)) or lo >= hi:
            raise ValueError(f"overlapping must be a range (lo, hi) of TSOs with lo < hi, got {overlapping!r}")
    # pyarrow and delta-rs are imported when a ledger is read, not with this module.
    from binlake.lake.store import arrowread

    path = table_path(lake, WINDOWS)
    if not is_delta(spark, path):
        return []
    where = None
    if overlapping is not None:
        import pyarrow.dataset as pads

        where = (pads.field("end_ts") > lo) & (pads.field("start_ts") < hi)
    rows = arrowread.small_table_rows(path, wanted, where)
    if rows is None:
        df = spark.read.format("delta").load(path)
        if overlapping is not None:
            df = df.where(f"end_ts > {lo} AND start_ts < {hi}")
        if wanted is not None:
            df = df.select(*wanted)
        rows = [r.asDict(recursive=True) for r in df.collect()]
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
