"""A typed table streamed out of Spark into a target database, in bounded pieces.

A restore into a database passes every row through one connection, so through
the process that holds it; what that process holds at a time must be a
setting, never a table. Two forms, both partition by partition
(``toLocalIterator``: one partition in the driver at a time, the next one
prefetched):

- ``arrow_tables``: the executors turn their rows into Arrow record batches of
  at most ``[memory] batch_rows`` rows and ship each as one Arrow IPC message;
  this process only reads the messages and hands each batch to the target's
  ``insert_arrow`` (PostgreSQL: ``COPY`` as CSV written by Arrow). No Python
  object per row. For tables whose every column Arrow writes as the target
  reads it (``arrow_ready``: numbers, text, decimals, dates and datetimes);
- ``python_rows``: the rows as the Python values ``binlake.codec`` uses, for
  the other column types (times, bytes, JSON), one at a time.

``bounded`` sizes a frame's partitions first when they come from a shuffle
(an aggregating rebuild), whose partitions would otherwise grow with the table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from binlake.proto import binlog_pb2
from binlake.restore import columns as C
from binlake.restore import rebuild

log = logging.getLogger(__name__)

# Column types whose Spark value, as Arrow, is what a target's ``insert_arrow``
# takes: integers, strings, doubles, booleans, decimals as their exact text, and
# dates and datetimes as Arrow's date32 and timestamp[us] (Spark's date and
# timestamp_ntz): PostgreSQL's COPY reads Arrow's CSV text of them, DuckDB the
# arrays, and the other targets the ``datetime.date``/``datetime`` values of
# ``to_pylist``, which are what ``binlake.codec`` decodes. Times (text in Spark),
# bytes and JSON documents need a conversion per value, so they go as rows.
_ARROW_READY = frozenset({binlog_pb2.INT, binlog_pb2.UINT, binlog_pb2.STRING, binlog_pb2.FLOAT,
                          binlog_pb2.DECIMAL, binlog_pb2.BOOL, binlog_pb2.DATE, binlog_pb2.DATETIME})


# The most bytes of one Arrow IPC message ``arrow_tables`` ships (a few MB: large
# enough to cost nothing per message, small against the driver's heap).
BLOB_BYTES = 4 << 20


def bounded(df: Any, rows: int, nbytes: int) -> Any:
    """``df`` (about ``rows`` rows of about ``nbytes`` bytes) in partitions of at most about
    ``[memory] partition_rows`` rows and ``partition_bytes`` bytes: what streaming it
    through this process holds at a time."""
    from binlake import config

    for name, value in (("rows", rows), ("nbytes", nbytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a count (0 or more), got {value!r}")
    bounds = config.memory()
    parts = max(-(-rows // bounds.partition_rows), -(-nbytes // bounds.partition_bytes_in_force()))
    return df if parts <= 1 else df.repartition(parts)


def python_rows(df: Any, info: binlog_pb2.TableInfo) -> Iterator[dict[str, Any]]:
    """The rows of a typed frame as the Python values ``binlake.codec`` uses (what sinks
    load), streamed partition by partition (one partition in the driver at a time)."""
    cols = C.columns_of(info)
    for r in df.select(*[f"`{c.name}`" for c in cols]).toLocalIterator(prefetchPartitions=True):
        yield {c.name: C.python_value(r[i], c.type) for i, c in enumerate(cols)}


def arrow_ready(info: binlog_pb2.TableInfo) -> bool:
    """Whether every column of ``info`` streams as Arrow (``arrow_tables``)."""
    return all(c.type in _ARROW_READY for c in info.columns)


def arrow_tables(df: Any, info: binlog_pb2.TableInfo) -> Iterator[pa.Table]:
    """The rows of a typed frame as Arrow tables of at most ``[memory] batch_rows`` rows,
    columns named and typed as ``insert_arrow`` takes them (decimals as text)."""
    if not arrow_ready(info):
        raise ValueError(f"table {info.db}.{info.name} has columns Arrow cannot load as they are: use python_rows")
    for table in arrow_batches(df, [c.name for c in C.columns_of(info)]):
        yield as_inserted(table)


def arrow_batches(df: Any, names: Sequence[str]) -> Iterator[pa.Table]:
    """Columns ``names`` of a frame's rows as Arrow tables of at most ``[memory]
    batch_rows`` rows, typed as Spark's Arrow conversion types them."""
    from binlake import config

    per = config.memory().batch_rows

    # Runs in the Python workers: each batch of the partition becomes one IPC message.
    # Nested (pickled by value): the workers need pyarrow only, not binlake.
    def pack(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            # At most ``per`` rows and about BLOB_BYTES a message: one message is one
            # value in the driver JVM, which copies it while handing it over.
            step = max(1, min(per, BLOB_BYTES * batch.num_rows // max(1, batch.nbytes)))
            for start in range(0, batch.num_rows, step):
                piece = batch.slice(start, step)
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, piece.schema) as writer:
                    writer.write_batch(piece)
                yield pa.RecordBatch.from_pydict({"ipc": [sink.getvalue().to_pybytes()]},
                                                 schema=pa.schema([("ipc", pa.binary())]))

    packed = df.select(*[f"`{n}`" for n in names]).mapInArrow(pack, "ipc binary")
    for row in packed.toLocalIterator(prefetchPartitions=True):
        yield pa.ipc.open_stream(row["ipc"]).read_all()


def as_inserted(table: pa.Table) -> pa.Table:
    """``table`` as ``insert_arrow`` takes it: decimals as their exact text."""
    if not any(pa.types.is_decimal(f.type) for f in table.schema):
        return table
    return pa.table({f.name: table.column(f.name).cast(pa.string()) if pa.types.is_decimal(f.type)
                     else table.column(f.name) for f in table.schema})


def base_tables(base: rebuild.Base, info: binlog_pb2.TableInfo, fills: Mapping[int, Any]) -> Iterator[pa.Table] | None:
    """The rows of ``base`` read from its Delta files in this process (delta-rs and
    Arrow's Parquet reader, no Spark job), as Arrow tables of at most ``[memory]
    batch_rows`` rows for ``insert_arrow``; None when they must go through Spark, or,
    for a table with columns Arrow does not load as they are, through ``base_rows``.

    For a restore at a snapshot's own ts, the table is the snapshot's rows as they
    are. Through Spark they would be read in the JVM, sent to a Python worker,
    packed, and sent again through the driver JVM to this process, which measured
    about 4x the time of PostgreSQL's own COPY of the rows. Here they cost a Parquet
    read. Only when nothing is to be done to them: a base that is a whole Delta table
    (``base.path``) holding every column of ``info`` (the definition at T) under its
    name and Spark type, none to fill (``fills``: ``fills.base_fills``), every one a
    type Arrow loads as it is (``arrow_ready``), and a table delta-rs reads."""
    if not arrow_ready(info):
        return None
    batches = _base_batches(base, info, fills)
    return None if batches is None else (as_inserted(pa.Table.from_batches([b])) for b in batches)


def base_rows(base: rebuild.Base, info: binlog_pb2.TableInfo, fills: Mapping[int, Any]
              ) -> Iterator[dict[str, Any]] | None:
    """``base_tables`` for a table with columns Arrow does not load as they are (bytes,
    JSON documents, times): the rows as the Python values ``binlake.codec`` uses, read
    a batch of ``[memory] batch_rows`` rows at a time; None when they must go through
    Spark."""
    batches = _base_batches(base, info, fills)
    if batches is None:
        return None
    cols = C.columns_of(info)
    return (row for batch in batches for row in python_rows_of(batch, cols))


def python_rows_of(table: pa.Table | pa.RecordBatch, cols: Sequence[C.Column]) -> Iterator[dict[str, Any]]:
    """The rows of ``table``'s columns ``cols`` as the Python values ``binlake.codec``
    uses (column name -> value)."""
    names = [c.name for c in cols]
    values = [[C.python_value(v, c.type) for v in table.column(c.name).to_pylist()] for c in cols]
    return (dict(zip(names, row, strict=True)) for row in zip(*values, strict=True))


def _base_batches(base: rebuild.Base, info: binlog_pb2.TableInfo, fills: Mapping[int, Any]
                  ) -> Iterator[pa.RecordBatch] | None:
    """The record batches of ``base``'s files with the columns of ``info`` in its order
    (see ``base_tables``: when nothing is to be done to them), or None."""
    from binlake import config
    from binlake.lake.store import arrowread

    if base.frame is None or not base.path or fills:
        return None
    by_id = {c.id: c for c in base.cols}
    out = C.columns_of(info)
    for col in out:
        src = by_id.get(col.id)
        if src is None or src.name != col.name or src.spark_type() != col.spark_type():
            return None  # renamed, retyped or added since: typed by Spark (rebuild.base_events)
    try:
        batches = arrowread.TableReader(base.path).batches([c.name for c in out], config.memory().batch_rows)
    except arrowread.NotReadable as exc:
        log.info("reading %s through Spark: %s", base.path, exc)
        return None
    return (b for b in batches if b.num_rows)
