"""Snapshots: every table (or the chosen ones) as of commit_ts T, as typed Delta tables.

``take(spark, lake, ts)`` computes each table from the newest earlier usable
snapshot plus the changes in between (``rebuild``), or from the whole history
when there is none, and writes ``snapshots/ts=T/t<table_id>`` with the columns
of the table's definition at T. The catalog (``layout.SNAPSHOT_CATALOG_DDL``)
gets one row per table, then the snapshot's marker row: a crash half way
leaves no marker, so no reader uses the partial snapshot, and taking it again
replaces its tables.

Before the marker, each table is proven (``proven``): read back, it must equal the
whole history at T summed from the change rows (from the previous proven snapshot's
recorded sum, or from the lake's start), and the sum is recorded in its catalog row.
A table that disagrees fails the snapshot with one line (``SnapshotDisproved``).

``base_for(...)`` is how a restore (or the next snapshot) picks its base.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from binlake import errors, failpoint, tso
from binlake.lake.decoding import decode
from binlake.lake.store import arrowread, writelock
from binlake.lake.store.ledger import BOUNDS, is_delta, read_windows
from binlake.proto import binlog_pb2
from binlake.restore import columns as C
from binlake.restore import coverage, layout, onepass, proven, rebuild, sparksum
from binlake.restore.tables import Plan, TablePlan, write_tables

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class SnapshotEntry:
    snapshot_ts: int
    table_id: int
    db: str
    tbl: str
    path: str
    rows: int
    info: binlog_pb2.TableInfo | None
    complete: bool
    proof: proven.Record | None = None


class SnapshotDisproved(errors.FailedPrecondition):
    """A snapshot table that does not equal its whole history: the snapshot is not taken."""


def catalog(spark: Any, lake: str) -> list[SnapshotEntry]:
    """The tables of every *valid* snapshot (one with its marker row), newest first."""
    from binlake.lake.store import arrowread

    path = layout.snapshot_catalog(lake)
    if not is_delta(spark, path):
        return []
    # A local lake's catalog is read here (milliseconds; a Spark job is a second or more).
    rows: Any = arrowread.small_table_rows(path, None)
    if rows is None:
        rows = [r.asDict() for r in spark.read.format("delta").load(path).collect()]
    markers = {r["snapshot_ts"]: bool(r["complete"]) for r in rows if r["table_id"] == layout.MARKER_TABLE_ID}
    out = []
    for r in rows:
        ts = r["snapshot_ts"]
        if ts not in markers:
            continue
        info = binlog_pb2.TableInfo.FromString(bytes(r["table_info"])) if r["table_info"] is not None else None
        out.append(SnapshotEntry(ts, r["table_id"], r["db"] or "", r["tbl"] or "",
                                 layout.table_location(lake, r["path"] or ""), r["rows"] or 0,
                                 info, markers[ts], proven.record_of(r)))
    return sorted(out, key=lambda e: (-e.snapshot_ts, e.table_id))


def base_for(spark: Any, entries: Sequence[SnapshotEntry], schema: decode.SchemaHistory, table_id: int,
             ts: int) -> rebuild.Base:
    """The newest base at or below ``ts`` for ``table_id``: a snapshot holding it, or a
    complete snapshot taken before it existed (empty), else the lake's start."""
    stamps = sorted({e.snapshot_ts for e in entries if e.snapshot_ts <= ts}, reverse=True)
    for s in stamps:
        at_s = [e for e in entries if e.snapshot_ts == s]
        hit = next((e for e in at_s if e.table_id == table_id), None)
        if hit is not None and hit.info is not None:
            return rebuild.Base(s, "snapshot", spark.read.format("delta").load(hit.path),
                                tuple(C.columns_of(hit.info)), hit.path)
        complete = any(e.table_id == layout.MARKER_TABLE_ID and e.complete for e in at_s)
        # Pending tables count as existing here: such a snapshot left out a table whose
        # rows were already arriving (its initial snapshot), so it is no empty base for it.
        if complete and table_id not in rebuild.tables_at(schema, s, pending=True):
            return rebuild.Base(s, "snapshot (table created later)")
    return rebuild.Base(0, "lake start")


