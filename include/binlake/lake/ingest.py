"""Ingest one commit_ts window from every Pump into the Delta lake.

``ingest_window(spark, lake, registry, start_ts, end_ts)`` writes three Delta
tables under ``lake``:

``changes``      one row per row change (``CHANGE_COLUMNS``), partitioned
                 by ``commit_date``
``ddl_history``  one row per DDL (``DDL_COLUMNS``)
``windows``      one row per ingested window: ``start_ts, end_ts, pumps,
                 rows_per_pump, rows_per_table_op ('db.tbl:op' -> count), txns,
                 rows, ddls, status ('done'), ingested_at``

Idempotence: the window's rows replace exactly what ``changes`` and
``ddl_history`` hold with ``start_ts <= commit_ts < end_ts`` (Delta
``replaceWhere``), and its ``windows`` row replaces the one with the same
bounds. A window that overlaps an ingested one without the same bounds is
refused. The ``windows`` row is written last, so a failed ingest leaves no
row claiming the window is done.

Schema history: rows are decoded with the table definitions in force when
their transaction committed. Those come from ``ddl_history`` (DDLs with
``commit_ts < start_ts``), the window's own DDLs (the scan finds them on every
Pump before any row is decoded) and the DDLs of the ranges ``ddl_history`` is
not complete for, read directly from the Pumps:

* the first ingest into an empty lake reads every DDL the Pumps hold below its
  window and adds them to ``ddl_history`` (by start_ts, never twice): from then
  on ``ddl_history`` holds every DDL below the lake's first window;
* a later ingest reads only the gaps between that first window and its own
  start that no ingested window covers (a backfill out of order, or a window
  still running in parallel).

So windows can be ingested (and re-ingested) in any order and decode the same
way, and every order leaves the same ``ddl_history``, as long as the Pumps
still hold the DDLs of the gaps. When neither the lake nor the Pumps hold a
table's definition (its DDL is below every Pump's GC ts and in no ingested
window), the ingest fails naming the table id and why.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import functools
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from binlake import errors, failpoint, net, tso
from binlake.lake.decoding import arrow_batches
from binlake.lake.decoding.ddl_rows import ddl_row
from binlake.lake.decoding.rows import CHANGES_DDL, DDL_COLUMNS, DDL_HISTORY_DDL, WINDOWS_DDL, commit_date
from binlake.lake.decoding.schema_history import SchemaHistory, UnknownTableError
from binlake.lake.pumps import checkpoint
from binlake.lake.pumps import datasource as lake_source
from binlake.lake.pumps.planner import check_window, pumps_for_window
from binlake.lake.pumps.pump_check import plan_read, pump_statuses
from binlake.lake.pumps.window_index import WindowIndex, index_window, merge_consecutive, scan_ddls
from binlake.lake.sparkenv import connect
from binlake.lake.sparkenv.spark_errors import binlake_error
from binlake.lake.store import arrowwrite, s3, staging, writelock
from binlake.lake.store.ledger import BOUNDS, is_delta, read_windows, uncovered
from binlake.lake.store.location import CHANGES, DDL_HISTORY, WINDOWS, table_path
from binlake.registry.client import RegistryClient

if TYPE_CHECKING:
    # pyspark is heavy; type checkers see it, runtime imports it where a session is used.
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# Partitions of about this many row changes at least: smaller ones cost more
# in task overhead than they win in balance.
MIN_ROWS_PER_PARTITION = 20_000
# Attempts of a Delta write that lost a commit race. Windows of the same day write
# the same commit_date partition, and Delta's replaceWhere conflicts with any
# append there, so with N windows running at once (a backfill) a write may lose
# up to N-1 races: enough attempts for the runs-at-once settings binlake suggests.
_CONCURRENT_RETRIES = 8
# On an S3 lake, windows of up to this many row changes are decoded in the ingest's
# own process and sent to Spark as Arrow inside the plan (about 0.4 KB a row change:
# 40 MB here); larger ones are read by the data source in Spark's Python workers, in
# parallel and never whole in one process. A local lake's windows are decoded here
# whatever their size, appended by delta-rs or streamed to staged files for Spark.
# Why: ``_decoded_here``, ``_staged_here``, ``_appended_here``.
DECODE_HERE_ROWS = 100_000
# The ``changes`` table property a retried ingest sets to fence off an earlier
# attempt that may still be writing (``_may_append``).
FENCE_PROPERTY = "binlake.ingest.fence"

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class IngestResult:
    """What an ingest wrote for ``[start_ts, end_ts)``."""

    lake: str
    start_ts: int
    end_ts: int
    pumps: tuple[str, ...]
    txns: int
    rows: int
    ddls: int
    duplicates: int  # transactions two Pumps held, written once
    rows_per_pump: dict[str, int]
    rows_per_table_op: dict[str, int]
    replaced: bool  # the window had been ingested before (and was replaced)
    elapsed_s: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["pumps"] = list(self.pumps)
        out["rows_per_s"] = round(self.rows_per_s, 1)
        return out

    def summary(self) -> str:
        lines = [
            f"window [{self.start_ts}, {self.end_ts})  {tso.iso(self.start_ts)} .. {tso.iso(self.end_ts)}"
            + ("  (replaced)" if self.replaced else ""),
            f"  pumps         {', '.join(self.pumps)}",
            f"  transactions  {self.txns} ({self.ddls} DDL, {self.duplicates} duplicate copies dropped)",
            f"  row changes   {self.rows} in {self.elapsed_s:.1f}s ({self.rows_per_s:,.0f}/s)",
        ]
        lines += [f"    {pump:<20} {n}" for pump, n in sorted(self.rows_per_pump.items())]
        lines += [f"    {key:<40} {n}" for key, n in sorted(self.rows_per_table_op.items())]
        return "\n".join(lines)



def _small_table_rows(path: str, columns: Sequence[str] | None, where: Any = None) -> list[dict[str, Any]] | None:
    # pyarrow and delta-rs are imported when a table is read, not with this module.
    from binlake.lake.store import arrowread

    return arrowread.small_table_rows(path, columns, where)


def check_overlap(windows: Sequence[dict[str, Any]], start_ts: int, end_ts: int) -> bool:
    """True when ``[start_ts, end_ts)`` was ingested with these exact bounds;
    ``errors.Conflict`` when it overlaps an ingested window differently."""
    same = False
    for w in windows:
        s, e = int(w["start_ts"]), int(w["end_ts"])
        if (s, e) == (start_ts, end_ts):
            same = True
        elif s < end_ts and start_ts < e:
            raise errors.Conflict(
                f"window [{start_ts}, {end_ts}) ({tso.iso(start_ts)} .. {tso.iso(end_ts)}) overlaps the ingested window "
                f"[{s}, {e}) ({tso.iso(s)} .. {tso.iso(e)}) without the same bounds: re-ingest exactly that window, or "
                "choose a window that does not overlap it")
    return same


def _load_ddl_history(spark: SparkSession, lake: str, start_ts: int,
                      end_ts: int) -> tuple[SchemaHistory, list[dict[str, Any]]]:
    """(definitions from DDLs before ``start_ts``, the DDL rows already in ``[start_ts, end_ts)``)."""
    import pyarrow.dataset as pads

    path = table_path(lake, DDL_HISTORY)
    if not is_delta(spark, path):
        return SchemaHistory(), []
    columns = [name for name, _ in DDL_COLUMNS]
    # In this process for a local lake (milliseconds), else a Spark job.
    rows: Sequence[Any] | None = _small_table_rows(path, columns, pads.field("commit_ts") < int(end_ts))
    if rows is None:
        rows = [r.asDict() for r in spark.read.format("delta").load(path).where(f"commit_ts < {int(end_ts)}")
                .select(*columns).collect()]
    before = [r for r in rows if r["commit_ts"] < start_ts]
    return SchemaHistory.from_rows(before), [dict(r) for r in rows if r["commit_ts"] >= start_ts]


def _same_ddl_rows(held: Sequence[Mapping[str, Any]], txns: Sequence[Any]) -> bool:
    """Whether ``ddl_history``'s rows of a window (``held``) are exactly the rows its
    DDL transactions ``txns`` make: then the window's DDL write would change nothing."""
    names = [name for name, _ in DDL_COLUMNS]

    def key(row: Mapping[str, Any]) -> tuple[Any, ...]:
        # Binary comes back as bytes or bytearray depending on the reader.
        return tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else v for v in (row[n] for n in names))

    return sorted(map(key, held), key=repr) == sorted((key(ddl_row(t)) for t in txns), key=repr)


