"""History tables: one typed row per version of each upstream row (SCD type 2).

``update(spark, lake)`` keeps ``history/t<table_id>`` per upstream table id with
the table's columns plus::

    _valid_from_ts  long     commit_ts of the transaction that wrote this version
    _valid_to_ts    long     commit_ts of the next change of the key (update, delete,
                             key change, TRUNCATE or DROP of the table); null while current
    _op             string   insert or update: what wrote this version

so the table at any T is plain Spark SQL::

    SELECT * FROM delta.`LAKE/history/t<id>`
    WHERE _valid_from_ts <= T AND (_valid_to_ts IS NULL OR _valid_to_ts > T)

A version is per *transaction*: a row changed twice in one transaction has one
version (the last image). Schema changes: columns are matched by id; the table
has every column the upstream table ever had, named as most recently named;
a column added later holds, in versions written before it existed, what the
upstream gave the rows existing when it was added (``restore.fills``: its
DEFAULT, or null); a dropped
column is kept, null in versions written after it was dropped (named
``<name>__<id>`` if a live column took its name); a retyped column holds every
version in its newest type. A rename or retype rebuilds the table in one pass.

Maintenance is window by window, following the ``windows`` ledger from the lake's
first window up to the first gap: the catalog (``layout.HISTORY_CATALOG_DDL``)
records which ledger windows (with their ``ingested_at``) each table holds. A
run applies the windows not recorded yet in one MERGE (closing the versions they
end and adding the ones they begin), then records them. A window ingested again
since it was applied, or a crash between the MERGE and the catalog write, rewinds
the table to that window's start (versions from it deleted, versions it closed
reopened) before applying again: running twice changes nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from binlake import errors, failpoint, tso
from binlake.lake.decoding import decode
from binlake.lake.sparkenv import connect
from binlake.lake.store import writelock
from binlake.lake.store.ledger import BOUNDS, is_delta, read_windows
from binlake.proto import binlog_pb2
from binlake.restore import columns as C
from binlake.restore import coverage, fills, layout, onepass, rebuild

Progress = Callable[[str], None]
META = ("_valid_from_ts", "_valid_to_ts", "_op")


def catalog(spark: Any, lake: str) -> dict[int, dict[str, Any]]:
    path = layout.history_catalog(lake)
    if not is_delta(spark, path):
        return {}
    rows = [r.asDict() for r in spark.read.format("delta").load(path).collect()]
    # The stored path is relative to the lake (older catalogs: absolute): give callers where it is now.
    return {r["table_id"]: {**r, "path": layout.table_location(lake, r["path"])} for r in rows}


def spec(schema: decode.SchemaHistory, table_id: int) -> list[C.Column]:
    """The history table's columns: every column id the table ever had, newest name/type."""
    newest: dict[int, binlog_pb2.ColumnInfo] = {}
    order: list[int] = []
    for _ts, info in schema.entries_of(table_id):
        for c in info.columns:
            if c.id not in newest:
                order.append(c.id)
            newest[c.id] = c
    last = max(schema.entries_of(table_id), key=lambda x: x[0])[1]
    live = {c.id for c in last.columns}
    live_names = {c.name for c in last.columns}
    out = []
    for cid in order:
        c = newest[cid]
        name = c.name if cid in live or c.name not in live_names else f"{c.name}__{cid}"
        out.append(C.Column(cid, name, c.type, c.sql_type))
    return out


def exists_from(schema: decode.SchemaHistory, table_id: int) -> int | None:
    """commit_ts of the table id's first definition that is neither snapshot-pending nor a
    drop (when it begins to exist); None: it never did (an unfinished initial snapshot's)."""
    for ts, info in schema.entries_of(table_id):
        if not info.snapshot_pending and not info.dropped:
            return ts
    return None


def ended_ts(schema: decode.SchemaHistory, table_id: int) -> int | None:
    """commit_ts at which the table id stopped existing (DROP, or TRUNCATE's new id), if it did."""
    stamps = sorted(ts for ts, _info in schema.entries_of(table_id))
    last = stamps[-1]
    at = min(last + 1, tso.MAX_TS)
    if schema.defined(table_id, at):
        # Retired by a TRUNCATE: another id names this one as previous_table_id.
        for ts, info in schema.entries():
            if info.previous_table_id == table_id:
                return ts
        return None
    return last


