"""The apply's reads from the lake: the windows ledger, the DDL history, and
the changes of a run of windows as one Arrow table in commit order.

Each lake table is read in this process (``lake.arrowread``: delta-rs picks
the files, PyArrow reads them) unless it cannot be (then through Spark, from
then on, logged once), and ``changes`` goes through Spark whenever the task
has expression filters, which Spark evaluates (Spark SQL over the images:
``expr_skips``). Consecutive small windows are read together (``READ_BUDGET``)
and served from that one read.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from binlake import errors
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
# Consecutive windows are read from the lake in one read while their row
# changes (the ledger's counts) add up to at most this many: small windows (the
# ingest DAG's five minutes) then do not each pay a read (a Spark job, when Spark
# reads), and the memory a read holds stays bounded (one window larger than this
# is read alone; two reads are held while one is written and the next compacted).
READ_BUDGET = 200_000


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
    prefetch thread reads windows."""

    def __init__(self, spark: Any, task: Task, lake: str, task_rules: rules.Rules) -> None:
        self.spark = spark
        self.task = task
        self.lake = lake
        self.rules = task_rules
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
            path = location.table_path(self.lake, location.CHANGES)
            if not lake_ledger.is_delta(self.spark, path):
                return empty_read(), set()
            df = (self.spark.read.format("delta").load(path)
                  .where(f"commit_date >= DATE'{d0}' AND commit_date <= DATE'{d1}' "
                         f"AND commit_ts >= {int(lo)} AND commit_ts < {int(hi)}"))
            table = df.select(*_READ).toArrow()
        # One chunk per column: slices and array kernels then never cross chunk boundaries.
        table = table.combine_chunks()
        if not in_commit_order(table):  # the scan usually is: then no copy of every column
            table = table.sort_by([("commit_ts", "ascending"), ("seq", "ascending")]).combine_chunks()
        skip = (expr_skips(self.task, self.rules, history, df, table)
                if df is not None and self.task.expr_filters else set())
        return table, skip

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

    def _read_in_process(self, name: str, read: Callable[[arrowread.TableReader], pa.Table]) -> pa.Table | None:
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

    def window_rows(self, windows: list[dict[str, Any]], n: int, lo: int, history: decode.SchemaHistory
                    ) -> tuple[pa.Table, np.ndarray, set[tuple[int, int]], int, int]:
        """The changes of window ``n`` (from ``lo``) as (table, its commit_ts as a
        NumPy array, expression-filter skips, first index, end index): read with
        the windows after it that fit in ``READ_BUDGET``, or taken from such an
        earlier read."""
        hi = int(windows[n]["end_ts"])
        buf = self._buffer
        if buf is None or not (buf[0] <= lo and hi <= buf[1]):
            rows = 0
            last = n
            while last < len(windows):
                more = int(windows[last].get("rows") or 0)
                if last > n and rows + more > READ_BUDGET:
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