def _history_from_pumps(registry: str, gaps: list[tuple[int, int]]) -> tuple[list[Any], list[str]]:
    """DDLs in the uncovered ranges, read from every Pump that may hold them, plus
    notes on ranges a Pump cannot serve any more (below its GC ts)."""
    from binlake.lake.pumps.planner import WindowPlan
    from binlake.registry.replicas import cluster_min_acks

    with RegistryClient(registry) as reg:
        nodes, _ = reg.list_nodes("pump")
        acks = [cluster_min_acks(reg, lo, hi) for lo, hi in gaps]
    ranges: list[tuple[str, int, int]] = []
    addrs: dict[str, str] = {}
    lost: list[str] = []
    for (lo, hi), min_acks in zip(gaps, acks, strict=True):
        chosen = pumps_for_window(nodes, lo, hi)
        # Each Pump's own GC ts (the registry's is as old as its last heartbeat).
        plan = WindowPlan(lo, hi, tuple(chosen))
        if min_acks == 1:
            statuses = pump_statuses(plan)  # every Pump may hold the only copy of a DDL
        else:
            # A DDL, as any acknowledged transaction, is on at least W Pumps: up to W - 1
            # unreachable ones are left out, as the window's own read does (window.py's rule).
            down: dict[str, str] = {}
            statuses = pump_statuses(plan, unreachable=down)
            if len(down) > min_acks - 1:
                raise errors.Unavailable(
                    f"pump(s) {', '.join(sorted(down))} unreachable "
                    f"({'; '.join(f'{n}: {why}' for n, why in sorted(down.items()))}); with min_acks={min_acks} "
                    f"at most {min_acks - 1} may be missing to read the DDLs of [{lo}, {hi}); bring them back")
        for node in chosen:
            if node.node_id not in statuses:
                continue
            gc_ts = statuses[node.node_id].gc_ts
            if gc_ts > lo:
                lost.append(f"pump {node.node_id} no longer holds [{lo}, {min(hi, gc_ts)}) "
                            f"(GC ts {tso.format_ts(gc_ts)})")
            if max(lo, gc_ts) < hi:
                ranges.append((node.node_id, max(lo, gc_ts), hi))
                addrs[node.node_id] = node.addr
    return scan_ddls(addrs, ranges), lost


def _missing_table(exc: UnknownTableError, start_ts: int, end_ts: int,
                   lost: list[str], used: tuple[int, int]) -> errors.BinlakeError:
    hint = ("its DDL is in no ingested window and the Pumps no longer hold it (below their GC ts)" if lost else
            "its DDL is in no ingested window and on no Pump")
    detail = f"; {'; '.join(lost)}" if lost else ""
    return errors.FailedPrecondition(
        f"window [{start_ts}, {end_ts}): rows of table id {exc.table_id} (committed from {tso.format_ts(used[0])}) "
        f"cannot be decoded: {exc} - {hint}{detail}")


