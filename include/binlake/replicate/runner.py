"""The apply: every ingested window after the target's checkpoint, in commit_ts
order, filtered, routed, compacted and written to the target, exactly once.

Per window ``[a, b)`` (from the lake's ``windows`` ledger; a gap stops the
apply naming the missing window):

1. read the window's ``changes`` (and its DDLs from ``ddl_history``) as Arrow,
   in this process (``lake.arrowread``: delta-rs picks the files, PyArrow
   reads them), or through Spark when the table needs it or the task has
   expression filters, which Spark evaluates (Spark SQL over the images); the
   next window is read and compacted in a second thread while one is written;
2. cut the window at its DDLs into batches (no DDL inside a batch: one table
   definition, filter verdict and route per table id for all of it); drop what
   the filters and event filters exclude, route the table;
3. compact every table's changes to one per key as whole Arrow arrays
   (``arrowcompact``: the images parsed by Arrow's JSON reader, the DM rules as
   a group-by on the key; what it cannot type goes through ``rawcompact``, one
   change at a time; safe mode decodes every change instead, since it deletes
   every key a batch touches), and write them: deletes of the keys that go
   away or change, then inserts of the final rows (PostgreSQL: one COPY of CSV
   written by Arrow; safe mode: deletes of every touched key, then upserts),
   and then the DDL;
4. move the checkpoint, in the same target transaction as the data.

``consistent`` mode writes the whole window in one transaction (PostgreSQL and
SQLite run DDL inside it too), so the target always equals the upstream at the
end of some window. On MySQL/MariaDB a DDL commits by itself: the batch before
it commits with the checkpoint at the DDL's commit_ts, then the DDL runs and
the checkpoint moves past it (a crash between the two re-runs the DDL, which
is idempotent, see ``target_ddl``).

``parallel`` mode splits each (compacted) batch into conflict groups
(``causality``), deals them into one bucket per Spark task and applies the
buckets concurrently: each Spark task writes its bucket in one transaction,
with one checkpoint row for the bucket; once every bucket of a batch is in,
the task's checkpoint moves to the batch's end. A rerun skips the buckets
already in (a bucket is in or not, never half). When every table of a batch
has no unique key but its primary key (PostgreSQL, SQLite), its final changes
are on distinct keys and cannot conflict: they are dealt into buckets by key
and reach the tasks as Arrow (``_arrow_buckets``), not as Python changes.

Normal mode checks the target against the log: a key the window deletes or
updates must be there, a key it inserts must not (``TargetDiverged`` names the
table and key, and the window's transaction is rolled back). Safe mode (DM's,
for the windows after a restored snapshot) does not check, and converges.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from binlake import errors, failpoint, tso
from binlake.lake import arrowread, decode, ingest
from binlake.proto import binlog_pb2
from binlake.replicate import (
    arrowcompact,
    causality,
    checkpoint,
    compactor,
    rawcompact,
    rules,
    sink,
    target_ddl,
)
from binlake.replicate.compactor import DELETE, INSERT, UPDATE, Change
from binlake.replicate.task import Task

log = logging.getLogger(__name__)

Progress = Callable[[str], None]

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


def _empty_read() -> pa.Table:
    return pa.table({"commit_ts": pa.array([], pa.int64()), "seq": pa.array([], pa.int32()),
                     "table_id": pa.array([], pa.int64()), "schema_version": pa.array([], pa.int64()),
                     "op": pa.array([], pa.string()), "before": pa.array([], pa.string()),
                     "after": pa.array([], pa.string())})


def _in_commit_order(table: pa.Table) -> bool:
    """Whether the rows are sorted by (commit_ts, seq)."""
    if table.num_rows < 2:
        return True
    ts = table.column("commit_ts").to_numpy()
    seq = table.column("seq").to_numpy()
    step = np.diff(ts)
    return bool(np.all(step >= 0) and np.all((step > 0) | (np.diff(seq) > 0)))


def _raw_changes(part: pa.Table, decoders: dict[int, rawcompact.ImageDecoder]) -> list[rawcompact.RawChange]:
    """The rows of ``part`` as ``rawcompact`` changes (commit order)."""
    cols = [part.column(c).to_pylist() for c in ("op", "before", "after", "commit_ts", "seq", "table_id")]
    return [(op, b, a, ts, seq, decoders[tid]) for op, b, a, ts, seq, tid in zip(*cols, strict=True)]


class TargetDiverged(errors.Conflict):
    """The target does not hold what the log says it must (changed by hand)."""


@dataclasses.dataclass
class ApplySummary:
    task: str
    target: str
    windows: int = 0
    changes_by_op: Counter[str] = dataclasses.field(default_factory=Counter)
    rows_written: int = 0  # rows deleted + inserted/upserted after compaction
    ddls: int = 0
    filtered: int = 0
    elapsed_s: float = 0.0
    checkpoint_ts: int = 0
    first_window: tuple[int, int] | None = None
    last_window: tuple[int, int] | None = None
    behind: int = 0

    @property
    def changes(self) -> int:
        return sum(self.changes_by_op.values())

    def summary(self) -> str:
        rate = self.changes / self.elapsed_s if self.elapsed_s > 0 else 0.0
        ops = ", ".join(f"{self.changes_by_op.get(op, 0):,} {op}" for op in (INSERT, UPDATE, DELETE))
        lines = [f"apply {self.task} -> {self.target}",
                 f"  windows      {self.windows}" + (f"  [{self.first_window[0]} .. {self.last_window[1]})"
                                                     if self.first_window and self.last_window else ""),
                 f"  row changes  {self.changes:,} ({ops}); {self.filtered:,} filtered out",
                 f"  rows written {self.rows_written:,} after compaction",
                 f"  DDLs         {self.ddls}",
                 f"  rate         {rate:,.0f} row changes/s in {self.elapsed_s:.1f}s",
                 f"  checkpoint   {self.checkpoint_ts} ({tso.iso(self.checkpoint_ts)})"]
        if self.behind:
            lines.append(f"  not applied  {self.behind} later window(s) (beyond --until)")
        return "\n".join(lines)


@dataclasses.dataclass
class _Batch:
    """The changes before one DDL (or the window's end), then that DDL."""

    end: int  # the DDL's commit_ts, or the window's end
    # target table -> its changes (compacted per key when ``compacted``; as Arrow when arrowcompact took them)
    tables: dict[str, list[Change] | arrowcompact.Compacted]
    infos: dict[str, binlog_pb2.TableInfo]  # target table -> its definition during the batch
    ddl: dict[str, Any] | None = None
    compacted: bool = False

    def changes(self) -> list[Change]:
        """Every change of the batch, table after table (commit order within each)."""
        return [c for changes in self.tables.values()
                for c in (changes.changes() if isinstance(changes, arrowcompact.Compacted) else changes)]


def _key_names(info: binlog_pb2.TableInfo) -> list[str]:
    by_id = {c.id: c.name for c in info.columns}
    pk = [by_id[i] for i in info.primary_key]
    if pk:
        return pk
    for uk in info.unique_keys:
        cols = [c for c in info.columns if c.id in uk.column_ids]
        if cols and all(not c.nullable for c in cols):
            return [by_id[i] for i in uk.column_ids]
    return []


def table_keys(info: binlog_pb2.TableInfo) -> causality.TableKeys:
    by_id = {c.id: c.name for c in info.columns}
    return causality.TableKeys(tuple(_key_names(info)),
                               tuple((k.name, tuple(by_id[i] for i in k.column_ids)) for k in info.unique_keys))


# ---------------------------------------------------------------- writing one batch
def write_changes(target: sink.Target, conn: Connection, info: binlog_pb2.TableInfo,
                  changes: Sequence[Change] | arrowcompact.Compacted, safe: bool, compacted: bool = False) -> int:
    """Write one table's changes (commit order) in the caller's transaction; rows written.
    ``compacted``: the changes already are one final change per key (``rawcompact``,
    or an ``arrowcompact.Compacted``, which is always final)."""
    if isinstance(changes, arrowcompact.Compacted):
        if target.dialect in ("postgresql", "sqlite") and not safe:
            return _write_arrow(target, conn, info, changes)
        changes, compacted = changes.changes(), True
    key = _key_names(info)
    if not key:
        return _write_keyless(target, conn, info, changes)
    final = list(changes) if compacted else compactor.compact(changes, key)
    gone = [c for c in final if c.op != INSERT]
    rows = [c.after for c in final if c.after is not None]

    def k(image: dict[str, Any] | None) -> tuple[Any, ...]:
        assert image is not None
        return tuple(image[c] for c in key)

    if safe:
        # Every key the batch touches, including those compaction cancels out (an
        # insert then a delete): the target may hold any of them already.
        touched = {k(image): None for c in changes for image in (c.before, c.after) if image is not None}
        keys = list(touched)
        target.delete_keys(conn, info, keys)
        target.upsert_rows(conn, info, rows)
        return len(keys) + len(rows)
    keys = [k(c.before) for c in gone]
    deleted = target.delete_keys(conn, info, keys)
    if deleted != len(keys):
        raise _Mismatch(info, keys, [k(c.after) for c in final if c.op == INSERT])
    try:
        target.insert_rows(conn, info, rows)
    except sa.exc.IntegrityError as exc:
        raise _Mismatch(info, keys, [k(c.after) for c in final if c.op == INSERT], errors.first_line(exc)) from None
    except Exception as exc:  # psycopg raises its own UniqueViolation from COPY
        if type(exc).__name__ in ("UniqueViolation", "IntegrityError"):
            raise _Mismatch(info, keys, [k(c.after) for c in final if c.op == INSERT], str(exc).splitlines()[0]) \
                from None
        raise
    return len(keys) + len(rows)


def _write_arrow(target: sink.Target, conn: Connection, info: binlog_pb2.TableInfo,
                 final: arrowcompact.Compacted) -> int:
    """PostgreSQL and SQLite, normal mode: the deletes in one statement, then the
    final rows straight from Arrow (PostgreSQL: one COPY of CSV written by Arrow;
    SQLite: one prepared INSERT over the columns' values) when every column has a
    CSV form; otherwise row by row from the decoded final changes."""
    rows = final.rows_table()
    write_rows: Callable[[], int] = (
        functools.partial(target.insert_arrow, conn, info, rows) if rows is not None else
        lambda: target.insert_rows(conn, info, [c.after for c in final.changes() if c.after is not None]))
    return _write_final(target, conn, info, final.gone_keys(), final.insert_keys, write_rows)


def _write_final(target: sink.Target, conn: Connection, info: binlog_pb2.TableInfo, keys: list[tuple[Any, ...]],
                 insert_keys: Callable[[], list[tuple[Any, ...]]], write_rows: Callable[[], int]) -> int:
    """Final changes of one table (one per key): delete ``keys`` (each must be
    there), then ``write_rows`` (none of ``insert_keys`` may be there); rows written.
    A target that does not match raises ``_Mismatch``."""
    deleted = target.delete_keys(conn, info, keys)
    if deleted != len(keys):
        raise _Mismatch(info, keys, insert_keys())
    try:
        n = write_rows()
    except sa.exc.IntegrityError as exc:
        raise _Mismatch(info, keys, insert_keys(), errors.first_line(exc)) from None
    except Exception as exc:  # psycopg raises its own UniqueViolation from COPY
        if type(exc).__name__ in ("UniqueViolation", "IntegrityError"):
            raise _Mismatch(info, keys, insert_keys(), str(exc).splitlines()[0]) from None
        raise
    return len(keys) + n


def _write_keyless(target: sink.Target, conn: Connection, info: binlog_pb2.TableInfo,
                   changes: Sequence[Change]) -> int:
    """A table without a key: each change on its own, in commit order."""
    n = 0
    for c in changes:
        if c.before is not None:
            n += target.delete_one(conn, info, c.before)
        if c.after is not None:
            n += target.insert_rows(conn, info, [c.after])
    return n


class _Mismatch(Exception):
    """Normal mode found the target not as the log says (diagnosed after rollback)."""

    def __init__(self, info: binlog_pb2.TableInfo, must_exist: list[tuple[Any, ...]],
                 must_not_exist: list[tuple[Any, ...]], detail: str = "") -> None:
        super().__init__(info.name)
        self.info, self.must_exist, self.must_not_exist, self.detail = info, must_exist, must_not_exist, detail


def _diagnose(target: sink.Target, m: _Mismatch, where: str) -> TargetDiverged:
    key = _key_names(m.info)

    def show(t: tuple[Any, ...]) -> str:
        return ", ".join(f"{c}={v!r}" for c, v in zip(key, t, strict=True))

    with target.engine.connect() as conn:
        have_old = target.existing_keys(conn, m.info, m.must_exist) if m.must_exist else set()
        have_new = target.existing_keys(conn, m.info, m.must_not_exist) if m.must_not_exist else set()
    norm = {tuple(str(v) for v in t) for t in have_old}
    missing = [t for t in m.must_exist if tuple(str(v) for v in t) not in norm]
    norm_new = {tuple(str(v) for v in t) for t in have_new}
    extra = [t for t in m.must_not_exist if tuple(str(v) for v in t) in norm_new]
    if missing:
        what = f"the row with key {show(missing[0])} that {where} updates or deletes is not in the target"
    elif extra:
        what = f"the row with key {show(extra[0])} that {where} inserts is already in the target"
    else:
        what = f"{where} cannot be written: {m.detail or 'row counts differ'}"
    more = len(missing) + len(extra) - 1
    return TargetDiverged(
        f"target table {m.info.name}: {what}" + (f" (and {more} more)" if more > 0 else "") +
        "; the target was changed outside binlake (`binlake diff` shows how); nothing of the window was "
        "committed. Repair the target (diff --fix-sql), or rerun with safe mode (safe_mode_until_ts)")


# ---------------------------------------------------------------- the runner
class Applier:
    """Applies a task's windows; one per run (``run``)."""

    def __init__(self, spark: Any, task: Task, *, lake: str | None = None, target_url: str | None = None,
                 progress: Progress | None = None) -> None:
        if not isinstance(task, Task):
            raise TypeError(f"task must be a replicate.task.Task, got {type(task).__name__}")
        self.spark = spark
        self.task = task
        self.lake = ingest.check_lake(lake or task.lake)
        url = target_url or task.target
        if "://" not in url:
            raise errors.InvalidArgument(
                f"task {task.name}: target {url!r} is an Airflow Connection id; only the binlake_apply DAG "
                "resolves those: give a database URL (sqlite:///PATH, postgresql://..., mysql://...)")
        self.target_url = url
        self.rules = rules.Rules(task)
        self.progress = progress or (lambda _msg: None)
        # (from ts, to ts, columns, skips) of the last read from the lake (``_window_rows``)
        self._read_buffer: tuple[int, int, pa.Table, np.ndarray, set[tuple[int, int]]] | None = None
        # Lake table -> its in-process reader, or None when Spark must read it (``_reader``).
        self._readers: dict[str, arrowread.TableReader | None] = {}

    # -- planning
    def _windows(self) -> list[dict[str, Any]]:
        """The ledger's done windows by start_ts (their bounds, status and row count)."""
        table = self._read_in_process(ingest.WINDOWS, lambda r: r.read(_WINDOW_COLUMNS))
        if table is None:
            rows = ingest.read_windows(self.spark, self.lake)
        else:
            rows = sorted(table.to_pylist(), key=lambda w: (int(w["start_ts"]), int(w["end_ts"])))
        return [w for w in rows if w.get("status", "done") == "done"]

    def plan(self, start: int, until_ts: int | None) -> tuple[list[dict[str, Any]], int]:
        """The windows to apply from checkpoint ts ``start`` (0: from the first), and
        how many later ones ``until_ts`` leaves out. Refuses gaps."""
        windows = self._windows()
        todo = [w for w in windows if int(w["end_ts"]) > start]
        if start > 0 and todo and int(todo[0]["start_ts"]) > start:
            a, b = start, int(todo[0]["start_ts"])
            raise errors.FailedPrecondition(
                f"window [{a}, {b}) ({tso.iso(a)} .. {tso.iso(b)}) is missing from the lake's windows ledger: ingest it "
                "(or backfill the ingest DAG) and apply again")
        for prev, nxt in zip(todo, todo[1:], strict=False):
            if int(prev["end_ts"]) != int(nxt["start_ts"]):
                a, b = int(prev["end_ts"]), int(nxt["start_ts"])
                if until_ts is not None and a >= until_ts:
                    break
                raise errors.FailedPrecondition(
                    f"window [{a}, {b}) ({tso.iso(a)} .. {tso.iso(b)}) is missing from the lake's windows ledger: ingest "
                    "it (or backfill the ingest DAG) and apply again")
        if until_ts is not None:
            kept = [w for w in todo if int(w["end_ts"]) <= until_ts]
            return kept, len(todo) - len(kept)
        return todo, 0

    def status(self) -> dict[str, Any]:
        target = sink.open_target(self.target_url)
        try:
            with target.engine.connect() as conn:
                cp = checkpoint.read(conn, self.task.name)
        finally:
            target.close()
        windows = self._windows()
        ts = cp.ts if cp else 0
        behind = [w for w in windows if int(w["end_ts"]) > ts]
        latest = max((int(w["end_ts"]) for w in windows), default=0)
        return {"task": self.task.name, "target": str(target), "checkpoint_ts": ts,
                "checkpoint_time": tso.iso(ts) if cp else "-", "windows_behind": len(behind),
                "lake_end_ts": latest,
                "lag_s": round(max(0.0, (tso.to_datetime(latest) - tso.to_datetime(ts)).total_seconds()), 3)
                if cp and latest else None}

    # -- reading
    def _ddl_rows(self) -> list[dict[str, Any]]:
        table = self._read_in_process(ingest.DDL_HISTORY, lambda r: r.read(_DDL_COLUMNS))
        if table is not None:
            found: list[dict[str, Any]] = table.to_pylist()
        else:
            path = ingest.table_path(self.lake, ingest.DDL_HISTORY)
            if not ingest.is_delta(self.spark, path):
                return []
            found = [r.asDict() for r in self.spark.read.format("delta").load(path).select(*_DDL_COLUMNS).collect()]
        # Sorted here: a Spark orderBy is two more jobs (sampling, then the sort) for a few rows.
        return sorted(found, key=lambda d: int(d["commit_ts"]))

    def _read_changes(self, lo: int, hi: int) -> tuple[pa.Table, set[tuple[int, int]]]:
        """The window's changes as an Arrow table in commit order, and the
        (commit_ts, seq) an expression filter removes.

        Read in this process (``arrowread``) unless the table or the task needs
        Spark, which then hands the window over as Arrow (``toArrow``: no Row
        objects). The sort is Arrow's, here, not a Spark shuffle. The columns
        stay Arrow: filtering, routing and compaction work on whole arrays
        (``_fill``)."""
        d0, d1 = decode.commit_date(lo), decode.commit_date(max(lo, hi - 1))
        table = None
        if not self.task.expr_filters:  # expression filters are Spark SQL over the Spark DataFrame
            table = self._read_in_process(ingest.CHANGES,
                                          lambda r: r.read_changes(int(lo), int(hi), _READ, d0, d1))
        df = None
        if table is None:
            path = ingest.table_path(self.lake, ingest.CHANGES)
            if not ingest.is_delta(self.spark, path):
                return _empty_read(), set()
            df = (self.spark.read.format("delta").load(path)
                  .where(f"commit_date >= DATE'{d0}' AND commit_date <= DATE'{d1}' "
                         f"AND commit_ts >= {int(lo)} AND commit_ts < {int(hi)}"))
            table = df.select(*_READ).toArrow()
        # One chunk per column: slices and array kernels then never cross chunk boundaries.
        table = table.combine_chunks()
        if not _in_commit_order(table):  # the scan usually is: then no copy of every column
            table = table.sort_by([("commit_ts", "ascending"), ("seq", "ascending")]).combine_chunks()
        skip = self._expr_skips(df, table) if df is not None and self.task.expr_filters else set()
        return table, skip

    def _reader(self, name: str) -> arrowread.TableReader | None:
        """The in-process reader of lake table ``name`` (``arrowread``), or None when
        it cannot read that table: Spark reads it then (logged once)."""
        if name not in self._readers:
            try:
                self._readers[name] = arrowread.TableReader(ingest.table_path(self.lake, name))
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

    def _expr_skips(self, df: Any, data: pa.Table) -> set[tuple[int, int]]:
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
                info = self.history.table(tid, at)
            except decode.UnknownTableError:
                continue
            seen.setdefault((info.table_id, info.schema_version), info)
        for (table_id, version), info in seen.items():
            filters = self.rules.expr_filters(info.db, info.name)
            if not filters:
                continue
            schema = exprs.spark_schema(info)
            part = df.where((F.col("table_id") == table_id) & (F.col("schema_version") == version)).select(
                F.col("commit_ts").alias("__binlake_ts"), F.col("seq").alias("__binlake_seq"),
                F.col("op").alias("__binlake_op"),
                F.from_json("before", schema).alias("__binlake_b"), F.from_json("after", schema).alias("__binlake_a"))
            for i, ef in enumerate(self.task.expr_filters):
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
                            f"task {self.task.name}: expr_filters.{i}.{key} {expr!r} is not a valid predicate over "
                            f"{info.db}.{info.name} ({', '.join(c.name for c in info.columns)}): {first[:300]}"
                        ) from None
                    skip.update((int(h[0]), int(h[1])) for h in hits)
        return skip

    # -- building batches
    def _window_rows(self, windows: list[dict[str, Any]], n: int, lo: int
                     ) -> tuple[pa.Table, np.ndarray, set[tuple[int, int]], int, int]:
        """The changes of window ``n`` (from ``lo``) as (table, its commit_ts as a
        NumPy array, expression-filter skips, first index, end index): read with
        the windows after it that fit in ``READ_BUDGET``, or taken from such an
        earlier read."""
        hi = int(windows[n]["end_ts"])
        buf = self._read_buffer
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
            data, skip = self._read_changes(lo, end) if rows > 0 else (_empty_read(), set())
            stamps = data.column("commit_ts").to_numpy()
            buf = self._read_buffer = (lo, end, data, stamps, skip)
        stamps = buf[3]
        return (buf[2], stamps, buf[4], int(np.searchsorted(stamps, lo, "left")),
                int(np.searchsorted(stamps, hi, "left")))

    def _batches(self, windows: list[dict[str, Any]], n: int, lo: int, summary: ApplySummary,
                 safe: bool) -> list[_Batch]:
        hi = int(windows[n]["end_ts"])
        ddls = [d for d in self.ddl_rows if lo <= int(d["commit_ts"]) < hi]
        data, stamps, skip, i, stop = self._window_rows(windows, n, lo)
        batches: list[_Batch] = []
        cuts = [int(d["commit_ts"]) for d in ddls] + [hi]
        for j, end in enumerate(cuts):
            batch = _Batch(end, {}, {}, ddls[j] if j < len(ddls) else None, compacted=not safe)
            # the changes before the DDL (or the end)
            k = i + int(np.searchsorted(stamps[i:stop], end, "left"))
            if k > i:
                self._fill(batch, data.slice(i, k - i), skip, summary, safe)
            i = k
            batches.append(batch)
        return batches

    def _fill(self, batch: _Batch, part: pa.Table, skip: set[tuple[int, int]], summary: ApplySummary,
              safe: bool) -> None:
        """The changes in ``part`` (a slice of the window with no DDL in it) into
        ``batch``: filtered, routed, and per target table compacted (normal mode)
        or decoded in commit order (safe mode, which deletes every key a batch
        touches).

        The filters and routes are decided once per table id (no DDL inside a
        batch: one definition for all of it) and applied as Arrow masks; a target
        table fed by one source table is compacted as Arrow arrays
        (``arrowcompact``), anything it refuses by ``rawcompact`` in Python."""
        ids = part.column("table_id")
        ops = part.column("op")
        stamps = part.column("commit_ts")
        keep_all = np.zeros(part.num_rows, dtype=bool)
        if skip:  # expression filters: few windows have them, a Python pass is fine
            skipped = np.fromiter(((t, q) in skip for t, q in zip(stamps.to_pylist(), part.column("seq").to_pylist(),
                                                                  strict=True)), dtype=bool, count=part.num_rows)
        else:
            skipped = None
        # target table -> [(table id, decoder, its rows in ``part``)], in order of first appearance
        targets: dict[str, list[tuple[int, rawcompact.ImageDecoder, np.ndarray]]] = {}
        for table_id in pc.unique(ids).to_pylist():
            rows = pc.equal(ids, table_id)
            first = int(pc.index(ids, table_id).as_py())
            dec, name, ignored = self._table_entry(batch, table_id, int(stamps[first].as_py()))
            if dec is None:
                continue
            if ignored:
                rows = pc.and_(rows, pc.invert(pc.is_in(ops, pa.array(sorted(ignored), pa.string()))))
            mask = rows.to_numpy(zero_copy_only=False)
            if skipped is not None:
                mask = mask & ~skipped
            keep_all |= mask
            targets.setdefault(name, []).append((table_id, dec, mask))
        kept = int(keep_all.sum())
        summary.filtered += part.num_rows - kept
        if kept:
            counts = pc.value_counts(ops.filter(pa.array(keep_all)))
            summary.changes_by_op.update({str(v["values"]): int(v["counts"]) for v in counts.to_pylist()})
        for name, sources in targets.items():
            if len(sources) == 1:
                mask = sources[0][2]
            else:
                mask = np.logical_or.reduce([m for _t, _d, m in sources])
            if not mask.any():
                continue
            sub = part.filter(pa.array(mask))
            keyed = bool(_key_names(batch.infos[name]))
            if not safe and keyed and len(sources) == 1:
                try:
                    batch.tables[name] = arrowcompact.compact(name, sub.select(arrowcompact.COLUMNS), sources[0][1])
                    continue
                except (arrowcompact.Unsupported, pa.ArrowInvalid):
                    pass  # rawcompact gives the same result (or the clear error) the slow way
            raw = _raw_changes(sub, {t: d for t, d, _m in sources})
            if safe:
                batch.tables[name] = rawcompact.decode_all(name, raw)
            else:
                batch.tables[name] = rawcompact.compact(name, raw, keyed)

    def _table_entry(self, batch: _Batch, table_id: int, ts: int
                     ) -> tuple[rawcompact.ImageDecoder | None, str, frozenset[str]]:
        """(decoder, target table, ignored ops) of a table id; no decoder when the
        task does not replicate the table."""
        info = self.history.table(table_id, ts)
        if not self.rules.replicated(info.db, info.name):
            return None, "", frozenset()
        ignored = frozenset(op for op in (INSERT, UPDATE, DELETE) if op in self.rules.ignored(info.db, info.name))
        tinfo = self._target_info(info)
        place = self.rules.place(info.db, info.name)
        batch.infos[tinfo.name] = tinfo
        extract = (place.extract_column, place.extract_value) if place.extract_column else None
        return rawcompact.ImageDecoder(info, _key_names(tinfo), extract), tinfo.name, ignored

    def _target_info(self, info: binlog_pb2.TableInfo) -> binlog_pb2.TableInfo:
        cached = self._tinfo.get(id(info))
        if cached is None or cached[0] is not info:
            cached = (info, self.rules.target_info(info))
            self._tinfo[id(info)] = cached
        return cached[1]

    def _ddl_change(self, ddl: dict[str, Any]) -> tuple[str, binlog_pb2.TableInfo, binlog_pb2.TableInfo | None] | None:
        """(kind, new target definition, old target definition) of a DDL row, or None
        when the task does not replicate it."""
        raw = ddl.get("table_info")
        if not raw:
            return None
        info = binlog_pb2.TableInfo.FromString(bytes(raw))
        ts = int(ddl["commit_ts"])
        prev_id = info.previous_table_id or info.table_id
        try:
            old = self.history.table(prev_id, ts)
        except decode.UnknownTableError:
            old = None
        kind = rules.ddl_kind(old, info)
        name_db = (old.db, old.name) if kind == "drop table" and old is not None else (info.db, info.name)
        if not self.rules.replicated(*name_db) or kind in self.rules.ignored(*name_db):
            return None
        new_t = self.rules.target_info(info)
        old_t = self.rules.target_info(old) if old is not None else None
        if kind == "drop table":
            new_t = old_t if old_t is not None else new_t
        return kind, new_t, old_t

    # -- running
    def run(self, until_ts: int | None = None) -> ApplySummary:
        began = time.monotonic()
        target = sink.open_target(self.target_url)
        summary = ApplySummary(self.task.name, str(target))
        try:
            checkpoint.ensure(target.engine)
            with target.engine.connect() as conn:
                cp = checkpoint.read(conn, self.task.name)
            start = cp.ts if cp else (self.task.start_after_ts + 1 if self.task.start_after_ts else 0)
            windows, summary.behind = self.plan(start, until_ts)
            self.ddl_rows = self._ddl_rows()
            self.history = decode.SchemaHistory.from_rows(self.ddl_rows)
            self._tinfo: dict[int, tuple[binlog_pb2.TableInfo, binlog_pb2.TableInfo]] = {}
            self._read_buffer = None
            if cp is None and start == 0 and windows:
                self._bootstrap(target, int(windows[0]["start_ts"]), summary)
            summary.checkpoint_ts = start
            # Window n+1 is read and compacted in a second thread while window n is
            # written: the target works on the write while this process compacts.
            # Only reads happen ahead (the lake, the DDL history); what commits, and
            # the checkpoint, stay strictly in window order.
            with ThreadPoolExecutor(1, thread_name_prefix="apply-prefetch") as pool:
                ahead = pool.submit(self._prepare, windows, 0, start, cp is None)
                for n, w in enumerate(windows, start=1):
                    a, b = int(w["start_ts"]), int(w["end_ts"])
                    batches, safe, counted = ahead.result()
                    if n < len(windows):
                        ahead = pool.submit(self._prepare, windows, n, b, cp is None)
                    if self.task.mode == "parallel":
                        self._apply_parallel(target, batches, a, b, safe, summary)
                    else:
                        self._apply_consistent(target, batches, a, b, safe, summary)
                    summary.changes_by_op.update(counted.changes_by_op)
                    summary.filtered += counted.filtered
                    summary.windows += 1
                    summary.first_window = summary.first_window or (a, b)
                    summary.last_window = (a, b)
                    summary.checkpoint_ts = start = b
                    self.progress(f"[{_bar(n, len(windows))}] {n}/{len(windows)} window [{a}, {b}) {tso.iso(b)}  "
                                  f"{summary.changes:,} row changes, {summary.ddls} DDL")
                    failpoint.hit("apply-after-window")
        finally:
            self._read_buffer = None
            target.close()
        summary.elapsed_s = time.monotonic() - began
        return summary

    def _prepare(self, windows: list[dict[str, Any]], n: int, start: int, fresh: bool
                 ) -> tuple[list[_Batch], bool, ApplySummary]:
        """Window ``n`` (0-based; its changes from ``start``, the checkpoint) read and
        cut into batches: (batches, safe mode or not, what it counted). ``fresh``:
        the target had no checkpoint when the run began."""
        a = int(windows[n]["start_ts"])
        # Safe mode for the configured windows, and for the first one after a restored
        # snapshot: the snapshot may already hold part of that window.
        safe = a < self.task.safe_mode_until_ts or (fresh and self.task.start_after_ts > 0 and n == 0)
        counted = ApplySummary(self.task.name, "")
        return self._batches(windows, n, max(a, start), counted, safe), safe, counted

    def _bootstrap(self, target: sink.Target, first_start: int, summary: ApplySummary) -> None:
        """A target with no checkpoint, applied from the lake's first window: create
        the tables whose DDLs precede it (the lake holds them in ddl_history)."""
        with target.engine.connect() as conn:
            conn.begin()
            for ddl in self.ddl_rows:
                if int(ddl["commit_ts"]) >= first_start:
                    break
                change = self._ddl_change(ddl)
                if change is not None:
                    target_ddl.apply_ddl(target, conn, change[0], change[2], change[1])
                    summary.ddls += 1
            conn.commit()

    def _apply_consistent(self, target: sink.Target, batches: list[_Batch], a: int, b: int, safe: bool,
                          summary: ApplySummary) -> None:
        transactional = sink_transactional(target)
        with target.engine.connect() as conn:
            conn.begin()
            try:
                for batch in batches:
                    summary.rows_written += self._write_batch(target, conn, batch, safe, f"window [{a}, {b})")
                    if batch.ddl is None:
                        continue
                    change = self._ddl_change(batch.ddl)
                    ddl_ts = int(batch.ddl["commit_ts"])
                    if change is None:
                        continue
                    if not transactional:
                        checkpoint.write(conn, self.task.name, ddl_ts, a, b)
                        conn.commit()
                        conn.begin()
                    target_ddl.apply_ddl(target, conn, change[0], change[2], change[1])
                    summary.ddls += 1
                    if not transactional:
                        checkpoint.write(conn, self.task.name, ddl_ts + 1, a, b)
                        conn.commit()
                        conn.begin()
                checkpoint.write(conn, self.task.name, b, a, b)
                failpoint.hit("apply-before-commit")
                conn.commit()
            except _Mismatch as m:
                conn.rollback()
                raise _diagnose(target, m, f"window [{a}, {b})") from None

    def _write_batch(self, target: sink.Target, conn: Connection, batch: _Batch, safe: bool, where: str) -> int:
        n = 0
        for name, changes in batch.tables.items():
            n += write_changes(target, conn, batch.infos[name], changes, safe, batch.compacted)
        return n

    def _apply_parallel(self, target: sink.Target, batches: list[_Batch], a: int, b: int, safe: bool,
                        summary: ApplySummary) -> None:
        for batch in batches:
            infos = {name: info.SerializeToString() for name, info in batch.infos.items()}
            if _arrow_parallel(target, batch, safe):
                with target.engine.connect() as conn:
                    done = checkpoint.done_groups(conn, self.task.name, batch.end)
                items = _arrow_buckets(batch, self.task.parallel_tasks, done)
                if items:
                    summary.rows_written += self._run_groups(items, functools.partial(
                        apply_arrow_buckets, self.target_url, self.task.name, infos, batch.end, a, b))
                changes: list[Change] = []
            else:
                changes = batch.changes()
            if changes:
                # Compacted first (one change per key), then grouped: the groups are
                # then as small as they can be and still never share a key value.
                keys = {name: table_keys(info) for name, info in batch.infos.items()}
                groups = causality.group(changes, keys)
                with target.engine.connect() as conn:
                    done = checkpoint.done_groups(conn, self.task.name, batch.end)
                work = [(g, [(c.table, c.op, c.before, c.after, c.commit_ts, c.seq) for c in part])
                        for g, part in _buckets(groups, self.task.parallel_tasks, done)
                        if g not in done]
                if work:
                    summary.rows_written += self._run_groups(work, functools.partial(
                        apply_groups, self.target_url, self.task.name, infos, batch.end, a, b, safe,
                        compacted=batch.compacted))
            with target.engine.connect() as conn:
                conn.begin()
                if batch.ddl is not None:
                    ddl_ts = int(batch.ddl["commit_ts"])
                    checkpoint.write(conn, self.task.name, ddl_ts, a, b)
                    conn.commit()
                    conn.begin()
                    change = self._ddl_change(batch.ddl)
                    if change is not None:
                        target_ddl.apply_ddl(target, conn, change[0], change[2], change[1])
                        summary.ddls += 1
                    checkpoint.write(conn, self.task.name, ddl_ts + 1, a, b)
                else:
                    checkpoint.write(conn, self.task.name, batch.end, a, b)
                conn.commit()

    def _run_groups(self, work: list[Any], apply: Callable[[Iterable[Any]], Iterator[tuple[int, int, str]]]
                    ) -> int:
        """``apply`` over ``work`` (one item per bucket) in Spark tasks; rows written.
        ``apply`` yields (buckets applied, rows written, error message or "")."""
        # The apply's failpoint holds in its Spark tasks too (they run in other processes).
        fail_spec = os.environ.get(failpoint.ENV, "")
        slices = max(1, min(self.task.parallel_tasks, len(work)))

        def apply_part(items: Iterable[Any]) -> Iterator[tuple[int, int, str]]:
            # Python workers are reused across tasks: set the failpoint for this task only.
            saved = os.environ.get(failpoint.ENV)
            if fail_spec:
                os.environ[failpoint.ENV] = fail_spec
            try:
                yield from apply(items)
            finally:
                if saved is None:
                    os.environ.pop(failpoint.ENV, None)
                else:
                    os.environ[failpoint.ENV] = saved

        results = self.spark.sparkContext.parallelize(work, slices).mapPartitions(apply_part).collect()
        failures = [msg for _groups, _n, msg in results if msg]
        if failures:
            raise TargetDiverged(failures[0]) if failures[0].startswith("target table") else \
                errors.FailedPrecondition(failures[0])
        return sum(n for _g, n, _m in results)


