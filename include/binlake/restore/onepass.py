"""One pass over the change table for every table of a restore, snapshot or history run.

Rebuilding each table from its own filter of ``changes`` makes every table a
Spark job that scans the lake again: the cost grows with tables x lake size.
Here the lake is read once per run instead:

``last_changes`` reads ``changes`` once for every chosen table (each with its
own ``(after_ts, upto_ts]`` range: its base and T) and keeps, per (table, key),
only the last event, as a change row: an ``insert`` carrying the image the key
holds at T, or a ``delete`` carrying the image it had before it went away
(kept only for tables whose base has rows a delete must remove). Keys are the
key columns' *text* in the image JSON (parsed as ``map<string,string>``, in
primary-key order, so renamed key columns keep their keys); the typed rebuild
(``rebuild.state_from``) then runs over a table's slice of this result, which
holds one row per key, and groups by the typed key again - so two texts of one
typed key (a retyped key column) still resolve to the later event. The result
is materialized once (``materialize``: a local checkpoint in key-range
partitions of a bounded number of rows, each table's rows contiguous, or as
the aggregation left it when no table streams through the driver), so no
later job reads the lake and no partition grows with a table.

``each_table`` runs the per-table writes (Delta tables, target loads) on a
bounded pool of threads: Spark runs their jobs concurrently and a database
load waits on I/O, not on the other tables.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from binlake.lake.decoding import decode
from binlake.restore import rebuild

DEFAULT_PARALLELISM = 4
MAX_PARALLELISM = 64
T = TypeVar("T")
R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class Slice:
    """What one table needs from the shared scan: its change rows with commit_ts in
    ``(after_ts, upto_ts]``; ``deletes``: whether a key's last delete must be kept
    (the table's base has rows it removes)."""

    table_id: int
    after_ts: int
    upto_ts: int
    deletes: bool
    base_rows: bool = False

    @property
    def final(self) -> bool:
        """The slice's rows are the table at upto_ts: one insert per key, no base rows."""
        return not self.deletes and not self.base_rows


def slice_for(schema: decode.SchemaHistory, table_id: int, ts: int, base: rebuild.Base) -> Slice:
    """The slice a rebuild of ``table_id`` at ``ts`` from ``base`` reads. Deletes are kept
    when the base has rows, or when a key column's type changed (its JSON text may
    change with it, so a later delete can sit under another text of the same key)."""
    key_types = {tuple((c.id, c.type, c.sql_type) for c in info.columns if c.id in set(info.primary_key))
                 for info in rebuild.versions(schema, table_id).values()}
    return Slice(table_id, base.ts, ts, base.frame is not None or len(key_types) > 1, base.frame is not None)


def check_parallelism(value: Any) -> int:
    """``value`` as a number of concurrent table writes (1..MAX_PARALLELISM)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARALLELISM:
        raise ValueError(f"parallelism must be an integer from 1 to {MAX_PARALLELISM}, got {value!r}")
    return value


def _specs(spark: Any, schema: decode.SchemaHistory, slices: Sequence[Slice]) -> Any:
    """(table_id, schema_version) -> the slice's bounds and the key column names of that
    version in the primary-key order of the definition at the slice's upto_ts."""
    from binlake import tso

    rows = []
    for s in slices:
        at = schema.table(s.table_id, min(s.upto_ts + 1, tso.MAX_TS))
        for version, info in rebuild.versions(schema, s.table_id).items():
            names = {c.id: c.name for c in info.columns}
            # The change rows' ``keys`` hold the version's own key columns: they carry the
            # key at ts when that key is made of them (always, unless the key changed).
            keys_hold = set(at.primary_key) <= set(info.primary_key)
            rows.append((s.table_id, version, s.after_ts, s.upto_ts, [names.get(i) for i in at.primary_key],
                         s.deletes, keys_hold))
    return spark.createDataFrame(rows, "table_id long, schema_version long, _after long, _upto long, "
                                       "_pk array<string>, _deletes boolean, _keys_hold boolean")


def last_changes(spark: Any, changes: Any, schema: decode.SchemaHistory, slices: Sequence[Slice]) -> Any:
    """The last change per (table, key) of every slice, as change rows (see the module
    doc): columns table_id, commit_ts, seq, op, keys, before, after, schema_version."""
    from pyspark.sql import functions as F

    if not slices:
        raise ValueError("no table to read: slices is empty")
    lo = min(s.after_ts for s in slices)
    hi = max(s.upto_ts for s in slices)
    ids = sorted({s.table_id for s in slices})
    rows = (changes
            # commit_date first: only the partitions of the range are listed.
            .where(f"commit_date >= DATE'{decode.commit_date(max(lo, 0)).isoformat()}' "
                   f"AND commit_date <= DATE'{decode.commit_date(hi).isoformat()}'")
            .where((F.col("commit_ts") > lo) & (F.col("commit_ts") <= hi) & F.col("table_id").isin(ids))
            .join(F.broadcast(_specs(spark, schema, slices)), ["table_id", "schema_version"])
            .where((F.col("commit_ts") > F.col("_after")) & (F.col("commit_ts") <= F.col("_upto"))))
    text = "map<string,string>"
    # Key texts are read from the small ``keys`` column where it holds them (the after
    # image's key for an insert or update, the before image's for a delete), not by
    # parsing whole images: only an update's before image is parsed, to see whether
    # its key moved. The text of a value is the same in both: one canonical encoder.
    keys_hold = F.col("_keys_hold") & F.col("keys").isNotNull()
    after_key = F.when(keys_hold & (F.col("op") != "delete"), F.col("keys")).otherwise(F.col("after"))
    before_key = F.when(keys_hold & (F.col("op") == "delete"), F.col("keys")).otherwise(F.col("before"))
    staged = rows.select("table_id", "commit_ts", "seq", "op", "schema_version", "before", "after", "_deletes",
                         F.transform("_pk", lambda n: F.try_element_at(F.from_json(before_key, text), n)).alias("_bk"),
                         F.transform("_pk", lambda n: F.try_element_at(F.from_json(after_key, text), n)).alias("_ak"))
    # An update is a delete of its before key (only when the key moved) then an upsert
    # of its after key; _sub orders the two inside one change, as rebuild.events does.
    moved = (F.col("op") == "delete") | ((F.col("op") == "update") & (F.col("_bk") != F.col("_ak")))
    pair = F.array(
        F.struct(F.col("_bk").alias("k"), F.lit(0).alias("sub"), F.lit(True).alias("del"),
                 F.col("before").alias("image"), moved.alias("keep")),
        F.struct(F.col("_ak").alias("k"), F.lit(1).alias("sub"), F.lit(False).alias("del"),
                 F.col("after").alias("image"), (F.col("op") != "delete").alias("keep")))
    evts = (staged.select("table_id", "commit_ts", "seq", "schema_version", "_deletes", F.explode(pair).alias("e"))
            .where(F.col("e.keep")))
    value = F.struct("commit_ts", "seq", F.col("e.sub").alias("sub"), F.col("e.del").alias("del"),
                     "schema_version", F.col("e.image").alias("image"))
    last = (evts.groupBy("table_id", "_deletes", F.col("e.k").alias("_k"))
            .agg(F.max_by(value, F.struct("commit_ts", "seq", F.col("e.sub"))).alias("l"))
            .select("table_id", "_deletes", "_k", "l.*"))
    # A key whose last event is a delete is dropped here unless the slice keeps deletes
    # (base rows to remove, or a key column whose text changed with its type).
    return last.where(~F.col("del") | F.col("_deletes")).select(
        "table_id", "commit_ts", "seq", F.when(F.col("del"), "delete").otherwise("insert").alias("op"),
        F.lit(None).cast("string").alias("keys"),
        F.when(F.col("del"), F.col("image")).alias("before"), F.when(~F.col("del"), F.col("image")).alias("after"),
        "schema_version", F.xxhash64("_k").alias("key_hash"))


# The order of ``last_changes``' rows in a materialized result: by table, then by
# key (its hash), so a table's rows are contiguous and a big table spans partitions.
KEY_ORDER = ("table_id", "key_hash")


def materialize(spark: Any, frame: Any, order: Sequence[str] = KEY_ORDER) -> Any:
    """``materialize_sized``'s frame alone."""
    return materialize_sized(spark, frame, order)[0]


def materialize_sized(spark: Any, frame: Any, order: Sequence[str] = KEY_ORDER
                      ) -> tuple[Any, dict[int, tuple[int, int]]]:
    """``frame`` computed once (one pass over what it reads) and kept for the per-table
    jobs that follow (a local checkpoint: lineage cut, so no later job plans or reads
    the lake again), in partitions of at most about ``[memory] partition_rows`` rows
    and ``partition_bytes`` bytes of images, sorted by ``order`` (table_id first).

    Why ranges and not one partition per table: a partition is what one task holds
    and what streams through the driver at a time (``toLocalIterator``), so its size
    must be a setting, not a table's. Range partitions keep each table's rows
    contiguous across consecutive partitions: the driver reads the result as one
    ordered stream, table after table, in bounded pieces. Returned with its ``sizes``
    (counted once here, for the callers' choices too).

    When no table of the result is ``streamable`` (so none goes through the driver)
    and the first checkpoint's partitions are already within the bounds, that
    checkpoint is the result as it is, unordered: the per-table jobs filter it by
    table and rebuild in the executors, and the second shuffle and checkpoint of
    every image would only cost time."""
    from pyspark.storagelevel import StorageLevel

    from binlake import config
    from binlake.lake.sparkenv import connect

    bounds = config.memory()
    # On disk, not in memory: the checkpoint would otherwise take the storage share of a
    # heap the shuffles and writes that follow need (a cached block is read back
    # streaming; the job's memory stays what its tasks hold).
    staged = frame.localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY)
    found = sizes(staged)
    total, nbytes = sum(n for n, _b in found.values()), sum(b for _n, b in found.values())
    # As many partitions as the data needs; a small job leaves the session's shuffles alone.
    needed = max(-(-total // bounds.partition_rows), -(-nbytes // bounds.partition_bytes_in_force()))
    fit_shuffles(spark, needed, bounds.partition_bytes_in_force())
    if not any(streamable(n, b) for n, b in found.values()) and within_bounds(widest_partition(staged)):
        # No table small enough to be streamed through this process (the only reader that
        # needs each table's rows contiguous and in order), and every partition already
        # within the bounds: the per-table jobs read this as it is, without a second
        # shuffle and checkpoint of every image.
        return staged, found
    if within_bounds((total, nbytes)):
        # Small: the whole result is within one partition's bounds already. One partition
        # (not one per table): each partition is a job of the driver's ordered stream
        # (``toLocalIterator``) and a task of every per-table job, empty or not.
        shaped = staged.repartition(1)
    else:
        # The server's parallelism on a Spark Connect session (which has no sparkContext).
        parts = max(2, 2 * connect.default_parallelism(spark), needed)
        shaped = staged.repartitionByRange(parts, *order)
    out = shaped.sortWithinPartitions(*order).localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY)
    return out, found


def streamable(rows: int, nbytes: int) -> bool:
    """Whether a table of ``rows`` rows and ``nbytes`` bytes of images is small enough to be
    decoded in this process (``[memory] direct_rows`` and ``partition_bytes``): the tables
    a restore or a snapshot streams through the driver instead of rebuilding in Spark."""
    from binlake import config

    bounds = config.memory()
    return rows <= bounds.direct_rows and nbytes <= bounds.partition_bytes_in_force()


def within_bounds(partition: tuple[int, int]) -> bool:
    """Whether a partition of (rows, bytes of images) is within ``[memory] partition_rows``
    and ``partition_bytes``."""
    from binlake import config

    bounds = config.memory()
    rows, nbytes = partition
    return rows <= bounds.partition_rows and nbytes <= bounds.partition_bytes_in_force()


def widest_partition(shared: Any) -> tuple[int, int]:
    """The most rows and the most bytes of images of any one partition of ``shared`` (one
    small aggregate job; each figure may come from a different partition)."""
    from pyspark.sql import functions as F

    per = shared.groupBy(F.spark_partition_id().alias("_p")).agg(
        F.count(F.lit(1)).alias("n"), F.sum(_image_bytes(shared)).alias("b"))
    row = per.agg(F.max("n").alias("n"), F.max("b").alias("b")).collect()[0]
    return int(row["n"] or 0), int(row["b"] or 0)


def _image_bytes(shared: Any) -> Any:
    from pyspark.sql import functions as F

    return sum((F.coalesce(F.length(c), F.lit(0)) for c in ("before", "after") if c in shared.columns), F.lit(0))


def fit_shuffles(spark: Any, parts: int, part_bytes: int) -> None:
    """The session's shuffles (the typed rebuilds' and history's aggregations that follow)
    sized like the shared result: at least ``parts`` partitions, and AQE coalescing them
    to at most ``part_bytes`` each. Only ever raised: with Spark's sort-based aggregation
    and a small heap, a task's share of wide rows must stay small (each spill it makes
    costs a reader buffer when merged)."""
    conf = spark.conf
    if int(conf.get("spark.sql.shuffle.partitions") or 200) < parts:
        conf.set("spark.sql.shuffle.partitions", str(parts))
    advisory = str(conf.get("spark.sql.adaptive.advisoryPartitionSizeInBytes") or "64m").strip().lower()
    units = {"b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30}
    number = advisory.rstrip("kmgb")
    current = int(number) * units.get(advisory[len(number):] or "b", 1) if number.isdigit() else 64 << 20
    if current > part_bytes:
        conf.set("spark.sql.adaptive.advisoryPartitionSizeInBytes", str(part_bytes))


def sizes(shared: Any) -> dict[int, tuple[int, int]]:
    """table_id -> (rows, bytes of row images) in a materialized result (one small
    aggregate job); a frame without images counts their bytes as 0."""
    from pyspark.sql import functions as F

    found = shared.groupBy("table_id").agg(F.count(F.lit(1)).alias("n"),
                                           F.sum(_image_bytes(shared)).alias("b")).collect()
    return {int(r["table_id"]): (int(r["n"]), int(r["b"] or 0)) for r in found}


def of_table(shared: Any, table_id: int) -> Any:
    """One table's rows of a materialized shared result."""
    from pyspark.sql import functions as F

    return shared.where(F.col("table_id") == table_id)


def of_tables(shared: Any, table_ids: Sequence[int]) -> Any:
    """The rows of ``table_ids`` of a materialized shared result, grouped by table."""
    from pyspark.sql import functions as F

    return shared.where(F.col("table_id").isin(list(table_ids)))


def grouped(rows: Iterable[Any]) -> Iterator[tuple[int, list[Any]]]:
    """(table_id, rows) runs of rows that arrive grouped by table_id (``materialize``
    keeps each table's rows contiguous). The callers stream only tables of at most
    ``[memory] direct_rows`` rows through here: a run is one table's list."""
    current: int | None = None
    batch: list[Any] = []
    for r in rows:
        tid = int(r["table_id"])
        if tid != current:
            if current is not None:
                yield current, batch
            current, batch = tid, []
        batch.append(r)
    if current is not None:
        yield current, batch


def each_table(items: Iterable[T], work: Callable[[T], R], parallelism: int) -> list[R]:
    """``work(item)`` for every item on ``parallelism`` threads, results in item order.
    Items are drawn lazily (at most twice ``parallelism`` wait in the pool, so a
    producer streaming them holds few in memory). The first failure stops new work,
    waits for the running items and is raised; each item is all-or-nothing on its
    own, so a failure leaves the items already done as written."""
    check_parallelism(parallelism)
    if parallelism == 1:
        return [work(i) for i in items]
    results: dict[int, R] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="binlake-table") as pool:
        pending: dict[concurrent.futures.Future[R], int] = {}

        def drain(until: int) -> None:
            while len(pending) > until:
                done, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for f in done:
                    index = pending.pop(f)
                    if f.exception() is not None:
                        for other in pending:
                            other.cancel()
                        concurrent.futures.wait(pending)
                        raise f.exception()  # type: ignore[misc]
                    results[index] = f.result()

        for index, item in enumerate(items):
            drain(2 * parallelism - 1)
            pending[pool.submit(work, item)] = index
        drain(0)
    return [results[i] for i in range(len(results))]