def _versions(evts: Any, cols: Sequence[C.Column], key: Sequence[str], end: int | None) -> tuple[Any, Any]:
    """(version rows with _valid_from_ts/_valid_to_ts/_op, first change per key) of events."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rest = [c.name for c in cols if c.name not in key]
    keys = [F.col(f"`{k}`") for k in key]
    per_txn = evts.groupBy(*keys, "_ts").agg(
        F.max_by(F.struct(*[F.col(f"`{n}`") for n in rest], "_del", "_op"), F.struct("_seq", "_sub")).alias("_l"))
    w = Window.partitionBy(*keys).orderBy("_ts")
    nxt = F.lead("_ts").over(w)
    valid_to = nxt if end is None else F.coalesce(nxt, F.lit(end).cast("long"))
    staged = per_txn.select(*keys, "_ts", "_l", valid_to.alias("_to"))
    versions = staged.where(~F.col("_l._del")).select(
        *[F.col(f"`{c.name}`") if c.name in key else F.col("_l").getField(c.name).alias(c.name) for c in cols],
        F.col("_ts").alias("_valid_from_ts"), F.col("_to").alias("_valid_to_ts"),
        F.when(F.col("_l._op") == "insert", "insert").otherwise("update").alias("_op"))
    first = per_txn.groupBy(*keys).agg(F.min("_ts").alias("_first"))
    return versions, first


def _applied(row: dict[str, Any] | None) -> list[tuple[int, int, str]]:
    if not row or not row.get("applied"):
        return []
    return [(int(a), int(b), str(c)) for a, b, c in json.loads(row["applied"])]


@dataclasses.dataclass(frozen=True)
class HistoryResult:
    tables: list[tuple[str, str]]  # (db.table or id, what happened)
    applied_end_ts: int
    elapsed_s: float

    def summary(self) -> str:
        lines = [f"history tables up to {tso.format_ts(self.applied_end_ts)} (exclusive) in {self.elapsed_s:.1f}s"]
        lines += [f"  {name:<40} {what}" for name, what in self.tables]
        return "\n".join(lines)


def update(spark: Any, lake: str, tables: Sequence[str] | None = None,
           progress: Progress | None = None, parallelism: int = onepass.DEFAULT_PARALLELISM) -> HistoryResult:
    """Bring the history table of every table (or ``tables``, named as they are now)
    up to the end of the ledger's contiguous windows: one pass over the change table
    for all of them, ``parallelism`` tables written at once. The whole update, its
    reading of the catalog included, is one turn at the lake's writes
    (``lake.writelock``): two updates planned from one catalog would apply windows twice."""
    say = progress or (lambda _m: None)
    with writelock.lake_writes(lake, what="history tables", spark=spark, progress=say) as turn:
        return _update(spark, lake, tables, say, parallelism, turn.check)


def _update(spark: Any, lake: str, tables: Sequence[str] | None, say: Progress, parallelism: int,
            check: Callable[[], None]) -> HistoryResult:
    started = time.monotonic()
    windows = read_windows(spark, lake, BOUNDS)
    first, _ = coverage.lake_span(windows)
    end = coverage.last_restorable(windows) + 1
    ledger = [(int(w["start_ts"]), int(w["end_ts"]), str(w["ingested_at"])) for w in windows
              if w.get("status") == "done" and int(w["end_ts"]) <= end and int(w["start_ts"]) >= first]
    schema = rebuild.load_schema(spark, lake, end - 1)
    # A table still in its initial snapshot, or whose snapshot never completed, has no
    # history yet: it does not exist (its first build, after its marker, starts there).
    ids = [i for i in schema.table_ids() if exists_from(schema, i) is not None]
    if tables is not None:
        ids = sorted(rebuild.select_tables(rebuild.tables_at(schema, end - 1), tables, end - 1, schema))
    cat = catalog(spark, lake)
    # Per table: up to date, or the first ts to (re)apply from; then one pass over the
    # change table for every table that has windows to apply, and the tables' MERGEs
    # (or builds) from that one materialized read, ``parallelism`` at once.
    todo: list[_Todo] = []
    results: dict[int, tuple[str, str, dict[str, Any]]] = {}
    for table_id in ids:
        cols = spec(schema, table_id)
        last_info = max(schema.entries_of(table_id), key=lambda x: x[0])[1]
        name = f"{last_info.db}.{last_info.name}"
        key = [c.name for c in cols if c.id in set(last_info.primary_key)]
        old = cat.get(table_id)
        applied = _applied(old)
        # Rewind to the first ledger window the table does not hold as it is now.
        keep = 0
        for held, want in zip(applied, ledger, strict=False):
            if held != want:
                break
            keep += 1
        rewind = ledger[keep][0] if keep < len(ledger) else None
        same_cols = old is not None and C.from_json(json.loads(old["columns"])) == cols[:len(json.loads(old["columns"]))]
        path = layout.history_table(lake, table_id)
        fresh = old is None or not same_cols or keep == 0 or not is_delta(spark, path)
        if not fresh and rewind is None and keep == len(applied):
            assert old is not None
            # Written back as the catalog keeps it: relative to the lake (``catalog``
            # gave the table's location now, which must not be stored).
            results[table_id] = (name, "up to date", {**old, "path": layout.stored_path(lake, old["path"])})
            continue
        lo = first if fresh else int(rewind or end)
        todo.append(_Todo(table_id, name, last_info, cols, key, old, path, fresh, lo, keep))
    shared = None
    if todo:
        from pyspark.sql import functions as F

        lo_all = min(t.lo for t in todo)
        scan = (rebuild.changes_frame(spark, lake)
                .where(f"commit_date >= DATE'{decode.commit_date(max(lo_all - 1, 0)).isoformat()}' "
                       f"AND commit_date <= DATE'{decode.commit_date(end - 1).isoformat()}'")
                .where((F.col("commit_ts") > lo_all - 1) & (F.col("commit_ts") <= end - 1)
                       & F.col("table_id").isin([t.table_id for t in todo])))
        shared = onepass.materialize(spark, scan, ("table_id", "commit_ts", "seq"))

    def one(t: _Todo) -> tuple[int, tuple[str, str, dict[str, Any]]]:
        check()  # no commit once the lake's write turn is lost
        return t.table_id, _apply(spark, schema, shared, t, ledger, end, say)

    for table_id, res in onepass.each_table(todo, one, parallelism):
        results[table_id] = res
    done = [(results[i][0], results[i][1]) for i in ids]
    new_rows = [results[i][2] for i in ids]
    names = [n.split()[0] for n in layout.HISTORY_CATALOG_DDL.split(", ")]
    df = spark.createDataFrame([tuple(r[n] for n in names) for r in new_rows], layout.HISTORY_CATALOG_DDL)
    cpath = layout.history_catalog(lake)
    check()
    if is_delta(spark, cpath) and tables is not None:
        ids_sql = ",".join(str(i) for i in ids) or "-1"
        df.write.format("delta").mode("overwrite").option("replaceWhere", f"table_id IN ({ids_sql})").save(cpath)
    else:
        df.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(cpath)
    return HistoryResult(done, end, time.monotonic() - started)


@dataclasses.dataclass(frozen=True)
class _Todo:
    """A history table with windows to apply: from ``lo`` (whole when ``fresh``)."""

    table_id: int
    name: str
    last_info: binlog_pb2.TableInfo
    cols: list[C.Column]
    key: list[str]
    old: dict[str, Any] | None
    path: str
    fresh: bool
    lo: int
    keep: int


def _apply(spark: Any, schema: decode.SchemaHistory, shared: Any, todo: _Todo, ledger: list[tuple[int, int, str]],
           end: int, say: Progress) -> tuple[str, str, dict[str, Any]]:
    """Build or MERGE one history table from its rows of the shared read; (name, what
    happened, its new catalog row)."""
    from pyspark.sql import functions as F

    table_id, name, last_info, cols, key, old, path = (todo.table_id, todo.name, todo.last_info, todo.cols,
                                                       todo.key, todo.old, todo.path)
    fresh, lo, keep = todo.fresh, todo.lo, todo.keep
    gone = ended_ts(schema, table_id)
    close_at = gone if gone is not None and gone < end else None
    rows = rebuild.read_changes(shared, table_id, lo - 1, end - 1)
    evts = rebuild.events(rows, rebuild.versions(schema, table_id), cols, key,
                          fills.version_fills(schema, table_id))
    born = exists_from(schema, table_id)
    if born is not None and schema.entries_of(table_id)[0][1].snapshot_pending:
        from pyspark.sql import functions as F

        # The rows of its initial snapshot were committed while it was pending: as
        # versions they begin at its marker, when the table begins to exist.
        evts = evts.withColumn("_ts", F.greatest(F.col("_ts"), F.lit(born).cast("long")))
    versions, first_change = _versions(evts, cols, key, close_at)
    if fresh:
        say(f"{name}: building the history table from the lake's start")
        versions.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
        what = "built"
    else:
        assert old is not None  # not fresh: the table and its catalog row exist
        say(f"{name}: applying windows from {tso.format_ts(lo)}")
        # SQL statements on the table's path rather than Delta's Python DeltaTable
        # API: they run over a Spark Connect session as over a classic one (over
        # Connect, DeltaTable needs the delta-connect plugin on the server). Each is
        # its own commit, as DeltaTable's were; the catalog row, written after all
        # of them, is what says the windows are in (a rerun rewinds a table whose
        # catalog row does not hold them).
        table, q = connect.delta_table(path), connect.sql_ident
        if lo < int(old["applied_end_ts"]):  # windows applied before are applied again
            spark.sql(f"DELETE FROM {table} WHERE _valid_from_ts >= {int(lo)}").collect()
            spark.sql(f"UPDATE {table} SET _valid_to_ts = NULL WHERE _valid_to_ts >= {int(lo)}").collect()
        have = {c.name for c in C.from_json(json.loads(old["columns"]))}
        added = [c for c in cols if c.name not in have]
        if added:
            if any(c.spark_type() == "timestamp_ntz" for c in added):
                # Delta turns this feature on by itself only when a table is created with such a column.
                spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('delta.feature.timestampNtz' = "
                          "'supported')").collect()
            spark.sql(f"ALTER TABLE {table} ADD COLUMNS (" +
                      ", ".join(f"{q(c.name)} {c.spark_type()}" for c in added) + ")").collect()
            # Every version held predates the added columns: give them what the upstream gave its rows.
            before = fills.base_fills(schema, table_id, int(old["applied_end_ts"]) - 1)
            values = [f"{q(c.name)} = {C.fill_sql(before[c.id].value, before[c.id].column, c.spark_type())}"
                      for c in added if c.id in before]
            if values:
                spark.sql(f"UPDATE {table} SET {', '.join(values)}").collect()
        cond = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in key)
        src = (first_change.select(*[F.col(q(k)) for k in key], F.col("_first"), F.lit("close").alias("_a"))
               .unionByName(versions.withColumn("_first", F.lit(None).cast("long")).withColumn("_a", F.lit("add")),
                            allowMissingColumns=True))
        targets = [q(c.name) for c in cols] + list(META)
        view = f"binlake_history_{int(table_id)}_{uuid.uuid4().hex}"
        src.createOrReplaceTempView(view)
        try:
            spark.sql(f"MERGE INTO {table} AS t USING {view} AS s "
                      f"ON s._a = 'close' AND t._valid_to_ts IS NULL AND {cond} "
                      "WHEN MATCHED THEN UPDATE SET _valid_to_ts = s._first "
                      f"WHEN NOT MATCHED AND s._a = 'add' THEN INSERT ({', '.join(targets)}) "
                      f"VALUES ({', '.join(f's.{n}' for n in targets)})").collect()
        finally:
            spark.catalog.dropTempView(view)
        if close_at is not None:
            spark.sql(f"UPDATE {table} SET _valid_to_ts = CAST({int(close_at)} AS BIGINT) "
                      "WHERE _valid_to_ts IS NULL").collect()
        what = f"applied {len(ledger) - keep} window(s)"
    failpoint.hit("history-before-catalog")
    # The catalog names the table relative to the lake (never an absolute location).
    return name, what, {"table_id": table_id, "db": last_info.db, "tbl": last_info.name,
                        "path": f"{layout.HISTORY}/t{int(table_id)}",
                        "columns": json.dumps(C.to_json(cols)), "key_columns": json.dumps(key),
                        "applied": json.dumps(ledger), "applied_end_ts": end, "ended_ts": gone,
                        "updated_at": dt.datetime.now(dt.UTC).replace(tzinfo=None)}


def at(spark: Any, lake: str, table_id: int, ts: int) -> Any:
    """The history table of ``table_id`` filtered to the versions valid at ``ts``."""
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(layout.history_table(lake, table_id))
    return df.where((F.col("_valid_from_ts") <= ts) & (F.col("_valid_to_ts").isNull() | (F.col("_valid_to_ts") > ts)))


def base_at(spark: Any, lake: str, cat: dict[int, dict[str, Any]], table_id: int, ts: int,
            name: str) -> rebuild.Base:
    """A restore base from the history tables: the versions valid at ``ts`` (or at the
    newest ts they hold, when they stop below it; the changes after are then read)."""
    row = cat.get(table_id)
    if row is None:
        raise errors.FailedPrecondition(
            f"table {name} has no history table yet: run `binlake history` (or restore without --source history)")
    upto = min(ts, int(row["applied_end_ts"]) - 1)
    cols = tuple(C.from_json(json.loads(row["columns"])))
    return rebuild.Base(upto, "history", at(spark, lake, table_id, upto), cols)