def _buckets(groups: list[list[Change]], tasks: int, done: set[int]) -> Iterator[tuple[int, list[Change]]]:
    """The conflict groups dealt round-robin into at most ``tasks`` buckets, each
    as (checkpoint id, its changes): one Spark task and one checkpoint row per
    bucket, not per group. Buckets of disjoint groups are disjoint too. A rerun
    deals the same groups into as many buckets as the run whose bucket rows it
    finds (``done``), so an id means the same changes even if ``tasks`` changed."""
    count = min(tasks, len(groups))
    if done:
        count = checkpoint.bucket_count(next(iter(done)))
    parts: list[list[Change]] = [[] for _ in range(count)]
    for g, changes in enumerate(groups):
        parts[g % count].extend(changes)
    for i, part in enumerate(parts):
        if part:
            yield checkpoint.bucket_id(i, count), part


def _arrow_parallel(target: sink.Target, batch: _Batch, safe: bool) -> bool:
    """Whether a batch goes to the Spark tasks as Arrow: PostgreSQL or SQLite
    (whose tasks take its one write lock in turn), normal mode, every table
    compacted as Arrow with a CSV form, and no unique key but the primary key.
    Two final changes of a batch are then on different keys and can never
    conflict: any split of the keys is a split into conflict groups."""
    if target.dialect not in ("postgresql", "sqlite") or safe or not batch.tables:
        return False
    for name, final in batch.tables.items():
        if not isinstance(final, arrowcompact.Compacted) or not final.copyable:
            return False
        info = batch.infos[name]
        pk = sorted(info.primary_key)
        if not pk or any(sorted(uk.column_ids) != pk for uk in info.unique_keys):
            return False
    return True


