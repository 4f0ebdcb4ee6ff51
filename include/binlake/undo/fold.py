"""The undo's plan, computed in Spark: per touched key, its image before and after.

Only the chosen change rows are read (never a table's whole history): the
image a key held before the first chosen change is that change's own before
image (an update's or a delete's; none for an insert, or for an update that
moved another row onto the key), and the image after the last one is the
last event's (none when it deleted the key). ``rebuild.typed_changes`` and
``rebuild.key_events`` (with every update's before image as an event) type
both images onto today's definition of the table exactly as a restore does:
key changes, deletes and re-inserts, and the DDL between (renamed, added,
dropped and retyped columns) fold the same way.

A key whose before and after images are equal (changed and changed back) needs
nothing and is left out. Each table's plan is kept as a local checkpoint on
disk in partitions of at most ``[memory] partition_rows`` keys and streamed
to the driver one partition at a time, never as a whole table.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from binlake import config, errors, tso
from binlake.lake.decoding import decode
from binlake.lake.store.ledger import BOUNDS, is_delta, read_windows
from binlake.lake.store.location import check_lake, table_path
from binlake.proto import binlog_pb2
from binlake.restore import columns as C
from binlake.restore import coverage, rebuild
from binlake.restore import fills as fill_mod
from binlake.undo.selection import Selection

Progress = Callable[[str], None]
ACTIONS = ("update", "insert", "delete")  # what the target gets: the before image's shape


@dataclasses.dataclass
class TablePlan:
    """One table's reverts: ``frame`` rows are the key columns, ``_pre`` and ``_post``
    (structs of the other columns, null where the key is absent) and ``_action``."""

    table_id: int
    info: binlog_pb2.TableInfo
    frame: Any
    counts: dict[str, int]

    @property
    def name(self) -> str:
        return f"{self.info.db}.{self.info.name}"

    @property
    def rows(self) -> int:
        return sum(self.counts.values())

    def key(self) -> list[str]:
        return C.key_names(self.info)

    def rest(self) -> list[C.Column]:
        key = set(self.key())
        return [c for c in C.columns_of(self.info) if c.name not in key]

    def stream(self) -> Iterator[tuple[tuple[Any, ...], dict[str, Any] | None, dict[str, Any] | None]]:
        """(key values, before image, after image) per key, as Python values, one
        partition in this process at a time."""
        cols = C.columns_of(self.info)
        types = {c.name: c.type for c in cols}
        key, rest = self.key(), self.rest()

        def image(r: Any, kv: tuple[Any, ...]) -> dict[str, Any] | None:
            if r is None:
                return None
            row = dict(zip(key, kv, strict=True))
            row.update({c.name: C.python_value(r[c.name], c.type) for c in rest})
            return row

        # The frame's partitions are sized by ``plan`` (at most [memory] partition_rows keys).
        for r in self.frame.toLocalIterator(prefetchPartitions=True):
            kv = tuple(C.python_value(r[k], types[k]) for k in key)
            yield kv, image(r["_pre"], kv), image(r["_post"], kv)


@dataclasses.dataclass
class UndoPlan:
    selection: Selection
    tables: list[TablePlan]
    first_ts: int  # commit_ts of the first and last chosen change rows
    last_ts: int
    changes: int  # chosen change rows
    elapsed_s: float = 0.0

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)


def _windows(spark: Any, lake: str) -> list[dict[str, Any]]:
    check_lake(lake)
    if not is_delta(spark, table_path(lake, "windows")):
        raise errors.NotFound(f"no lake at {lake}: nothing was ingested there (binlake ingest ...)")
    return read_windows(spark, lake, BOUNDS)


def _in_dates(changes: Any, lo: int, hi: int) -> Any:
    # commit_date first: only the partitions of the range are listed.
    return changes.where(f"commit_date >= DATE'{decode.commit_date(max(lo, 0)).isoformat()}' "
                         f"AND commit_date <= DATE'{decode.commit_date(hi).isoformat()}'")


def chosen_rows(spark: Any, lake: str, sel: Selection, windows: list[dict[str, Any]]) -> tuple[Any, int, int]:
    """The chosen change rows (before --tables and --where) and the first and last commit_ts
    they may have; refuses a range or transaction the windows ledger does not cover."""
    from pyspark.sql import functions as F

    changes = rebuild.changes_frame(spark, lake)
    if not sel.txns:
        lo, hi = int(sel.start_ts or 0), int(sel.end_ts or 0)
        # Every commit_ts in [lo, hi) must be in an ingested window (the gap is named).
        coverage.check(windows, hi - 1, base_ts=lo - 1)
        rows = _in_dates(changes, lo, hi - 1).where((F.col("commit_ts") >= lo) & (F.col("commit_ts") < hi))
        return rows, lo, hi - 1
    first, end = coverage.lake_span(windows)
    found = {int(r["start_ts"]): int(r["commit_ts"]) for r in
             changes.where(F.col("start_ts").isin(list(sel.txns))).select("start_ts", "commit_ts").distinct().collect()}
    missing = [t for t in sel.txns if t not in found]
    if missing:
        raise errors.NotFound(f"no transaction with start_ts {', '.join(map(str, missing))} in the lake at "
                              f"{lake} (its windows cover [{first}, {end}); `binlake ctl dump` lists transactions)")
    for cts in sorted(set(found.values())):
        coverage.check(windows, cts, base_ts=cts - 1)
    lo, hi = min(found.values()), max(found.values())
    rows = _in_dates(changes, lo, hi).where(F.col("start_ts").isin(list(sel.txns))
                                            & F.col("commit_ts").isin(sorted(set(found.values()))))
    return rows, lo, hi


def _where(typed: Any, where: str, parse_only: bool = False) -> Any:
    """``typed`` rows that satisfy the user's predicate; one line when it does not parse
    or (unless ``parse_only``) names what the change rows do not have."""
    from pyspark.sql import functions as F

    view = typed.select("*", F.col("tbl").alias("table"),
                        F.when(F.col("op") != "insert", F.col("_before")).alias("before"),
                        F.when(F.col("op") != "delete", F.col("_after")).alias("after"))
    try:
        predicate = F.expr(where)
        if parse_only:
            return view
        kept = view.where(predicate)
        kept.schema  # noqa: B018 - analysed now: an unknown column is the user's mistake, said before any write
    except Exception as exc:
        if type(exc).__name__ not in ("ParseException", "AnalysisException"):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise errors.InvalidArgument(
            f"--where {where!r} is not a predicate over the change rows (op, db, table, commit_ts, start_ts, "
            f"before.COL, after.COL): {first}") from None
    return kept.drop("table", "before", "after")


def _fold(typed: Any, info: binlog_pb2.TableInfo) -> Any:
    """Per key: ``_pre`` (before the first event), ``_post`` (after the last), ``_action``."""
    from pyspark.sql import functions as F

    out = C.columns_of(info)
    key = C.key_names(info)
    rest = [c.name for c in out if c.name not in key]
    evts = rebuild.key_events(typed, out, befores=True)
    value = F.struct(*[F.col(f"`{n}`") for n in rest], F.col("_del"))
    order = F.struct(*[F.col(n) for n in rebuild.ORDER])
    folded = evts.groupBy(*[F.col(f"`{k}`") for k in key]).agg(F.min_by(value, order).alias("_f"),
                                                               F.max_by(value, order).alias("_l"))

    def image(name: str, present: Any) -> Any:
        return F.when(present, F.struct(*[F.col(name).getField(n).alias(n) for n in rest]))

    plan = folded.select(*[F.col(f"`{k}`") for k in key], image("_f", F.col("_f._del")).alias("_pre"),
                         image("_l", ~F.col("_l._del")).alias("_post"))
    return (plan.where(~F.col("_pre").eqNullSafe(F.col("_post")))
            .withColumn("_action", F.when(F.col("_pre").isNull(), "delete")
                        .when(F.col("_post").isNull(), "insert").otherwise("update")))


def plan(spark: Any, lake: str, sel: Selection, progress: Progress | None = None) -> UndoPlan:
    """Check the selection against the lake and fold it (nothing is written anywhere)."""
    from pyspark.sql import functions as F
    from pyspark.storagelevel import StorageLevel

    say = progress or (lambda _m: None)
    started = time.monotonic()
    bounds = config.memory()
    if sel.where:
        # Parsed now: a predicate that does not parse is refused whatever the changes touched.
        _where(spark.createDataFrame([], "op string, tbl string, _before struct<x: int>, _after struct<x: int>"),
               sel.where, parse_only=True)
    windows = _windows(spark, lake)
    rows, lo, hi = chosen_rows(spark, lake, sel, windows)
    _first, end = coverage.lake_span(windows)
    schema = rebuild.load_schema(spark, lake, end)
    today = rebuild.tables_at(schema, end - 1)
    wanted = rebuild.select_tables(today, list(sel.tables), end - 1, schema) if sel.tables else None
    if wanted is not None:
        rows = rows.where(F.col("table_id").isin(sorted(wanted)))
    say(f"finding the tables the changes of {sel.describe()} touched")
    touched = {int(r["table_id"]): int(r["n"]) for r in rows.groupBy("table_id").count().withColumnRenamed(
        "count", "n").collect()}
    gone = sorted(t for t in touched if t not in today)
    for t in gone:  # a table still in its initial snapshot: said so, not "dropped"
        if schema.pending(t, end):
            info = schema.table(t, end)
            rebuild.refuse_pending(schema, f"{info.db}.{info.name}", end - 1)
    if gone:
        names = ", ".join(f"{schema.table(t, tso.MAX_TS).db}.{schema.table(t, tso.MAX_TS).name}"
                          if schema.defined(t, tso.MAX_TS) else str(t) for t in gone)
        raise errors.FailedPrecondition(
            f"the changes touched table(s) no longer in the lake's schema today (dropped or truncated since): "
            f"{names}; leave them out with --tables, or restore them (binlake restore --ts {lo - 1} --tables ...)")
    plans = []
    for table_id in sorted(touched):
        info = today[table_id]
        out = C.columns_of(info)
        key = C.key_names(info)
        if not key:
            raise errors.FailedPrecondition(f"table {info.db}.{info.name} has no primary key: its rows cannot be "
                                            "keyed, so undo cannot tell them apart")
        typed = rebuild.typed_changes(rows.where(F.col("table_id") == table_id), rebuild.versions(schema, table_id),
                                      out, key, fill_mod.version_fills(schema, table_id),
                                      keep=("start_ts", "db", "tbl"))
        if sel.where:
            typed = _where(typed, sel.where)
        say(f"folding {touched[table_id]:,} change row(s) of {info.db}.{info.name}")
        # No more keys than change rows: partitions of at most [memory] partition_rows keys, and
        # no more of them than that needs (the driver streams them one at a time, a job each).
        parts = max(1, -(-touched[table_id] // bounds.partition_rows))
        frame = _fold(typed, info).repartition(parts).localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY)
        counts = dict.fromkeys(ACTIONS, 0)
        counts.update({str(r["_action"]): int(r["count"]) for r in frame.groupBy("_action").count().collect()})
        plans.append(TablePlan(table_id, info, frame, counts))
    result = UndoPlan(sel, plans, lo, hi, sum(touched.values()), time.monotonic() - started)
    say(f"planned {result.rows:,} key(s) to revert in {len(plans)} table(s) from {result.changes:,} change row(s)")
    return result
