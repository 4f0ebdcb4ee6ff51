"""Hand rows decoded in this process to Spark through a Parquet file in the lake.

The ingest decodes a small window in its own process (``ingest._decoded_here``)
and Spark writes it to Delta. ``spark.createDataFrame`` of the Arrow table
sends the whole table inside the query plan: over Spark Connect that is one
gRPC message the server turns into rows on its driver, and the Delta write is
then one task over those rows. Measured (bench/RESULTS.md, 30,000 row changes,
12.8 MB of Arrow): 1.7-3.8 s for the append, against 0.9-1.0 s when the client
writes the same batches as an uncompressed Parquet file (0.02 s) that Spark
reads with its vectorized reader and appends.

So for a lake on this host's file system (the Spark that writes the lake sees
it at the same path, as it sees the lake's tables) the rows go through
``<lake>/_binlake_staging/<name>.parquet``; any other lake (S3) gets
``createDataFrame``. Spark and delta-rs skip ``_`` names, so the file is never
part of a table. (A new window's change rows on a local lake skip this: delta-rs
appends them from the ingest's process, ``binlake.lake.store.arrowwrite``; staged
files serve Spark's replaces and the ledger rows.)

A staged file is also its write's attempt marker (``ingest._fence_earlier``
relies on it): it is made before the write starts and removed only after the
write returned, i.e. committed. A write that failed, or whose process was
killed, leaves it, so a later attempt at the same rows knows an earlier one
may still be running on a Spark Connect server that outlived its client. Such
files are removed by that later attempt, or by any ingest once older than
``STALE_S`` (far longer than a Connect server keeps running an operation whose
client went away: ``spark.connect.execute.manager.detachedTimeout``, 5 minutes
by default). A Spark job that still reads a removed file fails before its
commit, which leaves the table as it was.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from binlake.lake.store import location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

STAGING_DIR = "_binlake_staging"
# Between a write's name and the attempt's unique part in a staged file's name.
SEP = "--"
# A staged file older than this belongs to a process that died mid-write.
STALE_S = 3600.0


def staging_dir(lake: str) -> str | None:
    """The local staging directory of ``lake``; None for a lake not on this host's
    file system (S3), whose rows go to Spark inside the plan instead."""
    from binlake.lake.store.arrowread import local_path

    if not isinstance(lake, str) or not lake.strip():
        raise ValueError(f"lake must be a path or URI, got {lake!r}")
    root = local_path(lake)
    return None if root is None else os.path.join(root, STAGING_DIR)


@contextlib.contextmanager
def arrow_frame(spark: SparkSession, lake: str, batches: Sequence[Any], schema_ddl: str,
                name: str = "rows") -> Iterator[DataFrame]:
    """A DataFrame of ``batches`` (pyarrow RecordBatches with the columns of
    ``schema_ddl``, a Spark DDL string) for one write to ``lake``'s tables. A local
    lake's staged file is removed when the block inside returns, and kept (as the
    attempt's marker) when it raises; see the module's docstring."""
    import pyarrow as pa

    if not batches:
        raise ValueError("arrow_frame needs at least one record batch")
    table = pa.Table.from_batches(list(batches))
    where = staging_dir(lake)
    if where is None:
        yield spark.createDataFrame(table)
        return
    import pyarrow.parquet as pq

    os.makedirs(where, exist_ok=True)
    sweep(where)
    file_name = f"{_safe(name)}{SEP}{uuid.uuid4().hex}.parquet"
    local = os.path.join(where, file_name)
    # Uncompressed and without statistics: the file is read once, right away, on
    # this host; writing it costs a copy of the buffers (0.02 s for 12.8 MB).
    pq.write_table(table, local, compression="snappy", write_statistics=False)
    # In the lake's own spelling (a bare path or file: URI), as Spark sees its tables;
    # the explicit schema spares Spark reading the footer to infer it.
    yield spark.read.schema(schema_ddl).parquet(location.join(lake, STAGING_DIR, file_name))
    # Reached only when the write inside returned: a failed one leaves its marker.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(local)


class StagedFiles:
    """Record batches streamed to staged Parquet files (``stage_streams``), for one
    Spark read (``staged_frame``): a file per stream that yielded rows."""

    def __init__(self, lake: str, paths: list[str], rows: int) -> None:
        self.lake = lake
        self.paths = paths
        self.rows = rows

    def remove(self) -> None:
        remove(self.paths)


def stage_streams(lake: str, streams: Sequence[Callable[[], Iterable[Any]]], schema: Any,
                  name: str = "rows", threads: int = 4) -> StagedFiles:
    """Write each stream of pyarrow RecordBatches (each of ``schema``, a
    ``pyarrow.Schema``) to its own staged Parquet file in ``lake`` (a local lake:
    ``staging_dir`` is not None), ``threads`` streams at a time, a row group per
    batch. Memory holds a batch per stream being written, whatever the streams'
    length: this is how a window of any size decoded in the ingest's process
    reaches Spark. On an exception every file written so far is removed (no
    write has started: they are not yet anyone's attempt marker)."""
    import concurrent.futures

    import pyarrow.parquet as pq

    where = staging_dir(lake)
    if where is None:
        raise ValueError(f"lake {lake!r} is not on this host's file system: stage_streams needs a local lake")
    os.makedirs(where, exist_ok=True)
    sweep(where)
    paths: list[str] = []

    def write(stream: Callable[[], Iterable[Any]]) -> int:
        local = os.path.join(where, f"{_safe(name)}{SEP}{uuid.uuid4().hex}.parquet")
        paths.append(local)  # list.append is atomic: the cleanup below sees every file begun
        rows = 0
        writer = None
        try:
            for batch in stream():
                if not batch.num_rows:
                    continue
                if writer is None:
                    # Snappy: about a third of the bytes for a few percent of the time
                    # (the staged rows of a big window take disk until the write ends).
                    writer = pq.ParquetWriter(local, schema, compression="snappy", write_statistics=False)
                writer.write_batch(batch)
                rows += batch.num_rows
        finally:
            if writer is not None:
                writer.close()
        return rows

    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(streams)))) as pool:
            total = sum(pool.map(write, streams))
    except BaseException:
        remove(paths)
        raise
    return StagedFiles(lake, [p for p in paths if os.path.exists(p)], total)