def _arrow_buckets(batch: _Batch, tasks: int, done: set[int]) -> list[tuple[int, list[tuple[Any, ...]]]]:
    """The batch's final changes dealt into at most ``tasks`` buckets by key, each as
    (checkpoint id, [(table, keys to delete, keys inserted, rows as Arrow IPC)]),
    leaving out the buckets in ``done``. The bucket of a key depends on the key and
    the bucket count only, and a rerun takes the count from the buckets it finds
    (``done``): an id means the same changes in every run."""
    total = sum(len(final) for final in batch.tables.values())
    count = checkpoint.bucket_count(next(iter(done))) if done else max(1, min(tasks, total))
    parts: list[list[tuple[Any, ...]]] = [[] for _ in range(count)]
    for name, final in batch.tables.items():
        assert isinstance(final, arrowcompact.Compacted)
        for i, (gone, inserted, rows) in enumerate(final.split(count)):
            if checkpoint.bucket_id(i, count) in done or (not gone and rows.num_rows == 0):
                continue
            sink_ = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink_, rows.schema) as w:
                w.write_table(rows)
            parts[i].append((name, gone, inserted, sink_.getvalue().to_pybytes()))
    return [(checkpoint.bucket_id(i, count), part) for i, part in enumerate(parts) if part]


