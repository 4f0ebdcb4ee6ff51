"""The apply's reads from the lake: the windows ledger, the DDL history, and
the changes of a run of windows, or of a piece of one window, as one Arrow
table in commit order.

Each lake table is read in this process (``lake.arrowread``: delta-rs picks
the files, PyArrow reads them) unless it cannot be (then through Spark, from
then on, logged once), and ``changes`` goes through Spark whenever the task
has expression filters, which Spark evaluates (Spark SQL over the images:
``expr_skips``).

A read holds at most the read budget (``[memory] read_budget``) of row
changes, whatever the windows' sizes: consecutive small windows are read
together up to it and served from that one read; a window with more row
changes than that (the ledger counts them) is read in pieces (``pieces``):
consecutive commit_ts ranges of at most the budget each, cut only between two
commit_ts, so a transaction is never split (one larger than the budget is a
piece of its own). The cuts come from row counts per commit_ts bucket, counted
over the commit_ts column alone (in this process, streamed) or by a Spark
aggregate: the window itself is never held to find them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from binlake import config, errors
from binlake.lake.decoding import decode
from binlake.lake.store import arrowread, location
from binlake.lake.store import ledger as lake_ledger
from binlake.proto import binlog_pb2
from binlake.replicate import rules
from binlake.replicate.task import Task

log = logging.getLogger(__name__)

# The columns of ``changes`` the apply reads.
_READ = ("commit_ts", "seq", "table_id", "schema_version", "op", "before", "after")
# ... of ``windows`` (the plan) and of ``ddl_history``.
_WINDOW_COLUMNS = ("start_ts", "end_ts", "status", "rows")
_DDL_COLUMNS = ("commit_ts", "table_id", "previous_table_id", "dropped", "table_info", "query")
# The apply's own columns beside an image's, as Spark's analysis errors list them.
_INTERNAL_COLUMN = re.compile(r"`?__binlake_\w+`?(, )?")
# The commit_ts buckets a window (or an over-budget bucket of it) is counted in
# to find its pieces' cuts: a bucket over the budget is counted again in as many
# finer buckets, down to one commit_ts.
_BUCKETS = 1024

_T = TypeVar("_T")


def empty_read() -> pa.Table:
    """No changes, with the columns a read returns."""
    return pa.table({"commit_ts": pa.array([], pa.int64()), "seq": pa.array([], pa.int32()),
                     "table_id": pa.array([], pa.int64()), "schema_version": pa.array([], pa.int64()),
                     "op": pa.array([], pa.string()), "before": pa.array([], pa.string()),
                     "after": pa.array([], pa.string())})


def in_commit_order(table: pa.Table) -> bool:
    """Whether the rows are sorted by (commit_ts, seq)."""
    if table.num_rows < 2:
        return True
    ts = table.column("commit_ts").to_numpy()
    seq = table.column("seq").to_numpy()
    step = np.diff(ts)
    return bool(np.all(step >= 0) and np.all((step > 0) | (np.diff(seq) > 0)))


# One read of the lake's changes: (from ts, to ts, its columns, their commit_ts
# as NumPy, the (commit_ts, seq) expression filters skip).
_Read = tuple[int, int, pa.Table, np.ndarray, set[tuple[int, int]]]


class LakeReader:
    """A task's reads of its lake, for one ``Applier``. Used by one thread at a
    time: the run's own thread reads the ledger and ddl_history, then only its
    prefetch thread reads windows.

    Consecutive windows are read in one read while their row changes (the
    ledger's counts) add up to at most ``budget``: small windows (the ingest DAG's
    five minutes) then do not each pay a read (a Spark job, when Spark reads). A
    window over the budget is read in pieces of at most the budget (``pieces``),
    so no read holds more than the budget, or one transaction larger than it
    (``peak_rows`` is the most a read held). The apply holds two reads at most:
    the one being written and the next being compacted."""

    def __init__(self, spark: Any, task: Task, lake: str, task_rules: rules.Rules) -> None:
        self.spark = spark
        self.task = task
        self.lake = lake
        self.rules = task_rules
        self.budget = config.memory().read_budget
        # The most row changes one read of ``changes`` held.
        self.peak_rows = 0
        # The last read from the lake (``window_rows``).
        self._buffer: _Read | None = None
        # Lake table -> its in-process reader, or None when Spark must read it (``_reader``).
        self._readers: dict[str, arrowread.TableReader | None] = {}

    def forget(self) -> None:
        """Drop the last read (its memory), at the start and end of a run."""
        self._buffer = None

    def windows(self) -> list[dict[str, Any]]:
        """The ledger's done windows by start_ts (their bounds, status and row count)."""
        table = self._read_in_process(location.WINDOWS, lambda r: r.read(_WINDOW_COLUMNS))
        if table is None:
            rows = lake_ledger.read_windows(self.spark, self.lake, _WINDOW_COLUMNS)
        else:
            rows = sorted(table.to_pylist(), key=lambda w: (int(w["start_ts"]), int(w["end_ts"])))
            # One row per window, as ledger.read_windows gives (a ledger row committed
            # twice by a lost client's attempt and its retry is the same window).
            rows = list({(int(w["start_ts"]), int(w["end_ts"])): w for w in rows}.values())
        return [w for w in rows if w.get("status", "done") == "done"]

    def ddl_rows(self) -> list[dict[str, Any]]:
        """The lake's ``ddl_history`` rows by commit_ts (none before the first DDL)."""
        table = self._read_in_process(location.DDL_HISTORY, lambda r: r.read(_DDL_COLUMNS))
        if table is not None:
            found: list[dict[str, Any]] = table.to_pylist()
        else:
            path = location.table_path(self.lake, location.DDL_HISTORY)
            if not lake_ledger.is_delta(self.spark, path):
                return []
            found = [r.asDict() for r in self.spark.read.format("delta").load(path).select(*_DDL_COLUMNS).collect()]
        # Sorted here: a Spark orderBy is two more jobs (sampling, then the sort) for a few rows.
        return sorted(found, key=lambda d: int(d["commit_ts"]))

    def read_changes(self, lo: int, hi: int, history: decode.SchemaHistory
                     ) -> tuple[pa.Table, set[tuple[int, int]]]:
        """The window's changes as an Arrow table in commit order, and the
        (commit_ts, seq) an expression filter removes.

        Read in this process (``arrowread``) unless the table or the task needs
        Spark, which then hands the window over as Arrow (``toArrow``: no Row
        objects). The sort is Arrow's, here, not a Spark shuffle. The columns
        stay Arrow: filtering, routing and compaction work on whole arrays
        (``batch``)."""
        d0, d1 = decode.commit_date(lo), decode.commit_date(max(lo, hi - 1))
        table = None
        if not self.task.expr_filters:  # expression filters are Spark SQL over the Spark DataFrame
            table = self._read_in_process(location.CHANGES,
                                          lambda r: r.read_changes(int(lo), int(hi), _READ, d0, d1))
        df = None
        if table is None:
            df = self._spark_changes(lo, hi)
            if df is None:
                return empty_read(), set()
            table = df.select(*_READ).toArrow()
        self.peak_rows = max(self.peak_rows, table.num_rows)
        # One chunk per column: slices and array kernels then never cross chunk boundaries.
        table = table.combine_chunks()
        if not in_commit_order(table):  # the scan usually is: then no copy of every column
            table = table.sort_by([("commit_ts", "ascending"), ("seq", "ascending")]).combine_chunks()
        skip = (expr_skips(self.task, self.rules, history, df, table)
                if df is not None and self.task.expr_filters else set())
        return table, skip

    def _spark_changes(self, lo: int, hi: int) -> Any:
        """The ``changes`` rows with ``lo <= commit_ts < hi`` as a Spark DataFrame
        (partitions pruned by their dates), or None when there is no table yet."""
        path = location.table_path(self.lake, location.CHANGES)
        if not lake_ledger.is_delta(self.spark, path):
            return None
        d0, d1 = decode.commit_date(lo), decode.commit_date(max(lo, hi - 1))
        return (self.spark.read.format("delta").load(path)
                .where(f"commit_date >= DATE'{d0}' AND commit_date <= DATE'{d1}' "
                       f"AND commit_ts >= {int(lo)} AND commit_ts < {int(hi)}"))

    def split(self, window: dict[str, Any]) -> bool:
        """Whether ``window`` is read in pieces: its ledger row count is over the budget."""
        return int(window.get("rows") or 0) > self.budget

    def pieces(self, window: dict[str, Any], lo: int) -> list[tuple[int, int]]:
        """The commit_ts ranges ``window`` is read and applied in, from ``lo`` (its
        start, or a checkpoint inside it) to its end: one range unless the window
        is over the budget (``split``).

        The cuts are those of the whole window, whatever ``lo`` is (the first range
        starts at ``lo``): a rerun from a checkpoint inside the window cuts the
        same pieces, as parallel mode's bucket rows (named by a batch's end) need."""
        a, b = int(window["start_ts"]), int(window["end_ts"])
        if not a <= lo < b:
            raise ValueError(f"{lo} is not inside window [{a}, {b})")
        if not self.split(window):
            return [(lo, b)]
        cuts: list[int] = []
        held = 0
        for start, rows in self._segments(a, b):
            if held and held + rows > self.budget:
                cuts.append(start)
                held = 0
            held += rows
        bounds = [a, *cuts, b]
        return [(max(x, lo), y) for x, y in zip(bounds, bounds[1:], strict=False) if y > lo]

    def _segments(self, lo: int, hi: int) -> Iterator[tuple[int, int]]:
        """``[lo, hi)`` as consecutive commit_ts ranges that hold rows, each given as
        (its start, its row count): each holds at most the budget, or one commit_ts."""
        width = -(-(hi - lo) // _BUCKETS)
        counts = self._ts_counts(lo, hi, width)
        for i in np.flatnonzero(counts):
            start = lo + int(i) * width
            end = min(hi, start + width)
            if counts[i] > self.budget and end - start > 1:
                yield from self._segments(start, end)  # finer buckets, down to one commit_ts
            else:
                yield start, int(counts[i])

    def _ts_counts(self, lo: int, hi: int, width: int) -> np.ndarray:
        """Row changes per commit_ts bucket of ``width`` over ``[lo, hi)``: scanned
        here (the commit_ts column, streamed) or counted by a Spark aggregate (a
        row per bucket comes back, never the rows)."""
        d0, d1 = decode.commit_date(lo), decode.commit_date(max(lo, hi - 1))
        counts = self._read_in_process(location.CHANGES, lambda r: r.commit_ts_counts(lo, hi, width, d0, d1))
        if counts is not None:
            return counts
        counts = np.zeros(-(-(hi - lo) // width), dtype=np.int64)
        df = self._spark_changes(lo, hi)
        if df is not None:
            from pyspark.sql import functions as F

            bucket = F.expr(f"(commit_ts - {int(lo)}) div {int(width)}").alias("bucket")
            for row in df.select(bucket).groupBy("bucket").count().collect():
                counts[int(row["bucket"])] += int(row["count"])
        return counts

    def _reader(self, name: str) -> arrowread.TableReader | None:
        """The in-process reader of lake table ``name`` (``arrowread``), or None when
        it cannot read that table: Spark reads it then (logged once)."""
        if name not in self._readers:
            try:
                self._readers[name] = arrowread.TableReader(location.table_path(self.lake, name))
            except arrowread.NotReadable as exc:
                self._readers[name] = None
                log.info("apply %s: reading the lake's %s table through Spark: %s", self.task.name, name, exc)
        return self._readers[name]

    def _read_in_process(self, name: str, read: Callable[[arrowread.TableReader], _T]) -> _T | None:
        """``read`` on table ``name``'s in-process reader; None (and Spark from then
        on) when there is none or the table turns out unreadable there."""
        reader = self._reader(name)
        if reader is None:
            return None
        try:
            return read(reader)
        except arrowread.NotReadable as exc:
            self._readers[name] = None
            log.info("apply %s: reading the lake's %s table through Spark from now on: %s", self.task.name, name, exc)
            return None

    def window_rows(self, windows: list[dict[str, Any]], n: int, lo: int, hi: int, history: decode.SchemaHistory
                    ) -> tuple[pa.Table, np.ndarray, set[tuple[int, int]], int, int]:
        """The changes of window ``n`` from ``lo`` to ``hi`` (its end, or the end of
        one of its ``pieces``) as (table, its commit_ts as a NumPy array,
        expression-filter skips, first index, end index). A piece of a window
        read in pieces is read alone; a whole window is read with the windows after
        it that fit in the budget, or taken from such an earlier read."""
        buf = self._buffer
        if self.split(windows[n]):
            self._buffer = None  # the last read goes before this one comes
            data, skip = self.read_changes(lo, hi, history)
            return data, data.column("commit_ts").to_numpy(), skip, 0, data.num_rows
        if buf is None or not (buf[0] <= lo and hi <= buf[1]):
            self._buffer = None
            rows = 0
            last = n
            while last < len(windows):
                more = int(windows[last].get("rows") or 0)
                if last > n and rows + more > self.budget:
                    break
                rows += more
                last += 1
            end = int(windows[last - 1]["end_ts"])
            data, skip = self.read_changes(lo, end, history) if rows > 0 else (empty_read(), set())
            stamps = data.column("commit_ts").to_numpy()
            buf = self._buffer = (lo, end, data, stamps, skip)
        stamps = buf[3]
        return (buf[2], stamps, buf[4], int(np.searchsorted(stamps, lo, "left")),
                int(np.searchsorted(stamps, hi, "left")))


def expr_skips(task: Task, task_rules: rules.Rules, history: decode.SchemaHistory, df: Any, data: pa.Table
               ) -> set[tuple[int, int]]:
        """(commit_ts, seq) of changes an expression filter removes, evaluated by Spark."""
        from pyspark.sql import functions as F

        from binlake.replicate import exprs

        skip: set[tuple[int, int]] = set()
        first_ts: dict[tuple[int, int], int] = {}  # (table_id, schema_version) -> a commit_ts it occurs at
        for table_id, version, ts in zip(data.column("table_id").to_pylist(), data.column("schema_version").to_pylist(),
                                         data.column("commit_ts").to_pylist(), strict=True):
            first_ts.setdefault((table_id, version), ts)
        seen: dict[tuple[int, int], binlog_pb2.TableInfo] = {}
        for (tid, _version), at in first_ts.items():
            try:
                info = history.table(tid, at)
            except decode.UnknownTableError:
                continue
            seen.setdefault((info.table_id, info.schema_version), info)
        for (table_id, version), info in seen.items():
            filters = task_rules.expr_filters(info.db, info.name)
            if not filters:
                continue
            schema = exprs.spark_schema(info)
            part = df.where((F.col("table_id") == table_id) & (F.col("schema_version") == version)).select(
                F.col("commit_ts").alias("__binlake_ts"), F.col("seq").alias("__binlake_seq"),
                F.col("op").alias("__binlake_op"),
                F.from_json("before", schema).alias("__binlake_b"), F.from_json("after", schema).alias("__binlake_a"))
            for i, ef in enumerate(task.expr_filters):
                if ef not in filters:
                    continue
                for op, image, expr, key in (
                        ("insert", "__binlake_a", ef.insert_value_expr, "insert_value_expr"),
                        ("update", "__binlake_b", ef.update_old_value_expr, "update_old_value_expr"),
                        ("update", "__binlake_a", ef.update_new_value_expr, "update_new_value_expr"),
                        ("delete", "__binlake_b", ef.delete_value_expr, "delete_value_expr")):
                    if not expr:
                        continue
                    sel = part.where(F.col("__binlake_op") == op).select("__binlake_ts", "__binlake_seq",
                                                                          f"{image}.*")
                    try:
                        hits = sel.where(expr).select("__binlake_ts", "__binlake_seq").collect()
                    except Exception as exc:  # AnalysisException / ParseException: the user's expression
                        first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
                        # Spark's suggestions list the apply's own columns too: the user never wrote them.
                        first = _INTERNAL_COLUMN.sub("", first).replace("[, ", "[").replace(", ]", "]")
                        raise errors.InvalidArgument(
                            f"task {task.name}: expr_filters.{i}.{key} {expr!r} is not a valid predicate over "
                            f"{info.db}.{info.name} ({', '.join(c.name for c in info.columns)}): {first[:300]}"
                        ) from None
                    skip.update((int(h[0]), int(h[1])) for h in hits)
        return skip