def delta_conflicts() -> tuple[type[BaseException], ...]:
    """Delta's typed commit-conflict exceptions (ConcurrentAppendException, ProtocolChangedException
    when two first ingests create a table, MetadataChangedException, ...). Importing
    ``delta.exceptions.captured`` makes PySpark raise these instead of a generic error."""
    import delta.exceptions.captured  # noqa: F401  (installs the conversion)
    from delta import exceptions as dx

    return (dx.DeltaConcurrentModificationException, dx.ConcurrentWriteException, dx.MetadataChangedException,
            dx.ProtocolChangedException, dx.ConcurrentAppendException, dx.ConcurrentDeleteReadException,
            dx.ConcurrentDeleteDeleteException, dx.ConcurrentTransactionException)


# Delta's commit-conflict error classes: how a conflict reaches a Spark Connect
# client, where Delta's typed exceptions are not raised (they need a JVM here).
_CONFLICT_CLASSES = ("DELTA_CONCURRENT_APPEND", "DELTA_CONCURRENT_WRITE", "DELTA_METADATA_CHANGED",
                     "DELTA_PROTOCOL_CHANGED", "DELTA_CONCURRENT_DELETE_READ", "DELTA_CONCURRENT_DELETE_DELETE",
                     "DELTA_CONCURRENT_TRANSACTION", "ConcurrentAppendException", "ProtocolChangedException",
                     "MetadataChangedException", "ConcurrentWriteException")