def apply_arrow_buckets(url: str, task_name: str, infos_raw: dict[str, bytes], seg_end: int, a: int, b: int,
                        items: Iterable[tuple[int, list[tuple[Any, ...]]]]) -> Iterator[tuple[int, int, str]]:
    """Run in a Spark task: the Arrow buckets it was given (``_arrow_buckets``: per
    table the keys to delete, then the rows to insert) that are not in yet."""
    infos = {n: binlog_pb2.TableInfo.FromString(raw) for n, raw in infos_raw.items()}

    def write(target: sink.Target, conn: Connection, todo: list[tuple[int, Any]]) -> int:
        n = 0
        for _g, parts in todo:
            for name, gone, inserted, ipc in parts:
                rows = pa.ipc.open_stream(ipc).read_all()
                n += _write_final(target, conn, infos[name], gone, functools.partial(list, inserted),
                                  functools.partial(target.insert_arrow, conn, infos[name], rows))
        return n

    return _apply_buckets(url, task_name, seg_end, a, b, items, write)


def apply_groups(url: str, task_name: str, infos_raw: dict[str, bytes], seg_end: int, a: int, b: int, safe: bool,
                 items: Iterable[tuple[int, list[tuple[Any, ...]]]],
                 compacted: bool = False) -> Iterator[tuple[int, int, str]]:
    """Run in a Spark task: the buckets of conflict groups it was given that are not
    in yet. The groups of a batch never touch the same key, so one task writes all
    of its groups as one set of batched statements (each group's changes keep their
    order); concurrency is between the tasks."""
    infos = {n: binlog_pb2.TableInfo.FromString(raw) for n, raw in infos_raw.items()}

    def write(target: sink.Target, conn: Connection, todo: list[tuple[int, Any]]) -> int:
        by_table: dict[str, list[Change]] = {}
        for _g, raw_changes in todo:
            for t in raw_changes:
                c = Change(*t)
                by_table.setdefault(c.table, []).append(c)
        return sum(write_changes(target, conn, infos[name], cs, safe, compacted) for name, cs in by_table.items())

    return _apply_buckets(url, task_name, seg_end, a, b, items, write)