@contextlib.contextmanager
def staged_frame(spark: SparkSession, staged: StagedFiles, schema_ddl: str) -> Iterator[DataFrame]:
    """A DataFrame of ``staged``'s files for one write to the lake's tables. The
    files are removed when the block inside returns, and kept (as the attempt's
    marker, see the module's docstring) when it raises."""
    if not staged.paths:
        raise ValueError("staged_frame needs at least one staged file")
    files = [location.join(staged.lake, STAGING_DIR, os.path.basename(p)) for p in staged.paths]
    yield spark.read.schema(schema_ddl).parquet(*files)
    staged.remove()


def left_over(lake: str) -> list[str]:
    """The staged files in ``lake`` whose writes did not return (their attempts
    failed or were killed): such a write may still commit. Called under the
    lake's write lock, so every staged file there is such a leftover: writers
    take turns, and each removes its file before it lets go."""
    where = staging_dir(lake)
    if where is None:
        return []
    try:
        return sorted(os.path.join(where, e.name) for e in os.scandir(where) if e.is_file())
    except FileNotFoundError:
        return []


def remove(paths: Sequence[str]) -> None:
    """Remove staged files (a write still reading one fails before its commit)."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def sweep(where: str, now: float | None = None) -> list[str]:
    """Remove staged files older than ``STALE_S`` from ``where`` (left by killed
    processes); the names removed."""
    now = time.time() if now is None else now
    gone: list[str] = []
    try:
        entries = list(os.scandir(where))
    except FileNotFoundError:
        return gone
    for entry in entries:
        try:
            if entry.is_file() and now - entry.stat().st_mtime > STALE_S:
                os.unlink(entry.path)
                gone.append(entry.name)
        except FileNotFoundError:  # removed meanwhile by another ingest's sweep
            continue
    if gone:
        log.info("removed %d staged file(s) left by interrupted ingests in %s", len(gone), where)
    return gone


def _safe(name: str) -> str:
    # No SEP inside a name: a name's prefix never matches another name's files.
    return "".join(c if c.isalnum() or c == "_" else "-" for c in name).replace(SEP, "-")[:80] or "rows"