def check_base(windows: list[dict[str, Any]], schema: decode.SchemaHistory, table_id: int, ts: int,
               base: rebuild.Base, name: str) -> None:
    """Refuse unless the ledger covers (base, ts] and, from the lake's start, the table
    was created inside the lake's windows (its earlier rows would be missing)."""
    if base.kind == "lake start":
        coverage.check(windows, ts)
        first, _ = coverage.lake_span(windows)
        born = rebuild.created_ts(schema, table_id)
        if born < first:
            raise errors.FailedPrecondition(
                f"table {name} was created at {tso.format_ts(born)}, before the lake's first window "
                f"[{first}, ...): its rows from before that window are not in the lake and no snapshot holds them; "
                f"ingest [{born}, {first}) first")
    else:
        coverage.check(windows, ts, base.ts)


@dataclasses.dataclass(frozen=True)
class SnapshotResult:
    snapshot_ts: int
    tables: list[tuple[str, int, str]]  # (db.table, rows, base)
    elapsed_s: float

    @property
    def rows(self) -> int:
        return sum(n for _t, n, _b in self.tables)

    def summary(self) -> str:
        lines = [f"snapshot at {tso.format_ts(self.snapshot_ts)}: {len(self.tables)} table(s), {self.rows} rows "
                 f"in {self.elapsed_s:.1f}s"]
        lines += [f"  {name:<40} {rows:>10}  from {base}" for name, rows, base in self.tables]
        return "\n".join(lines)


def take(spark: Any, lake: str, ts: int, tables: Sequence[str] | None = None,
         progress: Progress | None = None, parallelism: int = onepass.DEFAULT_PARALLELISM) -> SnapshotResult:
    """Write a snapshot of every table (or ``tables``) at commit_ts ``ts``: one pass over
    the change table for all of them, ``parallelism`` tables written at once; one turn
    at the lake's writes (``lake.writelock``)."""
    say = progress or (lambda _m: None)
    with writelock.lake_writes(lake, what=f"snapshot at {ts}", spark=spark, progress=say) as turn:
        return _take(spark, lake, ts, tables, say, parallelism, turn.check)


def _take(spark: Any, lake: str, ts: int, tables: Sequence[str] | None, say: Progress, parallelism: int,
          check: Callable[[], None]) -> SnapshotResult:
    started = time.monotonic()
    windows = read_windows(spark, lake, BOUNDS)
    coverage.check(windows, ts)
    schema = rebuild.load_schema(spark, lake, ts)
    found = rebuild.tables_at(schema, ts)
    chosen = rebuild.select_tables(found, tables, ts, schema, lambda: rebuild.load_schema(spark, lake, tso.MAX_TS))
    entries = [e for e in catalog(spark, lake) if e.snapshot_ts != ts]
    plans = []
    for table_id, info in sorted(chosen.items()):
        base = base_for(spark, entries, schema, table_id, ts)
        check_base(windows, schema, table_id, ts, base, f"{info.db}.{info.name}")
        plans.append(TablePlan(table_id, info, base))
    p = Plan(lake, ts, schema, plans, "auto")
    # One pass over the lake for every table, then the tables written concurrently.
    # They are not the lake's until the catalog's marker row names them (the commit
    # point), which is checked against the write turn once more.
    check()
    written = write_tables(spark, p, lambda t: layout.snapshot_table(lake, ts, t.table_id), parallelism, say)
    failpoint.hit("snapshot-after-table")
    wholes = prove(spark, lake, p, entries, say, {name: n for name, n, _kind in written})
    rows_out = []
    done = []
    for t, (name, n, kind) in zip(plans, written, strict=True):
        w = wholes[t.name]
        rows_out.append((ts, t.table_id, t.info.db, t.info.name,
                         layout.stored_path(lake, layout.snapshot_table(lake, ts, t.table_id)), n,
                         t.info.SerializeToString(), tables is None, _now(), w.sum[0], w.sum[1], w.sum[2],
                         proven.signature(t.info), w.changes_at_ts[0] if w.changes_at_ts else None,
                         w.changes_at_ts[1] if w.changes_at_ts else None,
                         w.start.snapshot_ts if w.start is not None else 0))
        done.append((name, n, kind))
    # Catalog rows of the tables, then the marker (the snapshot's commit point).
    marker = (ts, layout.MARKER_TABLE_ID, None, None, None, sum(n for _a, n, _b in done), None, tables is None, _now(),
              None, None, None, None, None, None, None)
    cat = layout.snapshot_catalog(lake)
    df = spark.createDataFrame([*rows_out, marker], layout.SNAPSHOT_CATALOG_DDL)
    check()
    if is_delta(spark, cat):
        # Replaces an earlier (possibly partial) snapshot at the same ts in one commit.
        # mergeSchema: a catalog of an older binlake gains the proof columns.
        df.write.format("delta").mode("overwrite").option("replaceWhere", f"snapshot_ts = {int(ts)}") \
            .option("mergeSchema", "true").save(cat)
    else:
        df.write.format("delta").mode("overwrite").save(cat)
    return SnapshotResult(ts, done, time.monotonic() - started)


