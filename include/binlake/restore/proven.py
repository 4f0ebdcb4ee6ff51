"""The whole history of a table as a checksum, without rebuilding it: what proves each
snapshot when it is taken, and what a drill compares a restore with.

A table's checksum (``sparksum``: the rows' hashes summed mod 2^64 and XORed) is a
sum over its rows, so it can be reached from the change rows alone: every after
image counted +1 and every before image -1. The lake's before image of a change is
the after image of the key's previous change (full row images, ``decoding.rows``),
so each row version is added once and taken away once, except the ones alive at T:

    whole(T) = sum of h(after) - sum of h(before), over the changes with commit_ts <= T

(the XOR telescopes the same way). No grouping by key, no ordering of the changes:
one streaming pass, independent of the last-image-per-key rebuild (``onepass``,
``rebuild.last_per_key``) that restores and snapshots run. A lost change, a changed
image or a before image that does not follow its key's previous after image leaves
terms that do not cancel: the sum then differs from the rebuilt table.

Summing from the lake's start every time would read the whole history. A snapshot
cuts it: **when a snapshot is taken, each of its tables (as read back once written)
is compared with the whole history at its ts** - the previous proven snapshot's
recorded sum plus the changes between the two, or the changes from the lake's
start - and the sum is recorded in the snapshot's catalog row with a digest of the
table's change rows at or below that ts (``changes_rows``/``changes_digest``: the
xxhash64 of each row's stored columns, combined the same way). A table that disagrees
fails the snapshot (no marker: no reader uses it). Invariant of a catalog row with a
``proof_checksum``: the whole history of the table at ``snapshot_ts`` had that
checksum, and its change rows at or below ``snapshot_ts`` had that digest, when the
snapshot was taken; the snapshot's table read back had the same checksum.

A drill then sums only the changes after the newest proven snapshot (``measure``):
whole(T) = recorded sum + the terms of (S, T], valid while the digest of the rows
at or below S still equals the recorded one (a lake damaged below S shows there,
and the drill rebuilds that table's whole history to name the first differing key).
A table whose columns changed since S (the recorded sum renders the old ones) is
summed from the lake's start.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from binlake import tso
from binlake.lake.decoding import decode
from binlake.proto import binlog_pb2
from binlake.restore import columns as C
from binlake.restore import fills as fill_mod
from binlake.restore import rebuild, sparksum
from binlake.sql import checksum

# The stored columns of a change row that its digest covers: everything a restore reads
# (not ``pump``: which replica served a window is not the change).
DIGEST_COLUMNS = ("table_id", "commit_ts", "start_ts", "seq", "op", "keys", "before", "after", "schema_version")

Sum = tuple[int, str, int]  # (rows, checksum, bytes), as sparksum.totals gives them


@dataclasses.dataclass(frozen=True)
class Record:
    """A snapshot table's recorded proof (its catalog row's proof columns)."""

    snapshot_ts: int
    table_id: int
    whole: Sum
    columns: str
    changes: Sum
    chained_from_ts: int


# At most this many change rows in all go through this process (the rest are summed in
# Spark): the stream holds one row at a time, this bounds the time it takes.
DRIVER_TOTAL = 1_000_000


def driver_rows() -> int:
    """``[memory] direct_rows``: a table whose terms in the range are at most this many
    change rows (and whose images decode here as Spark types them: ``driver_ready``) is
    summed in this process, from one stream of every such table's rows, and a snapshot
    table of at most this many rows is read back here. Each table summed in Spark is a
    plan of its own (about a second of planning on two cores), which a lake of a thousand
    small tables cannot pay."""
    from binlake import config

    return config.memory().direct_rows


# The column types whose rendering here is tested to equal Spark's (tests/restore/
# test_drill.py sums the same tables both ways): JSON is not among them (Spark renders
# the document's text in its own form), nor the types no test compares yet.
DRIVER_TYPES = frozenset({binlog_pb2.INT, binlog_pb2.STRING, binlog_pb2.DECIMAL, binlog_pb2.FLOAT,
                          binlog_pb2.DATETIME, binlog_pb2.DATE})


def driver_ready(schema: decode.SchemaHistory, table_id: int, ts: int) -> bool:
    """Whether the table's terms at ``ts`` can be summed in this process: every column of a
    type in ``DRIVER_TYPES``, and every version's columns of the types they have at ts
    (images decode as Spark casts them)."""
    from binlake.restore import direct

    info = schema.table(table_id, min(ts + 1, tso.MAX_TS))
    return all(c.type in DRIVER_TYPES for c in info.columns) and direct.same_types(schema, table_id, ts)


_MASK = (1 << 64) - 1


class _Acc:
    """Signed terms summed in this process, as ``sparksum.totals`` sums them in Spark."""

    __slots__ = ("n", "total", "xor", "nbytes")

    def __init__(self) -> None:
        self.n = self.total = self.xor = self.nbytes = 0

    def add(self, row: Mapping[str, Any], sign: int) -> None:
        text = checksum.portable_row_text(row)
        h = checksum.portable_hash(text)
        self.n += sign
        self.total = (self.total + sign * h) & _MASK
        self.xor ^= h
        self.nbytes += sign * len(text.encode())

    def sum(self) -> Sum:
        return self.n, f"{self.total:016x}{self.xor:016x}", self.nbytes


def table_sum(path: str, info: binlog_pb2.TableInfo) -> Sum | None:
    """The checksum of the typed Delta table at ``path`` (``info``'s columns) computed in
    this process from its Parquet files (``sparksum``'s terms, each row +1), or None when it
    is not readable here (the caller sums it in Spark). For tables of at most
    ``driver_rows()`` rows: it reads the table whole."""
    import pyarrow as pa

    from binlake.lake.store import arrowread

    if any(c.type not in DRIVER_TYPES for c in info.columns):
        return None
    names = [c.name for c in C.columns_of(info)]
    try:
        # Whole: the caller asks only for tables of at most driver_rows() rows.
        rows = arrowread.TableReader(path).read(names).to_pylist()
    except (arrowread.NotReadable, OSError, pa.ArrowException):
        return None  # Spark reads it, and says what is wrong if anything is
    acc = _Acc()
    for row in rows:
        acc.add(row, 1)
    return acc.sum()


def _driver_terms(spark: Any, changes: Any, schema: decode.SchemaHistory,
                  tables: Sequence[tuple[str, int, int, int]]) -> dict[str, Sum]:
    """The telescoped terms of each (name, table_id, lo, hi) summed in this process, from
    one stream of their change rows (a table with no change row in its range: no entry)."""
    from binlake.restore import direct

    rows = _ranged(spark, changes, tables).select("_name", "op", "before", "after", "schema_version")
    readers = {n: direct.image_reader(schema, t, b) for n, t, _a, b in tables}
    accs: dict[str, _Acc] = {}
    for r in rows.toLocalIterator(prefetchPartitions=True):
        name, op, version = r["_name"], r["op"], int(r["schema_version"])
        acc = accs.get(name)
        if acc is None:
            acc = accs[name] = _Acc()
        read = readers[name]
        if op != "delete":
            acc.add(read(version, r["after"]), 1)
        if op != "insert":
            acc.add(read(version, r["before"]), -1)
    return {n: a.sum() for n, a in accs.items()}


def _start_ts(start: Record | None) -> int:
    return start.snapshot_ts if start is not None else 0


def _range_counts(spark: Any, changes: Any, tables: Sequence[tuple[str, int, int, int]]) -> dict[str, int]:
    """How many change rows each (name, table_id, lo, hi) has in (lo, hi] (one Spark job)."""
    found = _ranged(spark, changes, tables).groupBy("_name").count().collect()
    return {str(r["_name"]): int(r["count"]) for r in found}


def _ranged(spark: Any, changes: Any, tables: Sequence[tuple[str, int, int, int]]) -> Any:
    """The change rows of each (name, table_id, lo, hi) with commit_ts in (lo, hi], with
    its name as ``_name`` (one scan for all of them)."""
    from pyspark.sql import functions as F

    lo, hi = min(t[2] for t in tables), max(t[3] for t in tables)
    specs = spark.createDataFrame(list(tables), "_name string, table_id long, _lo long, _hi long")
    return (changes.where(f"commit_date >= DATE'{decode.commit_date(max(lo, 0)).isoformat()}' AND "
                          f"commit_date <= DATE'{decode.commit_date(hi).isoformat()}'")
            .where((F.col("commit_ts") > lo) & (F.col("commit_ts") <= hi)
                   & F.col("table_id").isin(sorted({t[1] for t in tables})))
            .join(F.broadcast(specs), ["table_id"])
            .where((F.col("commit_ts") > F.col("_lo")) & (F.col("commit_ts") <= F.col("_hi"))))


def _in_driver(counts: Mapping[str, int], names: Sequence[str]) -> set[str]:
    """The names (of tables ready for it) summed in this process: each at most
    ``driver_rows()`` rows, smallest first, while their rows add up to at most ``DRIVER_TOTAL``."""
    limit, total = driver_rows(), DRIVER_TOTAL
    chosen, used = set(), 0
    for name in sorted(names, key=lambda n: (counts.get(n, 0), n)):
        n = counts.get(name, 0)
        if n > limit or used + n > total:
            break
        chosen.add(name)
        used += n
    return chosen


def signature(info: binlog_pb2.TableInfo) -> str:
    """What a table's checksum renders of its definition: each column's name, type and SQL
    type, in order. A recorded sum extends to a later ts only under the same signature."""
    return json.dumps([[c.name, int(c.type), c.sql_type] for c in C.columns_of(info)])


def telescoped_parts(changes: Any, schema: decode.SchemaHistory, table_id: int, lo: int, hi: int,
                     name: str) -> Any:
    """The terms of ``table_id``'s changes with commit_ts in ``(lo, hi]``, rendered with the
    definition in force at ``hi``: each after image +1, each before image -1. ``changes``:
    the change table, or rows of it already cut to a range that holds ``(lo, hi]``."""
    from pyspark.sql import functions as F

    info = schema.table(table_id, min(hi + 1, tso.MAX_TS))
    out = C.columns_of(info)
    typed = rebuild.typed_changes(rebuild.read_changes(changes, table_id, lo, hi), rebuild.versions(schema, table_id),
                                  out, C.key_names(info), fill_mod.version_fills(schema, table_id))
    events = rebuild.key_events(typed, out, befores=True)
    return sparksum.signed_parts(name, events, info, F.when(F.col("_del"), F.lit(-1)).otherwise(F.lit(1)))


def digest_parts(spark: Any, changes: Any, asks: Sequence[tuple[str, int, int]]) -> Any:
    """The digest terms of each (name, table_id, upto): the table's change rows with
    commit_ts <= upto (one scan for all of them)."""
    from pyspark.sql import functions as F

    hi = max(u for _n, _t, u in asks)
    ids = sorted({t for _n, t, _u in asks})
    specs = spark.createDataFrame([(n, t, u) for n, t, u in asks], "_name string, table_id long, _upto long")
    rows = (changes.where(f"commit_date <= DATE'{decode.commit_date(hi).isoformat()}'")
            .where((F.col("commit_ts") <= hi) & F.col("table_id").isin(ids))
            .join(F.broadcast(specs), ["table_id"]).where(F.col("commit_ts") <= F.col("_upto")))
    return sparksum.hash_parts(F.col("_name"), F.xxhash64(*[F.col(c) for c in DIGEST_COLUMNS]), rows)


@dataclasses.dataclass(frozen=True)
class Whole:
    """The whole history of one table at ``ts``, by its sum (``measure``)."""

    name: str
    table_id: int
    ts: int
    sum: Sum
    start: Record | None  # the proven snapshot the sum extends (None: summed from the lake's start)
    changes_now: Sum | None  # the digest of the rows at or below start.snapshot_ts now
    changes_at_ts: Sum | None  # the digest of the rows at or below ts (when asked for)

    @property
    def intact(self) -> bool:
        """The rows the recorded sum covers are as they were when it was recorded."""
        return self.start is None or self.changes_now == self.start.changes

    def how(self) -> str:
        if self.start is None:
            return "summed from the lake's start"
        return f"the snapshot at {self.start.snapshot_ts} (proven when taken) plus the changes after it"


def newest_record(records: Mapping[tuple[int, int], Record], table_id: int, info: binlog_pb2.TableInfo,
                  below: int, inclusive: bool = True) -> Record | None:
    """The newest recorded proof of ``table_id`` at or below ``below`` (below it when not
    ``inclusive``) whose definition renders like ``info``."""
    sig = signature(info)
    found = [r for (s, t), r in records.items() if t == table_id and (s <= below if inclusive else s < below)
             and r.columns == sig]
    return max(found, key=lambda r: r.snapshot_ts, default=None)


def measure(spark: Any, lake: str, schema: decode.SchemaHistory, asks: Sequence[tuple[str, int, int]],
            records: Mapping[tuple[int, int], Record], *, inclusive: bool = True, digest_at_ts: bool = False,
            extra: Sequence[Any] = (), driver: bool = True) -> tuple[dict[str, Whole], dict[str, Sum]]:
    """The whole history of each (name, table_id, ts) in ``asks``, from the newest proven
    snapshot of ``records`` at or below its ts (below it when not ``inclusive``), and the
    totals of the ``extra`` terms (other frames' ``sparksum`` parts), in one Spark job (and,
    for the tables summed in this process, one count and one stream of their rows).
    ``digest_at_ts``: also each table's digest of its rows at or below ts (to record).
    ``driver``: small tables ready for it are summed in this process (``driver_rows``),
    the same sums without a Spark plan per table; False: every table in Spark."""
    if not asks:
        return {}, sparksum.totals(list(extra)) if extra else {}
    from pyspark.sql import functions as F
    from pyspark.storagelevel import StorageLevel

    changes = rebuild.changes_frame(spark, lake)
    parts = list(extra)
    starts: dict[str, Record | None] = {}
    digests: list[tuple[str, int, int]] = []
    ranges: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for name, table_id, ts in asks:
        info = schema.table(table_id, min(ts + 1, tso.MAX_TS))
        start = newest_record(records, table_id, info, ts, inclusive)
        starts[name] = start
        ranges.setdefault((start.snapshot_ts if start else 0, ts), []).append((name, table_id))
        if start is not None:
            digests.append((f"d\0{name}", table_id, start.snapshot_ts))
        if digest_at_ts:
            digests.append((f"D\0{name}", table_id, ts))
    # Small tables ready for it are summed here (one stream), the others in Spark.
    spans = {name: (_start_ts(starts[name]), ts) for name, _t, ts in asks}
    ready = [(name, table_id, *spans[name]) for name, table_id, ts in asks
             if driver and driver_ready(schema, table_id, ts)]
    here = _in_driver(_range_counts(spark, changes, ready), [r[0] for r in ready]) if ready else set()
    local = _driver_terms(spark, changes, schema, [r for r in ready if r[0] in here]) if here else {}
    staged = []
    try:
        for (lo, hi), members in sorted(ranges.items()):
            group = [(n, t) for n, t in members if n not in here]
            if not group:
                continue
            rows = changes
            if len(group) > 1:
                # One read of the range for the group's tables (kept on disk, lineage cut), not
                # one scan of the change table per table.
                ids = sorted({t for _n, t in group})
                rows = (changes.where(f"commit_date >= DATE'{decode.commit_date(max(lo, 0)).isoformat()}' AND "
                                      f"commit_date <= DATE'{decode.commit_date(hi).isoformat()}'")
                        .where((F.col("commit_ts") > lo) & (F.col("commit_ts") <= hi) & F.col("table_id").isin(ids))
                        .localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY))
                staged.append(rows)
            parts += [telescoped_parts(rows, schema, table_id, lo, hi, f"w\0{name}") for name, table_id in group]
        if digests:
            parts.append(digest_parts(spark, changes, digests))
        found = sparksum.totals(parts) if parts else {}
        found.update({f"w\0{n}": v for n, v in local.items()})
    finally:
        for rows in staged:
            rows.unpersist()
    out = {}
    for name, table_id, ts in asks:
        start = starts[name]
        terms = found.get(f"w\0{name}", sparksum.EMPTY)
        total = sparksum.combine(start.whole, terms) if start is not None else terms
        out[name] = Whole(name, table_id, ts, total, start,
                          found.get(f"d\0{name}", sparksum.EMPTY) if start is not None else None,
                          found.get(f"D\0{name}", sparksum.EMPTY) if digest_at_ts else None)
    return out, {k: v for k, v in found.items() if not k.startswith(("w\0", "d\0", "D\0"))}


def record_of(row: Mapping[str, Any]) -> Record | None:
    """A catalog row's proof (None: a snapshot taken before snapshots were proven)."""
    if row.get("proof_checksum") is None:
        return None
    return Record(int(row["snapshot_ts"]), int(row["table_id"]),
                  (int(row["proof_rows"]), str(row["proof_checksum"]), int(row["proof_bytes"] or 0)),
                  str(row["proof_columns"]), (int(row["changes_rows"]), str(row["changes_digest"]), 0),
                  int(row["proven_from_ts"] or 0))