def is_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is a Delta commit conflict (typed on a classic session, by
    error class over Spark Connect)."""
    return isinstance(exc, delta_conflicts()) or any(name in str(exc) for name in _CONFLICT_CLASSES)


def _retry_concurrent(what: str, fn: Callable[[], Any], check: Callable[[], None]) -> Any:
    """Run a Delta write again when a concurrent writer committed first (another
    window's ingest touching the same table): the write is idempotent. ``check``
    (the lake's write turn's) runs before each attempt: no commit once the turn is lost."""
    for attempt in range(1, _CONCURRENT_RETRIES + 1):
        check()
        try:
            return fn()
        except Exception as exc:
            if attempt == _CONCURRENT_RETRIES or not is_conflict(exc):
                raise
            log.info("%s: concurrent Delta commit (%s); retrying", what, type(exc).__name__)
            # Jittered, so the writers that lost do not collide again in step.
            time.sleep(min(5.0, random.uniform(0.2, 1.0) * attempt))
    return None


def _validate(spark: SparkSession, lake: str, registry: str, start_ts: int, end_ts: int,
              pumps: Sequence[str] | None) -> list[str] | None:
    if spark is None or not hasattr(spark, "read"):
        raise TypeError(f"spark must be a SparkSession, got {type(spark).__name__}")
    # An S3 lake is checked (bucket, keys, endpoint) before anything is read or written.
    s3.prepare(spark, lake)
    if not isinstance(registry, str):
        raise errors.InvalidArgument(f"registry must be HOST:PORT, got {registry!r}")
    net.parse_addr_list(registry, "registry")
    check_window(start_ts, end_ts)
    if pumps is None:
        return None
    if isinstance(pumps, str) or not all(isinstance(p, str) and p for p in pumps):
        raise errors.InvalidArgument(f"pumps must be a list of pump ids, got {pumps!r}")
    if not pumps:
        raise errors.InvalidArgument("pumps, when given, must name at least one pump")
    return list(pumps)


def ingest_window(
    spark: SparkSession,
    lake: str,
    registry: str,
    start_ts: int,
    end_ts: int,
    pumps: Sequence[str] | None = None,
    progress: Progress | None = None,
    *,
    partitions: int | None = None,
    decode_here: int | None = None,
) -> IngestResult:
    """Read ``[start_ts, end_ts)`` from every Pump (or ``pumps``) and write it to the lake.

    ``progress`` receives a short message at every step. ``partitions`` is the
    number of input partitions to aim for (default: twice Spark's default
    parallelism, but never under ``MIN_ROWS_PER_PARTITION`` rows each). A window of
    up to ``decode_here`` row changes is decoded in this process (on a local lake
    appended by delta-rs, or staged as files for Spark's replace, in bounded
    batches; on S3 handed to Spark as Arrow); a larger one is read by the ``binlake`` data source in Spark's Python workers
    (0: always). Default: no limit on a local lake, ``DECODE_HERE_ROWS`` on S3.
    Raises binlake errors with a message naming the window (and the Pump, for
    unreachable Pumps, windows above a safe ts or below a GC ts).
    """
    _validate(spark, lake, registry, start_ts, end_ts, pumps)
    return ingest_windows(spark, lake, registry, [(start_ts, end_ts)], pumps, progress, partitions=partitions,
                          decode_here=decode_here)[0]


def ingest_windows(
    spark: SparkSession,
    lake: str,
    registry: str,
    bounds: Sequence[tuple[int, int]],
    pumps: Sequence[str] | None = None,
    progress: Progress | None = None,
    *,
    partitions: int | None = None,
    max_rows: int | None = None,
    done_since: dt.datetime | None = None,
    decode_here: int | None = None,
) -> list[IngestResult]:
    """Ingest consecutive windows (each one's end the next one's start) in one
    Spark job: one read of ``[first start, last end)``, one commit to ``changes``,
    one to ``ddl_history`` and one to the ledger, which gets a row per window
    with that window's own bounds and counts, exactly as ``ingest_window`` of
    each would write. With ``max_rows``, the windows after the first stop where
    their row changes would pass it (those are left to their own runs). With
    ``done_since`` (naive UTC), nothing is written when the ledger, read under
    the write lock, shows the first window ingested at or after it (another
    run's batch took it meanwhile): the result is then empty.
    Returns the result of each window ingested, in order.
    """
    if not bounds:
        raise ValueError("ingest_windows needs at least one window")
    pump_list: list[str] | None = None
    for a, b in bounds:
        pump_list = _validate(spark, lake, registry, a, b, pumps)
    for (_a, b), (c, _d) in zip(bounds, bounds[1:], strict=False):
        if b != c:
            raise errors.InvalidArgument(f"windows must be consecutive: one ends at {b}, the next starts at {c}")
    if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1):
        raise ValueError(f"partitions must be a positive integer, got {partitions!r}")
    for name, value in (("max_rows", max_rows), ("decode_here", decode_here)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    say = progress or (lambda _msg: None)
    started = time.monotonic()
    ws = [_Window(a, b) for a, b in bounds]
    whole = _Window(ws[0].start_ts, ws[-1].end_ts)

    say(f"planning {whole}: pumps from the registry, each checked")
    plan = plan_read(registry, whole.start_ts, whole.end_ts, pump_list)
    pump_ids = tuple(p.node_id for p in plan.pumps)
    say("checking the windows ledger")
    windows, replaced = _check_ledger(spark, lake, registry, ws)
    say("loading the schema history")
    known = _schema_history(spark, lake, registry, windows, whole, say)
    target = partitions or 2 * connect.default_parallelism(spark)
    indexes: list[WindowIndex] = []
    for w in ws:
        say(f"scanning {w} on {len(pump_ids)} pump(s): DDLs, duplicates, partition bounds")
        index = _scan(plan.addrs, known, w, target)
        if indexes and max_rows is not None and sum(i.total_rows for i in indexes) + index.total_rows > max_rows:
            break  # too big to join the batch: its own run ingests it
        indexes.append(index)
    # The lake's writers take turns from the first Delta write to the ledger rows
    # (lake.writelock): windows of one day would fail each other's commits.
    with writelock.lake_writes(lake, what=f"ingest {whole}", spark=spark, progress=say) as turn:
        if turn.waited >= 0.5:
            say(f"waited {turn.waited:.1f}s for other writes to this lake")
        if len(indexes) > 1 or done_since is not None:
            # A run at once with this one may have taken some of these windows
            # meanwhile: the batch stops before the first one the ledger holds now,
            # and nothing is written if it took the first one since done_since.
            now_ledger = read_windows(spark, lake, BOUNDS, overlapping=(whole.start_ts, whole.end_ts))
            if done_since is not None and any(
                    (int(r["start_ts"]), int(r["end_ts"])) == (ws[0].start_ts, ws[0].end_ts)
                    and isinstance(r.get("ingested_at"), dt.datetime) and r["ingested_at"] >= done_since
                    for r in now_ledger):
                say(f"{ws[0]} was ingested meanwhile by another run: nothing to write")
                return []
            now_taken = {(int(r["start_ts"]), int(r["end_ts"])) for r in now_ledger}
            keep = 1
            while keep < len(indexes) and (ws[keep].start_ts, ws[keep].end_ts) not in now_taken:
                keep += 1
            indexes = indexes[:keep]
        ws = ws[:len(indexes)]
        whole = _Window(ws[0].start_ts, ws[-1].end_ts)
        merged = merge_consecutive(indexes)
        ledger_rows = []
        for w, index in zip(ws, indexes, strict=True):
            per_pump = {pump: index.rows.get(pump, 0) for pump in pump_ids}
            ledger_rows.append((w.start_ts, w.end_ts, list(pump_ids), per_pump,
                                _table_op_counts(index, known.history), index.total_txns, index.total_rows,
                                len(index.ddls), "done"))
        _write_window(spark, lake, registry, pump_ids, known, merged, whole, say,
                      decode_here, turn.check)
        failpoint.hit("ingest-before-ledger")
        say("recording the window" + (f"s {', '.join(map(str, ws))}" if len(ws) > 1 else ""))
        now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        _record(spark, lake, [(*row, now) for row in ledger_rows], turn.check)
    failpoint.hit("ingest-before-checkpoint")
    _move_checkpoint(spark, lake, registry, whole, say)
    elapsed = time.monotonic() - started
    return [IngestResult(
        lake=lake, start_ts=row[0], end_ts=row[1], pumps=pump_ids, txns=row[5], rows=row[6], ddls=row[7],
        duplicates=index.duplicates, rows_per_pump=row[3], rows_per_table_op=row[4],
        replaced=(row[0], row[1]) in replaced, elapsed_s=elapsed,
    ) for row, index in zip(ledger_rows, indexes, strict=True)]


@dataclasses.dataclass(frozen=True)
class _Window:
    """The bounds of the window being ingested (shown as ``[start, end)``)."""

    start_ts: int
    end_ts: int

    def __str__(self) -> str:
        return f"[{self.start_ts}, {self.end_ts})"


@dataclasses.dataclass
class _KnownSchema:
    """The table definitions an ingest decodes with, and what ``ddl_history`` needs."""

    history: SchemaHistory
    # ``ddl_history``'s rows inside the window (a re-ingest replaces them).
    ddls_already: list[dict[str, Any]]
    # DDLs below the lake's first window, read from the Pumps by the first ingest.
    base: list[Any]
    # Why the Pumps could not give some ranges' DDLs (named when a table is unknown).
    lost: list[str]


def _check_ledger(spark: SparkSession, lake: str, registry: str,
                  ws: Sequence[_Window]) -> tuple[list[dict[str, Any]], set[tuple[int, int]]]:
    """The ledger's windows, and those of ``ws`` that replace an ingested one (an
    overlap with other bounds is refused); holds the Pumps' GC for this lake
    before anything is read: a new lake at the first window's start, a known one
    at its ledger's end (the registry keeps the max)."""
    windows = read_windows(spark, lake, BOUNDS)
    replaced = {(w.start_ts, w.end_ts) for w in ws if check_overlap(windows, w.start_ts, w.end_ts)}
    held = checkpoint.contiguous_end(windows)
    checkpoint.report(registry, lake, ws[0].start_ts if held is None else held)
    return windows, replaced


def _schema_history(spark: SparkSession, lake: str, registry: str, windows: list[dict[str, Any]], w: _Window,
                    say: Progress) -> _KnownSchema:
    """The definitions in force below ``w``: ``ddl_history`` plus the DDLs of the
    ranges it is not complete for, read from the Pumps."""
    history, ddls_already = _load_ddl_history(spark, lake, w.start_ts, w.end_ts)
    done = [x for x in windows if x.get("status") == "done"]
    # ddl_history is complete below the lake's first window (the first ingest made
    # it so) and inside every ingested window; only the rest is read from the Pumps.
    first = min((int(x["start_ts"]) for x in done), default=None)
    gaps = [(0, w.start_ts)] if first is None else uncovered(done, first, w.start_ts) if first < w.start_ts else []
    lost: list[str] = []
    base: list[Any] = []
    if gaps:
        what = "below the window" if first is None else "between ingested windows"
        say(f"reading the DDLs of {len(gaps)} range(s) {what} that no ingested window covers, from the pumps")
        ddls, lost = _history_from_pumps(registry, gaps)
        for ddl in ddls:
            history.apply(ddl)
        if first is None:
            base = ddls
    return _KnownSchema(history, ddls_already, base, lost)


def _scan(addrs: Mapping[str, str], known: _KnownSchema, w: _Window, partitions: int) -> WindowIndex:
    """The window's index from every Pump (its DDLs, duplicates, partition
    bounds); its DDLs join the history, and every table it touches must be known
    at both ends of its rows (else the ingest fails naming the table)."""
    index = index_window(addrs, w.start_ts, w.end_ts, partitions=partitions,
                         min_rows_per_partition=MIN_ROWS_PER_PARTITION)
    for _pump, ddl in index.ddls:
        known.history.apply(ddl)
    for table_id, (lo, hi) in sorted(index.tables.items()):
        for at in (lo, hi):
            try:
                known.history.table(table_id, at)
            except UnknownTableError as exc:
                raise _missing_table(exc, w.start_ts, w.end_ts, known.lost, (lo, hi)) from None
    return index


def _write_window(spark: SparkSession, lake: str, registry: str, pump_ids: tuple[str, ...], known: _KnownSchema,
                  index: WindowIndex, w: _Window, say: Progress, decode_here: int | None,
                  check: Callable[[], None]) -> int:
    """The window's row changes into ``changes`` and its DDLs into
    ``ddl_history`` (each replacing what the window held); the rows written,
    which must be the scan's count. Up to ``decode_here`` row changes are decoded
    in this process (``_decoded_here``); more are read by the data source in Spark.
    ``check`` runs before each commit."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    start_ts, end_ts = w.start_ts, w.end_ts
    changes_path = table_path(lake, CHANGES)
    options = {"registry": registry, "start_ts": str(start_ts), "end_ts": str(end_ts), "pumps": ",".join(pump_ids),
               "schema_history": known.history.snapshot(start_ts).to_json(), "window_index": index.to_json()}
    observed: list[Any] = []
    streamed = staging.staging_dir(lake) is not None  # a local lake: decoded rows are staged as files
    limit = decode_here if decode_here is not None else (None if streamed else DECODE_HERE_ROWS)
    here = 0 < index.total_rows and (limit is None or index.total_rows <= limit)

    def write_changes() -> None:
        # Counted while written (no second pass): checked against the scan below.
        observed[:] = [Observation(f"binlake-ingest-{start_ts}-{end_ts}")]
        df = spark.read.format(lake_source.FORMAT).options(**options).load()
        df = df.observe(observed[0], F.count(F.lit(1)).alias("rows"))
        _replace(df, changes_path, _window_predicate(start_ts, end_ts), ["commit_date"])

    rows = 0
    try:
        with connect.job_description(spark, f"binlake ingest {w}"):
            if here and streamed:
                say(f"decoding {index.total_rows} row changes of {index.total_txns} transactions here, then writing")
                # Before staging: under the write lock every staged file is a leftover of
                # an earlier attempt, and this attempt's own files must not be taken for one.
                _fence_earlier(spark, lake, w, check)
                appended = _appended_here(lake, options, w, index.total_rows, check)
                if appended is not None:
                    rows = appended
                    if rows == index.total_rows:  # else nothing was committed (raised below)
                        say(f"appended {rows} row changes to {CHANGES} in one commit (delta-rs)")
                else:
                    say("staging the rows as files for Spark to write (a replace of rows the window held before)")
                    staged = _staged_here(lake, options, w)
                    rows = staged.rows
                    if rows != index.total_rows:  # nothing is written (the miscount is raised below)
                        staged.remove()
                    else:
                        append = _may_append(lake, w)
                        with staging.staged_frame(spark, staged, CHANGES_DDL) as df:
                            _retry_concurrent(CHANGES, lambda: _write_rows(df, changes_path, w, append), check)
            elif here:
                say(f"decoding {index.total_rows} row changes of {index.total_txns} transactions here, then writing")
                batches = _decoded_here(options, w)
                rows = sum(b.num_rows for b in batches)
                if rows == index.total_rows:  # else nothing is written (checked below)
                    _fence_earlier(spark, lake, w, check)
                    append = _may_append(lake, w)
                    with staging.arrow_frame(spark, lake, batches, CHANGES_DDL, _stage_name(w)) as df:
                        _retry_concurrent(CHANGES, lambda: _write_rows(df, changes_path, w, append), check)
            elif index.total_rows:
                say(f"reading and writing {index.total_rows} row changes of {index.total_txns} transactions")
                _fence_earlier(spark, lake, w, check)  # an earlier attempt may have decoded here (blind append)
                lake_source.register(spark)
                _retry_concurrent(CHANGES, write_changes, check)
            else:
                # No Delta commit for a window without row changes. Nothing of it can be in
                # ``changes`` to replace: what the Pumps hold of a window is fixed once it is
                # below their safe ts and above their GC ts (checked before this), so every
                # earlier attempt at it found no rows either.
                say("no row changes in the window: the change table is left as it is")
            if not here or rows == index.total_rows:  # decoded here: nothing is written on a miscount
                _write_ddls(spark, lake, known, index, w, say, check)
    except Exception as exc:
        err = binlake_error(exc)
        if err is not None:
            raise type(err)(f"ingest {w}: {err}") from None
        raise
    if observed:
        rows = int(observed[0].get["rows"])
    if rows != index.total_rows:
        raise errors.FailedPrecondition(
            f"ingest {w}: {'decoded' if here else 'wrote'} {rows} row changes but the pumps' scan counted "
            f"{index.total_rows}; the window is not recorded as done - run it again")
    return rows


def _stage_name(w: _Window) -> str:
    """The name of the window's staged change rows (``lake.staging``)."""
    return f"changes-{w.start_ts}-{w.end_ts}"


def _fence_earlier(spark: SparkSession, lake: str, w: _Window, check: Callable[[], None]) -> None:
    """Make sure no earlier attempt at the window can still append rows to
    ``changes`` or ``windows`` (the ledger): called under the lake's write lock,
    before this attempt writes either.

    Appends (``_may_append``, ``_record``) are blind: Delta checks them against
    nothing. What could add the window's rows after this attempt checked a table
    is an earlier attempt whose client died while its Spark Connect server went on
    writing. Every such attempt left a staged file (``lake.staging``: its change
    rows or its ledger rows, removed only once the write returned), and when
    there is one, of any window (a lost batch covered other bounds than its retry;
    under the write lock every staged file is such a leftover):

    * its files are removed, so its job fails if it has not read them yet;
    * then a fence is committed to each table: a table property change, which
      makes every Delta transaction on the table begun before it fail at commit
      (MetadataChanged);
    * after it, ``_may_append`` and ``_record`` read the tables: a write that
      committed before the fence shows as rows of the window, which this attempt
      then replaces.

    So an earlier attempt either committed before this one's check or never
    commits. (Delta's idempotent-write id, ``txnAppId``, did the same on every
    write, but Delta rebuilds the table's state in a Spark job to read it: 0.5-2 s
    a window, measured, against a fence only after a failed attempt.) A
    ``replaceWhere`` of this attempt is safe the same way: the earlier attempt
    fails at commit or committed before it began."""
    earlier = staging.left_over(lake)
    if not earlier:
        return
    staging.remove(earlier)
    for table in (CHANGES, WINDOWS):
        path = table_path(lake, table)
        if not is_delta(spark, path):
            continue  # no table to fence: this attempt replaces, which conflicts with its creation
        check()
        fence = f"{w.start_ts}-{w.end_ts}-{uuid.uuid4().hex[:12]}"
        log.info("ingest %s: an earlier attempt may still be writing %s; fencing it off (%s)", w, table, fence)
        _retry_concurrent(table, _statement(
            spark, f"ALTER TABLE {connect.delta_table(path)} SET TBLPROPERTIES ('{FENCE_PROPERTY}' = '{fence}')"),
            check)


def _statement(spark: SparkSession, sql: str) -> Callable[[], Any]:
    """Run ``sql`` when called (for ``_retry_concurrent``)."""
    return lambda: spark.sql(sql).collect()


def _may_append(lake: str, w: _Window, *, missing_ok: bool = False) -> bool:
    """Whether the window's rows may be appended to ``changes`` rather than replace
    what the table holds of the window: when no file of the table may hold a row
    of it (delta-rs reads the file statistics here: a local lake only). A
    ``replaceWhere`` must find and remove the rows it replaces, which made it 2-3
    times an append's cost. Called under the lake's write lock, after
    ``_fence_earlier``. With ``missing_ok``, a local lake without the table yet
    may be appended to as well (delta-rs creates it; Spark's replace does)."""
    from binlake.lake.store import arrowread

    path = table_path(lake, CHANGES)
    local = arrowread.local_path(path)
    if missing_ok and local is not None and not os.path.isdir(os.path.join(local, "_delta_log")):
        return True
    return arrowread.may_hold(path, _prune_predicate(w.start_ts, w.end_ts)) is False


def _write_rows(df: Any, path: str, w: _Window, append: bool) -> None:
    """The window's change rows into ``changes``: appended (see ``_may_append``),
    else replacing what the table holds of the window."""
    if not append:
        _replace(df, path, _window_predicate(w.start_ts, w.end_ts), ["commit_date"])
        return
    df.write.format("delta").mode("append").partitionBy("commit_date").save(path)


def _decoded_here(options: dict[str, str], w: _Window) -> list[Any]:
    """The window's change rows as pyarrow RecordBatches, read and decoded in this
    process by the data source's own reader (the same Pump checks, partitions and
    decoder), a thread per partition: a small window on a lake Spark cannot be
    handed files on (S3), which goes to Spark inside the plan.

    Why for small windows: a Spark Python worker that reads the data source is a
    new interpreter importing binlake, pyarrow and grpc, and a Spark Connect server
    keeps its workers per session, so every ingest task (a new session) paid for
    new ones: about 5 s of a 30,000-row window's 8 s. Decoding such a window here
    takes 0.1-0.2 s, and its Arrow table (about 0.4 KB a row change) goes to Spark
    with the write."""
    with _named_failures(w):
        reader = lake_source.BinlakeReader(lake_source.ReadOptions.parse(options))
        parts = reader.partitions()
        with concurrent.futures.ThreadPoolExecutor(max(1, min(4, len(parts)))) as pool:
            return [b for part in pool.map(lambda p: list(reader.read(p)), parts) for b in part]


def _staged_here(lake: str, options: dict[str, str], w: _Window) -> staging.StagedFiles:
    """The window's change rows decoded in this process (as ``_decoded_here``) and
    streamed to staged Parquet files of a local lake, a file per input partition:
    the process holds a batch per partition being read, whatever the window's
    size, and Spark appends the files with its own reader (no Python worker).

    Why for every window of a local lake: the data source's Python workers cost
    3-4 s to start in each ingest run, and decoding in one process keeps up with
    a local Spark's write (bench/RESULTS.md, "A window of any size decoded here").
    ``--decode-here-rows`` still sends the larger windows to the executors (a
    cluster whose executors should share the decoding)."""
    with _named_failures(w):
        return staging.stage_streams(lake, _part_streams(options), arrow_batches.changes_schema(), _stage_name(w))


def _part_streams(options: dict[str, str]) -> list[Callable[[], Iterable[Any]]]:
    """A stream of decoded record batches per input partition of the window,
    read by the data source's own reader (the same Pump checks and decoder)."""
    reader = lake_source.BinlakeReader(lake_source.ReadOptions.parse(options))
    return [functools.partial(reader.read, part) for part in reader.partitions()]


def _appended_here(lake: str, options: dict[str, str], w: _Window, expected: int,
                   check: Callable[[], None]) -> int | None:
    """The window's change rows decoded in this process (as ``_staged_here``) and
    appended to a local lake's ``changes`` by delta-rs in one commit
    (``lake.store.arrowwrite``): the rows appended, which are ``expected`` (a
    miscount commits nothing and returns the count, raised by the caller). None
    when they must go through Spark instead: the table may already hold rows of
    the window (a replace), or delta-rs will not write it.

    Why: Spark's read of the staged files and its write were most of a big
    window's ingest (about 95,000 row changes a second on one local core);
    with delta-rs, which writes as the rows are decoded, a big window's rows went
    in about twice as fast (bench/RESULTS.md, "A new window's rows appended by
    delta-rs")."""
    path = table_path(lake, CHANGES)
    if not arrowwrite.can_append(path) or not _may_append(lake, w, missing_ok=True):
        return None
    with _named_failures(w):
        batches = arrowwrite.merged(_part_streams(options))
        try:
            return arrowwrite.append(path, batches, arrow_batches.changes_schema(), ["commit_date"], expected, check)
        except arrowwrite.Miscount as exc:
            return exc.rows
        except arrowwrite.NotWritable as exc:
            # Nothing is known to be committed: the Spark path decides append or replace
            # again from what the table holds now.
            log.warning("ingest %s: %s; writing through Spark instead", w, exc)
            return None


@contextlib.contextmanager
def _named_failures(w: _Window) -> Iterator[None]:
    """A binlake error raised inside names the window, as a Spark worker's does."""
    try:
        yield
    except errors.BinlakeError as exc:
        try:
            raised: errors.BinlakeError = type(exc)(f"ingest {w}: {exc}")
        except TypeError:  # a class whose constructor takes more (UnknownTableError)
            raised = errors.FailedPrecondition(f"ingest {w}: {exc}")
        raise raised from None


def _write_ddls(spark: SparkSession, lake: str, known: _KnownSchema, index: WindowIndex, w: _Window,
                say: Progress, check: Callable[[], None]) -> None:
    """The DDLs below the lake's first window (a first ingest) and the window's own
    into ``ddl_history``."""
    ddl_path = table_path(lake, DDL_HISTORY)
    if known.base:
        say(f"adding the {len(known.base)} DDL(s) below the lake's first window to ddl_history")
        _retry_concurrent(DDL_HISTORY, lambda: _merge_ddls(spark, ddl_path, known.base), check)
    txns = [t for _pump, t in index.ddls]
    # No Delta commit when nothing is new and nothing to replace (no DDL, or a
    # re-ingest finding the same DDL rows). Rows are compared whole, so one
    # written differently before is still replaced.
    if not _same_ddl_rows(known.ddls_already, txns):
        say(f"writing {len(index.ddls)} DDL(s) to ddl_history")
        ddl_df = _ddl_frame(spark, txns)
        _retry_concurrent(DDL_HISTORY, lambda: _replace(
            ddl_df, ddl_path, f"commit_ts >= {w.start_ts} AND commit_ts < {w.end_ts}"), check)


def _record(spark: SparkSession, lake: str, rows: list[tuple[Any, ...]], check: Callable[[], None]) -> None:
    """The windows' ``windows`` rows (``WINDOWS_DDL``), each replacing one with the
    same bounds, in one commit; written last, so a failed ingest leaves no row
    claiming a window is done. ``check`` runs before the commit.

    Invariant: the ledger holds one row per window, whatever attempts at it ran.
    Called under the lake's write turn, which every binlake writer takes, so
    windows the ledger does not hold yet (read now, inside it) may be appended
    (a blind append costs a fifth of a replaceWhere, which must find the rows to
    replace); any other case replaces the rows with the same bounds. A blind
    append checks nothing at commit, so an earlier attempt whose ledger append was
    still running on a Spark Connect server when its client died could otherwise
    commit after this one's and leave the window twice: in a local lake the rows
    go through a staged file (the attempt's marker, ``lake.staging``) and
    ``_fence_earlier`` fences off any such attempt before the ledger is read.
    Where nothing can be staged (S3) the rows always replace: two replacing
    writes of one window conflict at commit, and the retried one replaces the other."""
    path = table_path(lake, WINDOWS)
    bounds = {(int(r[0]), int(r[1])) for r in rows}
    whole = _Window(min(a for a, _b in bounds), max(b for _a, b in bounds))
    _fence_earlier(spark, lake, whole, check)  # a no-op unless an earlier attempt left its staged file
    local = staging.staging_dir(lake) is not None
    ledger = _small_table_rows(path, ("start_ts", "end_ts")) if local and is_delta(spark, path) else None
    append = ledger is not None and not bounds & {(int(r["start_ts"]), int(r["end_ts"])) for r in ledger}
    where = " OR ".join(f"(start_ts = {a} AND end_ts = {b})" for a, b in sorted(bounds))

    def write(windows_df: Any) -> None:
        if append:
            _retry_concurrent(WINDOWS, lambda: windows_df.write.format("delta").mode("append").save(path), check)
        else:
            _retry_concurrent(WINDOWS, lambda: _replace(windows_df, path, where), check)

    if not local:
        write(spark.createDataFrame(rows, WINDOWS_DDL))
        return
    with staging.arrow_frame(spark, lake, [arrow_batches.ledger_batch(rows)], WINDOWS_DDL,
                             f"windows-{whole.start_ts}-{whole.end_ts}") as staged:
        write(staged)


def _move_checkpoint(spark: SparkSession, lake: str, registry: str, w: _Window, say: Progress) -> None:
    """The lake's consumer checkpoint to the end of its contiguous ledger. After
    the windows row (see lake.checkpoint): the ledger, re-read, decides."""
    ledger_end = checkpoint.contiguous_end(read_windows(spark, lake, BOUNDS))
    if ledger_end is not None:
        say(f"moving the lake's consumer checkpoint to {tso.format_ts(ledger_end)}")
        try:
            checkpoint.report(registry, lake, ledger_end)
        except errors.BinlakeError as exc:
            # The window is in the lake; a checkpoint left behind only holds GC longer,
            # and the next ingest recomputes it from the whole ledger.
            log.warning("ingest %s: the lake's checkpoint was not moved (GC stays held): %s", w, exc)


def _ddl_frame(spark: SparkSession, txns: list[Any]) -> DataFrame:
    rows = [ddl_row(t) for t in txns]
    return spark.createDataFrame([tuple(r[n] for n, _ in DDL_COLUMNS) for r in rows], DDL_HISTORY_DDL)


def _merge_ddls(spark: SparkSession, path: str, txns: list[Any]) -> None:
    """Add DDL rows ``ddl_history`` does not hold yet (matched by start_ts), so the
    history below the first window is written once whatever the order of ingests."""
    df = _ddl_frame(spark, txns)
    if not is_delta(spark, path):
        try:
            df.write.format("delta").mode("error").save(path)  # "errorifexists" is refused over Connect
            return
        except Exception as exc:  # created meanwhile by a concurrent first ingest: merge instead
            if "already exists" not in str(exc).lower():
                raise
    # SQL MERGE rather than DeltaTable.merge: the Python DeltaTable API needs a
    # Delta plugin on a Spark Connect server, the SQL statement does not.
    view = f"binlake_ddls_{uuid.uuid4().hex}"
    df.createOrReplaceTempView(view)
    try:
        spark.sql(f"MERGE INTO {connect.delta_table(path)} AS t USING {view} AS s ON t.start_ts = s.start_ts "
                  "WHEN NOT MATCHED THEN INSERT *").collect()
    finally:
        spark.catalog.dropTempView(view)


def _prune_predicate(start_ts: int, end_ts: int) -> str:
    """``_window_predicate`` as delta-rs's file pruning takes it (dates as strings)."""
    first = commit_date(start_ts).isoformat()
    last = commit_date(end_ts - 1).isoformat()
    return (f"commit_date >= '{first}' AND commit_date <= '{last}' "
            f"AND commit_ts >= {start_ts} AND commit_ts < {end_ts}")


def _window_predicate(start_ts: int, end_ts: int) -> str:
    # The partition column bounds the files Delta must consider (and the
    # conflicts it checks against concurrent ingests of other dates).
    first = commit_date(start_ts).isoformat()
    last = commit_date(end_ts - 1).isoformat()
    return (f"commit_date >= DATE'{first}' AND commit_date <= DATE'{last}' "
            f"AND commit_ts >= {start_ts} AND commit_ts < {end_ts}")


def _replace(df: Any, path: str, where: str, partition_by: list[str] | None = None) -> None:
    writer = df.write.format("delta").mode("overwrite").option("replaceWhere", where)
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.save(path)


def _table_op_counts(index: WindowIndex, history: SchemaHistory) -> dict[str, int]:
    """'db.tbl:op' -> row changes, naming each table as it was named when its
    transaction committed (a table renamed inside the window counts under both names):
    the index counts each table per stretch between its DDLs, named as of the stretch's
    first commit_ts."""
    out: dict[str, int] = {}
    for commit_ts, table_id, ins, upd, dele in index.table_counts:
        info = history.table(table_id, commit_ts)
        for op, n in (("insert", ins), ("update", upd), ("delete", dele)):
            if n:
                key = f"{info.db}.{info.name}:{op}"
                out[key] = out.get(key, 0) + n
    return out