def prove(spark: Any, lake: str, p: Plan, entries: Sequence[SnapshotEntry], say: Progress,
          rows: Mapping[str, int] | None = None) -> dict[str, proven.Whole]:
    """Each written table of snapshot ``p`` (read back) against its whole history at p.ts
    (``proven.measure``: from the newest earlier proven snapshot, whose rows below it must
    digest as recorded, else from the lake's start); raises ``SnapshotDisproved`` naming
    the first table that disagrees. ``rows``: the rows written per table (a table of at
    most ``proven.driver_rows()`` is read back in this process)."""
    records = {(e.snapshot_ts, e.table_id): e.proof for e in entries if e.proof is not None}
    asks = [(t.name, t.table_id, p.ts) for t in p.tables]
    say(f"proving {len(asks)} table(s) against the whole history")
    # Each table as stored: a small one summed here from its files, the others in Spark
    # (in the job that sums their histories).
    here: dict[str, proven.Sum] = {}
    reads = []
    limit = proven.driver_rows()
    for t in p.tables:
        path = layout.snapshot_table(lake, p.ts, t.table_id)
        small = 0 <= (rows or {}).get(t.name, -1) <= limit
        found = proven.table_sum(path, t.info) if small else None
        if found is not None:
            here[f"s\0{t.name}"] = found
        else:
            reads.append(sparksum.signed_parts(f"s\0{t.name}", _read_back(spark, path), t.info))
    wholes, sums = proven.measure(spark, lake, p.schema, asks, records, inclusive=False, digest_at_ts=True,
                                  extra=reads)
    sums.update(here)
    for t in p.tables:
        w = wholes[t.name]
        if not w.intact:
            assert w.start is not None and w.changes_now is not None
            raise SnapshotDisproved(
                f"snapshot at {p.ts}: the change rows of {t.name} at or below the snapshot at {w.start.snapshot_ts} "
                f"changed since it was proven ({w.start.changes[0]} rows then, {w.changes_now[0]} now): the lake's "
                f"changes table is damaged; `binlake drill --ts {p.ts} --tables {t.name}` names the first key that "
                "differs, and the changes table's Delta history the commit that changed it")
        snap = sums.get(f"s\0{t.name}", sparksum.EMPTY)
        if snap[:2] != w.sum[:2]:
            raise SnapshotDisproved(
                f"snapshot at {p.ts}: table {t.name} does not equal its whole history ({snap[0]} rows in the snapshot, "
                f"{w.sum[0]} in the history, {w.how()}); the snapshot is not taken: `binlake drill --ts {p.ts} "
                f"--tables {t.name}` names the first key that differs")
    return wholes


def _read_back(spark: Any, path: str) -> Any:
    """The snapshot table just written at ``path``, as stored: the Parquet files its Delta
    log names when they can be read as they are (no log replay by Spark, which costs a few
    jobs per table), else the Delta table."""
    files = arrowread.data_files(path)
    return spark.read.parquet(*files) if files else spark.read.format("delta").load(path)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)