def _apply_buckets(url: str, task_name: str, seg_end: int, a: int, b: int, items: Iterable[tuple[int, Any]],
                   write: Callable[[sink.Target, Connection, list[tuple[int, Any]]], int]
                   ) -> Iterator[tuple[int, int, str]]:
    """The buckets of ``items`` (checkpoint id, its changes) not in yet, written by
    ``write`` in one target transaction with one checkpoint row per bucket; yields
    (buckets applied, rows written, error message or "")."""
    target = sink.open_target(url)
    try:
        with target.engine.connect() as conn:
            conn.begin()
            done = checkpoint.done_groups(conn, task_name, seg_end)
            todo = [(g, part) for g, part in items if g not in done]
            try:
                n = write(target, conn, todo)
            except _Mismatch as m:
                conn.rollback()
                yield 0, 0, str(_diagnose(target, m, f"window [{a}, {b})"))
                return
            checkpoint.mark_groups(conn, task_name, seg_end, [g for g, _part in todo], a, b)
            conn.commit()
        failpoint.hit("apply-after-group")
        yield len(todo), n, ""
    finally:
        target.close()


def summary_dict(s: ApplySummary) -> dict[str, Any]:
    """The summary as JSON-ready values (jobs, the DAG's XCom, ``--json``)."""
    return {"task": s.task, "target": s.target, "windows": s.windows, "changes_by_op": dict(s.changes_by_op),
            "changes": s.changes, "rows_written": s.rows_written, "ddls": s.ddls, "filtered": s.filtered,
            "checkpoint_ts": s.checkpoint_ts, "elapsed_s": round(s.elapsed_s, 3), "behind": s.behind}


def sink_transactional(target: sink.Target) -> bool:
    return target.dialect in ("postgresql", "sqlite")


def _bar(n: int, total: int, width: int = 20) -> str:
    done = width * n // max(1, total)
    return "#" * done + "." * (width - done)


def parse_until(until_ts: int | None, until: str | None) -> int | None:
    """``--until-ts`` or ``--until`` (a datetime, UTC unless it has a zone) as a ts."""
    if until_ts is not None and until is not None:
        raise errors.InvalidArgument("give --until-ts or --until, not both")
    if until is not None:
        try:
            return tso.parse_datetime(until)
        except ValueError as exc:
            raise errors.InvalidArgument(f"--until: {exc}") from None
    if until_ts is not None and until_ts <= 0:
        raise errors.InvalidArgument(f"--until-ts must be a positive TSO, got {until_ts}")
    return until_ts
