"""Append rows decoded in this process to a local lake's Delta table with delta-rs.

A window's change rows are decoded in the ingest's own process (``ingest``,
``lake.pumps.datasource``'s reader). Handing them to Spark costs a Parquet
round trip (staged files, ``lake.staging``) and then Spark's own read, shuffle
into ``commit_date`` partitions and write: about 95,000 row changes a second on
one local core, the largest part of a big window's ingest (bench/RESULTS.md,
"A window of any size decoded here"). delta-rs writes the same Arrow batches
straight into the table's partitions and commits them in one Delta
transaction: a big window's rows went in about twice as fast, decoding
included, at half the ingest's peak memory (bench/RESULTS.md, "A new window's
rows appended by delta-rs").

What it is used for, and what stays with Spark:

* only **appends** of rows the table cannot hold yet (``ingest._may_append``,
  under the lake's write lock) to a table on this host's file system. Replacing
  a window ingested before, and every write to an S3 lake (whose commits need
  Spark's log store), stay Spark's;
* the table keeps Spark's protocol: an append never changes the protocol, the
  schema or the table's properties, and when the table does not exist yet the
  one delta-rs creates has the same columns, partitioning and protocol (1, 2)
  as Spark's. A table whose protocol delta-rs will not write raises, and the
  caller writes through Spark.

The invariant the ingest relies on: **the rows commit all together or not at
all, and only when the stream ended with exactly the expected number of rows.**
delta-rs writes the Parquet files first and adds them to the log in one commit
after the stream's last batch. The stream here raises instead of ending when
its count differs from the caller's, or when ``check`` (the write lock still
held) fails, so no commit happens: the files already written are in no
version of the table (``VACUUM`` removes them). A process killed mid-stream
leaves the same. Unlike a Spark Connect write, nothing outlives this process to
commit later, so no attempt marker (``lake.staging``) is needed.

Memory: a bounded queue of batches (``QUEUE_BATCHES``) between the streams'
threads and the writer, plus delta-rs's buffers: one row group
(``ROW_GROUP_ROWS``) and at most ``FILE_BYTES`` of encoded Parquet per
partition value being written, whatever the window's size.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from binlake import errors, failpoint, handoff

# Rows per Parquet row group the lake's files get: readers (the apply, restores)
# read a row group at a time, so this bounds them too (Spark writes 128 MB ones).
ROW_GROUP_ROWS = 65_536
# A data file is closed and a new one begun past this many encoded bytes (the
# writer holds one file's bytes until it is flushed).
FILE_BYTES = 64 * 1024 * 1024
# Batches decoded ahead of the writer: a batch per stream thread, and as many waiting.
QUEUE_BATCHES = 8


class Miscount(Exception):
    """The streams gave other than the expected number of rows: nothing was committed."""

    def __init__(self, rows: int, expected: int) -> None:
        super().__init__(f"the streams gave {rows} rows, {expected} were expected")
        self.rows = rows
        self.expected = expected


class NotWritable(Exception):
    """delta-rs cannot append to this table (its protocol, or not local): write it through Spark."""


def can_append(path: str) -> bool:
    """Whether ``path`` is a local directory whose Delta table (if any) delta-rs may
    append to: protocol (1, <= 2) with no table features, the only ones Spark's
    lake tables have. False sends the caller to Spark."""
    from binlake.lake.store.arrowread import local_path

    local = local_path(path)
    if local is None:
        return False
    if not os.path.isdir(os.path.join(local, "_delta_log")):
        return True
    try:
        from deltalake import DeltaTable

        protocol = DeltaTable(local).protocol()
    except Exception:  # delta-rs's own errors for a log it will not read
        return False
    return (protocol.min_reader_version == 1 and protocol.min_writer_version <= 2
            and not protocol.writer_features and not protocol.reader_features)


def merged(streams: Sequence[Callable[[], Iterable[Any]]], threads: int = 4) -> Iterator[Any]:
    """The record batches of every stream, ``threads`` streams read at a time, in
    no particular order; at most ``QUEUE_BATCHES`` are held between the readers
    and the consumer. A stream's exception is raised here (the others are told to
    stop); so is a consumer's: closing the iterator stops every reader."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    pending = list(streams)
    out: queue.Queue[tuple[str, Any]] = queue.Queue(QUEUE_BATCHES)
    stop = threading.Event()
    lock = threading.Lock()

    def work() -> None:
        while not stop.is_set():
            with lock:
                if not pending:
                    break
                stream = pending.pop(0)
            try:
                for batch in stream():
                    if batch.num_rows and not handoff.put_until(out, ("batch", batch), stop):
                        return
            except BaseException as exc:  # handed to the consumer, which raises it
                handoff.put_until(out, ("error", exc), stop)
                return
        handoff.put_until(out, ("done", None), stop)

    n = max(1, min(threads, len(streams)))
    workers = [threading.Thread(target=work, name=f"binlake-append-{i}", daemon=True) for i in range(n)]
    for t in workers:
        t.start()
    try:
        done = 0
        while done < n:
            kind, item = out.get()
            if kind == "batch":
                yield item
            elif kind == "error":
                raise item
            else:
                done += 1
    finally:
        stop.set()
        for t in workers:
            t.join()


def append(path: str, batches: Iterable[Any], schema: Any, partition_by: Sequence[str], expected_rows: int,
           check: Callable[[], None] | None = None) -> int:
    """Append ``batches`` (pyarrow RecordBatches of ``schema``) to the local Delta
    table at ``path`` (created when missing) in one commit, partitioned by
    ``partition_by``; the rows appended. ``Miscount`` (nothing committed) when they
    are not ``expected_rows``; ``check`` runs after the last batch, before the
    commit, and its exception also leaves the table as it was. An exception of
    the batches' source is raised as it is; ``NotWritable`` when delta-rs
    refuses the table."""
    import pyarrow as pa
    from deltalake import WriterProperties, write_deltalake

    from binlake.lake.store.arrowread import local_path

    local = local_path(path)
    if local is None:
        raise NotWritable(f"{path} is not on this host's file system")
    if expected_rows < 0:
        raise ValueError(f"expected_rows must be >= 0, got {expected_rows}")
    counted = [0]
    raised: list[BaseException] = []

    def stream() -> Iterator[Any]:
        try:
            for batch in batches:
                counted[0] += batch.num_rows
                if counted[0] > expected_rows:
                    raise Miscount(counted[0], expected_rows)
                yield batch
            if counted[0] != expected_rows:
                raise Miscount(counted[0], expected_rows)
            failpoint.hit("ingest-before-append-commit")
            if check is not None:
                check()
        except BaseException as exc:
            # delta-rs wraps what the stream raises in its own error text: the
            # original is kept to be raised as it is.
            raised.append(exc)
            raise

    reader = pa.RecordBatchReader.from_batches(schema, stream())
    try:
        write_deltalake(local, reader, mode="append", partition_by=list(partition_by),
                        target_file_size=FILE_BYTES,
                        writer_properties=WriterProperties(compression="SNAPPY", max_row_group_size=ROW_GROUP_ROWS))
    except Exception as exc:
        if raised:
            raise raised[0] from None
        raise NotWritable(f"delta-rs cannot append to {path}: {errors.first_line(exc)}") from None
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # a generator (``merged``) stops its readers
    return counted[0]
