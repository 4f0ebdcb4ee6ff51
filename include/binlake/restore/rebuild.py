"""The state of one upstream table at commit_ts T, computed in Spark.

``state_at`` = a *base* (a snapshot's rows at its ts, the history tables'
rows valid at a ts, or nothing at the lake's beginning) plus the table's
changes with commit_ts in ``(base_ts, T]``, reduced to the last image per
primary key:

* every change becomes *events* on keys: an insert upserts its after image;
  a delete deletes its before image's key; an update upserts its after image
  and, when it moved the row to another key, first deletes the old key;
* events are ordered by (commit_ts, seq, sub) - sub puts an update's delete of
  the old key before its upsert - and the base's rows come before them all;
* per key, the last event wins (one ``max_by`` aggregation, no sort of the whole
  table); keys whose last event is a delete are gone.

Images are parsed with ``from_json`` using the definition they were written with
(the change row's ``schema_version``) and mapped by column id onto the
definition in force at T (``columns``): added columns hold, in older rows, what
the upstream gave the rows that existed when it added them (``restore.fills``:
its DEFAULT, or null when it had none), dropped ones disappear, renamed ones keep their values, retyped ones are cast.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from binlake import errors, tso
from binlake.lake.decoding import decode
from binlake.lake.store.ledger import is_delta
from binlake.lake.store.location import CHANGES, DDL_HISTORY, table_path
from binlake.proto import binlog_pb2
from binlake.restore import columns as C
from binlake.restore import fills as fill_mod

ORDER = ("_ts", "_seq", "_sub")


@dataclasses.dataclass(frozen=True)
class Base:
    """Where a table's rebuild starts: ``frame`` (typed, columns ``cols``) holds its rows
    at ``ts`` (every change with commit_ts <= ts applied); None = no rows."""

    ts: int
    kind: str  # "lake start", "snapshot", "history"
    frame: Any = None
    cols: tuple[C.Column, ...] = ()
    # The Delta table ``frame`` reads, whole and unfiltered (a snapshot's table), so its
    # files may be read without Spark (``stream.base_tables``); "" when ``frame`` is a
    # query (the history tables' rows valid at a ts) or there is none.
    path: str = ""


def load_schema(spark: Any, lake: str, upto_ts: int) -> decode.SchemaHistory:
    """Every table definition of DDLs with commit_ts <= ``upto_ts`` (from ``ddl_history``)."""
    import pyarrow.dataset as pads

    from binlake.lake.store import arrowread

    path = table_path(lake, DDL_HISTORY)
    if not is_delta(spark, path):
        return decode.SchemaHistory()
    # A local lake's history is read here (milliseconds; a Spark job is a second or more).
    rows: Any = arrowread.small_table_rows(path, ("commit_ts", "table_info"), pads.field("commit_ts") <= int(upto_ts))
    if rows is None:
        rows = (spark.read.format("delta").load(path).where(f"commit_ts <= {int(upto_ts)}")
                .select("commit_ts", "table_info").collect())
    return decode.SchemaHistory.from_rows(rows)


def tables_at(schema: decode.SchemaHistory, ts: int, pending: bool = False) -> dict[int, binlog_pb2.TableInfo]:
    """table id -> definition of every table that exists once every transaction with
    commit_ts <= ts committed (tables dropped or truncated by then are absent, and so
    are those whose initial snapshot is still being sent, unless ``pending``: the
    tables that hold rows then, restorable or not)."""
    at = min(ts + 1, tso.MAX_TS)
    out = {}
    for table_id in schema.table_ids():
        if schema.knows(table_id, at) or (pending and schema.defined(table_id, at)):
            out[table_id] = schema.table(table_id, at)
    return out


def created_ts(schema: decode.SchemaHistory, table_id: int) -> int:
    """The commit_ts of the first definition the history holds for ``table_id``."""
    return min(ts for ts, _info in schema.entries_of(table_id))


def versions(schema: decode.SchemaHistory, table_id: int) -> dict[int, binlog_pb2.TableInfo]:
    """schema_version -> definition, for the change rows of ``table_id``."""
    return {info.schema_version: info for _ts, info in schema.entries_of(table_id)}


def select_tables(found: dict[int, binlog_pb2.TableInfo], names: Sequence[str] | None,
                  ts: int, schema: decode.SchemaHistory | None = None,
                  later: Callable[[], decode.SchemaHistory] | None = None) -> dict[int, binlog_pb2.TableInfo]:
    """The tables named ``TABLE`` or ``DB.TABLE`` (as named at ts); every one when None.
    With ``schema`` (the history ``found`` came from), a name whose initial snapshot was
    still being sent at ts is refused saying so, with the ts from which it is restorable
    when ``later()`` (the whole history) holds its marker."""
    if names is None:
        return dict(found)
    out: dict[int, binlog_pb2.TableInfo] = {}
    for name in names:
        db, _, tbl = name.strip().rpartition(".")
        hits = [i for i, info in found.items() if info.name == tbl and (not db or info.db == db)]
        if not hits and schema is not None:
            refuse_pending(schema, name, ts, later)
        if not hits:
            shown = ", ".join(sorted(f"{i.db}.{i.name}" for i in found.values())) or "none"
            raise errors.InvalidArgument(
                f"no table {name!r} exists at commit_ts {ts} (tables then: {shown})")
        if len(hits) > 1:
            raise errors.InvalidArgument(f"table name {name!r} is ambiguous at commit_ts {ts}: give DB.TABLE")
        out[hits[0]] = found[hits[0]]
    return out


def _pending(schema: decode.SchemaHistory, ts: int) -> list[binlog_pb2.TableInfo]:
    """The definitions at ``ts`` of the tables whose initial snapshot is in progress then."""
    return [info for info in tables_at(schema, ts, pending=True).values() if info.snapshot_pending]


def pending_at(schema: decode.SchemaHistory, ts: int,
               later: Callable[[], decode.SchemaHistory] | None = None) -> list[str]:
    """The tables that hold rows at ``ts`` but are not restorable then, their initial
    snapshot being in progress: one line each, ``db.table (why; from which ts it is
    restorable, when ``later()``, the whole history, holds its marker)``, sorted."""
    hits = _pending(schema, ts)
    if not hits:
        return []
    whole = later() if later is not None else None
    out = []
    for info in hits:
        ready = whole.restorable_from(info.db, info.name, ts) if whole is not None else None
        when = (f"restorable from commit_ts {ready} ({tso.format_ts(ready)})" if ready is not None
                else "the lake holds no end of that snapshot yet")
        out.append(f"{info.db}.{info.name} (its initial snapshot was in progress at commit_ts {ts}; {when})")
    return sorted(out)


def refuse_pending(schema: decode.SchemaHistory, name: str, ts: int,
                   later: Callable[[], decode.SchemaHistory] | None = None) -> None:
    """Raise the one-line refusal for table ``name`` (``TABLE`` or ``DB.TABLE``) when its
    initial snapshot was in progress at ``ts``; return when it was not."""
    db, _, tbl = name.strip().rpartition(".")
    hits = [info for info in _pending(schema, ts) if info.name == tbl and (not db or info.db == db)]
    if not hits:
        return
    info = hits[0]
    ready = later().restorable_from(info.db, info.name, ts) if later is not None else None
    when = (f"it is restorable from commit_ts {ready} ({tso.format_ts(ready)}) on" if ready is not None
            else "the lake holds no end of that snapshot yet: restore a later ts once it has been ingested (a "
                 "source restarted with --start now before the snapshot ended never ends it: take it again with "
                 "--start snapshot)")
    raise errors.FailedPrecondition(
        f"table {info.db}.{info.name} is not restorable at commit_ts {ts}: its initial snapshot (binlake source "
        f"--start snapshot) was in progress then; {when}")


def changes_frame(spark: Any, lake: str) -> Any:
    """The ``changes`` table (its Delta snapshot resolved once; filter it per table)."""
    return spark.read.format("delta").load(table_path(lake, CHANGES))


def read_changes(changes: Any, table_id: int, after_ts: int, upto_ts: int) -> Any:
    """The change rows of ``table_id`` with commit_ts in ``(after_ts, upto_ts]``."""
    from pyspark.sql import functions as F

    lo = decode.commit_date(max(after_ts, 0)).isoformat()
    hi = decode.commit_date(upto_ts).isoformat()
    return (changes
            # commit_date first: only the partitions of the range are listed.
            .where(f"commit_date >= DATE'{lo}' AND commit_date <= DATE'{hi}'")
            .where((F.col("commit_ts") > after_ts) & (F.col("commit_ts") <= upto_ts))
            .where(F.col("table_id") == table_id))


def _by_version(version_col: Any, parts: dict[int, Any]) -> Any:
    """CASE schema_version WHEN v THEN parts[v] ... END (null for an unknown version)."""
    from pyspark.sql import functions as F

    expr = None
    for version, value in parts.items():
        expr = F.when(version_col == version, value) if expr is None else expr.when(version_col == version, value)
    return expr


def typed_changes(changes: Any, table_versions: dict[int, binlog_pb2.TableInfo], out: Sequence[C.Column],
                  key: Sequence[str], fills: dict[int, dict[int, fill_mod.Fill]] | None = None,
                  keep: Sequence[str] = ()) -> Any:
    """Change rows with both images typed onto ``out`` (the definition asked for): columns
    ``commit_ts, seq, op, keys, _bk`` (the before image's key text), ``keep``, and the
    structs ``_before``/``_after`` of ``out``'s columns (their fields null where the row
    has no such image). ``key`` names the primary-key columns in ``out``; ``fills``
    (``fills.version_fills``): per schema version, what its images read for the columns
    added after it.

    One pass over the rows whatever the number of schema versions: each image is
    parsed once, with the schema of its own version (a CASE on ``schema_version``
    in a projection of its own, which Spark does not inline into every column)."""
    from pyspark.sql import functions as F

    if not table_versions:
        raise ValueError("no table definition to read the change rows with")
    by_name = {c.name: c for c in out}
    key_ids = [by_name[k].id for k in key]
    ver = F.col("schema_version")
    parsed_after: dict[int, Any] = {}
    parsed_before: dict[int, Any] = {}
    before_key: dict[int, Any] = {}
    for version, info in sorted(table_versions.items()):
        parsed_after[version] = F.from_json(F.col("after"), C.image_schema(info))
        parsed_before[version] = F.from_json(F.col("before"), C.image_schema(info))
        # The before image's key as the ingest writes keys (canonical JSON, sorted
        # names): an update whose text differs moved the row. A false difference only
        # adds a delete that the update's own upsert then overrides.
        names = {c.id: c for c in info.columns}
        src_key = sorted((names[i] for i in key_ids if i in names), key=lambda c: c.name)
        key_schema = "struct<" + ", ".join(f"`{c.name}`: {C.json_type(c.type)}" for c in src_key) + ">"
        before_key[version] = F.to_json(F.from_json(F.col("before"), key_schema))
    # One parsed column per version (their struct types differ), null for other versions.
    staged = changes.select(
        "commit_ts", "seq", "op", "keys", "schema_version", *keep,
        *[F.when(ver == v, e).alias(f"_a{v}") for v, e in parsed_after.items()],
        *[F.when(ver == v, e).alias(f"_b{v}") for v, e in parsed_before.items()],
        _by_version(ver, before_key).alias("_bk"))

    def image(prefix: str) -> Any:
        return F.struct(*[_by_version(ver, {v: C.typed_field(F.col(f"{prefix}{v}"), info, c, (fills or {}).get(v))
                                            for v, info in table_versions.items()}).alias(c.name) for c in out])

    return staged.select("commit_ts", "seq", "op", "keys", "_bk", *keep, image("_b").alias("_before"),
                         image("_a").alias("_after"))


def key_events(typed: Any, out: Sequence[C.Column], befores: bool = False) -> Any:
    """Key events (see the module doc) of ``typed_changes`` rows: ``out`` columns plus
    ``_ts, _seq, _sub, _del`` and ``_op``. ``befores``: every update also yields its
    before image as a delete event of its key (sub 0), moved or not, so the first
    event of a key says what the key held before the rows (undo's pre-images); an
    upsert right after it, in the same change, still wins any fold by the last event."""
    from pyspark.sql import functions as F

    moved = (F.col("op") == "delete") | ((F.col("op") == "update") & (F.col("keys") != F.col("_bk")))
    if befores:
        moved = F.col("op") != "insert"
    pair = F.array(
        F.struct(*[F.col("_before").getField(c.name).alias(c.name) for c in out], F.lit(0).alias("_sub"),
                 F.lit(True).alias("_del"), F.lit("delete").alias("_op"), moved.alias("_keep")),
        F.struct(*[F.col("_after").getField(c.name).alias(c.name) for c in out], F.lit(1).alias("_sub"),
                 F.lit(False).alias("_del"), F.col("op").alias("_op"), (F.col("op") != "delete").alias("_keep")),
    )
    return (typed.select(F.col("commit_ts").alias("_ts"), F.col("seq").alias("_seq"), F.explode(pair).alias("_e"))
            .where(F.col("_e._keep"))
            .select(*[F.col("_e").getField(c.name).alias(c.name) for c in out], "_ts", "_seq", "_e._sub", "_e._del",
                    "_e._op"))


def events(changes: Any, table_versions: dict[int, binlog_pb2.TableInfo], out: Sequence[C.Column],
           key: Sequence[str], fills: dict[int, dict[int, fill_mod.Fill]] | None = None) -> Any:
    """Key events of change rows (see the module doc): ``out`` columns typed, plus
    ``_ts, _seq, _sub, _del`` and ``_op``. ``key`` names the primary-key columns in ``out``.
    ``fills`` (``fills.version_fills``): per schema version, what its images read for the
    columns added after it (``typed_changes`` then ``key_events``)."""
    return key_events(typed_changes(changes, table_versions, out, key, fills), out)


def base_events(base: Base, out: Sequence[C.Column], fills: dict[int, fill_mod.Fill] | None = None) -> Any:
    """The base's rows as events; ``fills`` (``fills.base_fills``): what its rows read for
    columns added after it."""
    from pyspark.sql import functions as F

    return base.frame.select(
        *C.typed_columns(base.cols, out, fills), F.lit(base.ts).cast("long").alias("_ts"), F.lit(-1).alias("_seq"),
        F.lit(0).alias("_sub"), F.lit(False).alias("_del"), F.lit("base").alias("_op"))


def last_per_key(evts: Any, out: Sequence[C.Column], key: Sequence[str]) -> Any:
    """Per key, the last event's row; keys whose last event is a delete are dropped."""
    return _present(_last_events(evts, out, key), out, key)


def _last_events(evts: Any, out: Sequence[C.Column], key: Sequence[str]) -> Any:
    """Per key (its columns), the last event's other columns and ``_del``, as ``_last``."""
    from pyspark.sql import functions as F

    rest = [c.name for c in out if c.name not in key]
    value = F.struct(*[F.col(f"`{n}`") for n in rest], F.col("_del"))
    order = F.struct(*[F.col(n) for n in ORDER])
    return evts.groupBy(*[F.col(f"`{k}`") for k in key]).agg(F.max_by(value, order).alias("_last"))


def _present(last: Any, out: Sequence[C.Column], key: Sequence[str]) -> Any:
    """The rows of ``_last_events`` whose last event is not a delete, as ``out``'s columns."""
    from pyspark.sql import functions as F

    return (last.where(~F.col("_last._del"))
            .select(*[F.col(f"`{c.name}`") if c.name in key else F.col("_last").getField(c.name).alias(c.name)
                      for c in out]))


def state_at(spark: Any, changes: Any, schema: decode.SchemaHistory, table_id: int, ts: int, base: Base) -> Any:
    """The typed rows of ``table_id`` at commit_ts ``ts`` (a lazy DataFrame with the
    columns of the definition in force at ts, in definition order). ``changes``:
    ``changes_frame(spark, lake)``."""
    rows = read_changes(changes, table_id, base.ts, ts) if base.ts < ts else None
    return state_from(spark, rows, schema, table_id, ts, base)


def state_from(spark: Any, rows: Any, schema: decode.SchemaHistory, table_id: int, ts: int, base: Base,
               final: bool = False) -> Any:
    """``state_at`` from ``rows``: change rows of ``table_id`` with commit_ts in
    ``(base.ts, ts]`` already selected (the table's slice of a shared scan, or
    ``read_changes``); None when there are none to read. ``final``: ``rows`` are
    already the table at ``ts`` (inserts only, one per key, no base rows), so they
    are only typed, with no aggregation."""
    from pyspark.sql import functions as F

    info = schema.table(table_id, min(ts + 1, tso.MAX_TS))
    out = C.columns_of(info)
    key = C.key_names(info)
    if not key:
        raise errors.FailedPrecondition(f"table {info.db}.{info.name} has no primary key: rows cannot be keyed")
    if final and rows is not None:
        if base.frame is not None:
            raise ValueError("final rows cannot have a base with rows")
        return (events(rows, versions(schema, table_id), out, key, fill_mod.version_fills(schema, table_id))
                .where(~F.col("_del"))
                .select(*[F.col(f"`{c.name}`") for c in out]))
    if base.frame is not None and (rows is None or base.ts >= ts):
        # The base alone: its rows are the table at its ts, one per key, so only typed (no
        # aggregation over every row).
        return base_events(base, out, fill_mod.base_fills(schema, table_id, base.ts)).select(
            *[F.col(f"`{c.name}`") for c in out])
    if rows is None or base.ts >= ts:
        return spark.createDataFrame([], ", ".join(f"`{c.name}` {c.spark_type()}" for c in out))
    evts = events(rows, versions(schema, table_id), out, key, fill_mod.version_fills(schema, table_id))
    if base.frame is None:
        return last_per_key(evts, out, key)
    return patched(base_events(base, out, fill_mod.base_fills(schema, table_id, base.ts)), evts, out, key)


def patched(base_rows: Any, evts: Any, out: Sequence[C.Column], key: Sequence[str]) -> Any:
    """The base's rows (``base_events``) with the change events after it (``events``)
    applied: per key the last change event, deleted or not, reduced among the change
    events alone; the base's rows of the keys with none kept as they are, by an
    anti-join; then the changed keys' rows not deleted. Every change event comes after
    the base's rows, so this is ``last_per_key`` of both, without shuffling the base's
    rows into an aggregation (Spark broadcasts the changed keys when they are few: a
    day's changes against a snapshot)."""
    last = _last_events(evts, out, key)
    changed = last.select(*[f"`{k}`" for k in key])
    kept = base_rows.select(*[f"`{c.name}`" for c in out]).join(changed, list(key), "left_anti")
    return kept.unionByName(_present(last, out, key))
