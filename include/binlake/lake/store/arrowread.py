"""Read the lake's Delta tables as Arrow in this process, without Spark: a
``commit_ts`` range of ``changes``, and the small ``windows`` and
``ddl_history`` tables whole, and the row counts per ``commit_ts`` bucket of a
range (``commit_ts_counts``) that cut a large window into pieces.

The apply reads every window it applies. Through Spark that is a job per read:
the Delta scan runs in the JVM, its rows are converted to Arrow there and sent
to Python over a socket, which measured 0.6-0.8 s per 80,000 row changes on
2 cores, the largest single cost of an apply into PostgreSQL. Here delta-rs
(the ``deltalake`` package) replays the table's log, keeps the files whose
partition (``commit_date``) and ``commit_ts`` statistics can hold the range, and
PyArrow reads just those Parquet row groups: 0.07-0.1 s for the same read.
The ledger and the DDL history, a Spark job each, take milliseconds here.

delta-rs reads what a plain Parquet reader can: a table that needs a reader
feature it does not apply to Parquet files itself (deletion vectors, column
mapping, a newer protocol) raises ``NotReadable``; the caller then reads
through Spark, which is always correct, only slower. A lake on S3 is read here
too, with the endpoint and credentials ``binlake.lake.store.location`` gives both
engines (there delta-rs only reads: Spark writes every table of an S3 lake; on a
local lake delta-rs also appends new windows' rows, ``binlake.lake.store.arrowwrite``).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from binlake import errors
from binlake.lake import s3settings
from binlake.lake.store import location

log = logging.getLogger(__name__)


class NotReadable(Exception):
    """This table cannot be read here; read it through Spark (the message says why)."""


def local_path(path: str) -> str | None:
    """The local directory of a table path (``/x``, ``file:/x``, ``file:///x``),
    or None for any other scheme."""
    if not isinstance(path, str) or not path:
        raise TypeError(f"path must be a non-empty string, got {path!r}")
    if path.startswith("file://"):
        return path[len("file://"):] or None
    if path.startswith("file:"):
        return path[len("file:"):] or None
    if "://" in path:
        return None
    return path


class TableReader:
    """Reads one Delta table of the lake; its log is loaded once and brought up to
    date before every read (new windows, a window ingested again)."""

    def __init__(self, path: str) -> None:
        local = local_path(path)
        options: dict[str, str] | None = None
        if local is not None:
            if not os.path.isdir(os.path.join(local, "_delta_log")):
                raise NotReadable(f"{path} holds no Delta table")
            where = local
        elif path.startswith(("s3://", "s3a://")):
            where, options = location.to_object_store(path), s3settings.storage_options()
        else:
            raise NotReadable(f"{path} is neither a local directory nor on S3")
        try:
            from deltalake import DeltaTable
        except ImportError as exc:  # an install without the optional reader
            raise NotReadable(f"the deltalake package is not importable ({exc})") from None
        try:
            self._table: Any = DeltaTable(where, storage_options=options)
        except Exception as exc:  # delta-rs raises its own error types for an unreadable log
            raise NotReadable(f"delta-rs cannot load {path}: {errors.first_line(exc)}") from None
        self.path = path

    def column_names(self) -> list[str]:
        """The table's columns, in schema order."""
        try:
            return [f.name for f in self._table.schema().fields]
        except Exception as exc:  # a schema delta-rs cannot map to Arrow
            raise NotReadable(f"delta-rs cannot map the schema of {self.path}: {errors.first_line(exc)}") from None

    def read(self, columns: Sequence[str], *, prune: str | None = None,
             where: ds.Expression | None = None) -> pa.Table:
        """``columns`` of the rows matching ``where``, from the files ``prune`` (a
        SQL predicate over partition values and file statistics, which keeps a
        superset) leaves, in file order. ``NotReadable`` when the table's protocol
        needs what a Parquet read does not do."""
        dataset = self._dataset(prune)
        return dataset.to_table(columns=list(columns), filter=where)

    def _dataset(self, prune: str | None) -> ds.Dataset:
        """The table brought up to date, as a dataset of the files ``prune`` leaves."""
        try:
            self._table.update_incremental()
            return self._table.to_pyarrow_dataset(file_pruning_predicate=prune)
        except Exception as exc:  # DeltaProtocolError and friends: what delta-rs will not read
            raise NotReadable(f"delta-rs cannot read {self.path}: {errors.first_line(exc)}") from None

    def batches(self, columns: Sequence[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Every row of ``columns``, as record batches of at most ``batch_rows`` rows,
        typed as the table's schema, read file by file with Parquet's streaming reader:
        what this process holds is a batch's decoded rows and 1 MiB of a file's bytes,
        whatever the table's or its row groups' size. (The dataset scanner decodes a
        whole row group first: 373 MiB held for one of 68 MiB on disk, measured, where
        this reader held under 1 MiB.) The dataset is opened here, so ``NotReadable``
        comes before the first batch."""
        import pyarrow.parquet as pq

        if not isinstance(batch_rows, int) or isinstance(batch_rows, bool) or batch_rows < 1:
            raise ValueError(f"batch_rows must be a positive integer, got {batch_rows!r}")
        missing = sorted(set(columns) - set(self.column_names()))
        if missing:
            raise NotReadable(f"{self.path} has no column(s) {', '.join(missing)}")
        dataset = self._dataset(None)
        if not isinstance(dataset, ds.FileSystemDataset):
            raise NotReadable(f"delta-rs gave {self.path} as a {type(dataset).__name__}, not its files")
        schema = pa.schema([dataset.schema.field(c) for c in columns])
        fragments = list(dataset.get_fragments())
        if self._table.metadata().partition_columns or any(not isinstance(f, ds.ParquetFileFragment)
                                                            for f in fragments):
            raise NotReadable(f"{self.path} has partition columns or files that are not Parquet")

        def stream() -> Iterator[pa.RecordBatch]:
            for fragment in fragments:
                with dataset.filesystem.open_input_file(fragment.path) as fh:
                    reader = pq.ParquetFile(fh, pre_buffer=False, buffer_size=1 << 20)
                    for batch in reader.iter_batches(batch_size=batch_rows, columns=list(columns)):
                        yield batch if batch.schema == schema else batch.cast(schema)

        return stream()

    def read_changes(self, lo: int, hi: int, columns: Sequence[str], first_date: dt.date,
                     last_date: dt.date) -> pa.Table:
        """The ``changes`` rows with ``lo <= commit_ts < hi`` (in the partitions
        ``first_date`` .. ``last_date``, which must cover the range), in file order:
        the caller sorts."""
        prune, where = _ts_range(lo, hi, first_date, last_date)
        return self.read(columns, prune=prune, where=where)

    def commit_ts_counts(self, lo: int, hi: int, width: int, first_date: dt.date, last_date: dt.date
                         ) -> np.ndarray:
        """How many ``changes`` rows each ``commit_ts`` bucket of ``[lo, hi)`` holds:
        bucket ``i`` is ``[lo + i * width, lo + (i + 1) * width)``. Only the
        ``commit_ts`` column is scanned, batch after batch, so the memory is the
        buckets' and one batch's, whatever the range holds (the apply cuts a large
        window into pieces by these counts)."""
        prune, where = _ts_range(lo, hi, first_date, last_date)
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise ValueError(f"width must be a positive integer, got {width!r}")
        dataset = self._dataset(prune)
        bins = -(-(hi - lo) // width)
        counts = np.zeros(bins, dtype=np.int64)
        # A little read-ahead only: the scan is one column, its speed is the files'.
        for batch in dataset.to_batches(columns=["commit_ts"], filter=where, batch_readahead=2,
                                        fragment_readahead=1):
            if batch.num_rows:
                stamps = batch.column(0).to_numpy(zero_copy_only=False)
                counts += np.bincount((stamps - lo) // width, minlength=bins)
        return counts


def _ts_range(lo: int, hi: int, first_date: dt.date, last_date: dt.date) -> tuple[str, ds.Expression]:
    """The file pruning predicate and row filter of ``lo <= commit_ts < hi`` (in the
    partitions ``first_date`` .. ``last_date``, which must cover the range)."""
    if not isinstance(lo, int) or not isinstance(hi, int) or isinstance(lo, bool) or isinstance(hi, bool):
        raise TypeError(f"lo and hi must be integers, got {lo!r}, {hi!r}")
    if hi <= lo:
        raise ValueError(f"empty range [{lo}, {hi})")
    if first_date > last_date:
        raise ValueError(f"first_date {first_date} is after last_date {last_date}")
    # Files are pruned by the partition exactly and by commit_ts statistics as a
    # superset; the row filter makes the result exact.
    prune = (f"commit_date >= '{first_date.isoformat()}' AND commit_date <= '{last_date.isoformat()}' "
             f"AND commit_ts >= {lo} AND commit_ts < {hi}")
    return prune, (ds.field("commit_ts") >= lo) & (ds.field("commit_ts") < hi)


def small_table_rows(path: str, columns: Sequence[str] | None, where: Any = None) -> list[dict[str, Any]] | None:
    """The rows of a small local lake table (the ledger, the DDL history) read here
    (``columns``, None for all) in the shape Spark's ``Row.asDict(recursive=True)``
    gives, or None when it must be read through Spark (not local, not readable here).

    A few milliseconds, where a Spark job costs 0.3-3 s: most of an empty window's
    ingest was these reads."""
    if local_path(path) is None:
        return None
    try:
        reader = TableReader(path)
        table = reader.read(list(columns) if columns is not None else reader.column_names(), where=where)
    except NotReadable as exc:
        log.info("reading %s through Spark: %s", path, exc)
        return None
    maps = {f.name for f in table.schema if pa.types.is_map(f.type)}
    rows: list[dict[str, Any]] = table.to_pylist()
    for row in rows:
        for key, value in row.items():
            if key in maps and value is not None:
                row[key] = dict(value)  # Arrow gives a map as key-value pairs
            elif isinstance(value, dt.datetime) and value.tzinfo is not None:
                row[key] = value.astimezone(dt.UTC).replace(tzinfo=None)  # naive UTC, as written
    return rows


def may_hold(path: str, prune: str) -> bool | None:
    """Of the local Delta table at ``path``: whether any of its files may hold a row
    matching ``prune`` (a SQL predicate over partition values and file statistics;
    a file without statistics may). None when it cannot be read here (not local,
    no table yet, a protocol delta-rs does not read)."""
    if local_path(path) is None:
        return None
    try:
        reader = TableReader(path)
        reader._table.update_incremental()
        files = reader._table.to_pyarrow_dataset(file_pruning_predicate=prune).files
    except NotReadable:
        return None
    except Exception as exc:  # delta-rs's own errors for a log it will not read
        log.info("cannot read %s here: %s", path, errors.first_line(exc))
        return None
    return bool(files)


def data_files(path: str) -> list[str] | None:
    """The Parquet files of the Delta table at ``path`` (its current version), named as
    Spark opens them (under ``path``), or None when Spark must read it as a Delta table:
    not readable here, a partitioned table, a reader protocol beyond plain Parquet
    (column mapping, deletion vectors), no file, or a file named other than plainly
    under the table.

    Spark's first read of a table version replays its log in several jobs (1-2 s on two
    cores for a table of one commit); a caller that reads each table it has just written
    once (the snapshot's proof) reads the files instead, in the job that uses them."""
    try:
        table = TableReader(path)._table
        if table.protocol().min_reader_version != 1 or table.metadata().partition_columns:
            return None
        names = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    except NotReadable as exc:
        log.info("reading %s as Delta through Spark: %s", path, exc)
        return None
    except Exception as exc:  # delta-rs's own errors for a log it will not read
        log.info("reading %s as Delta through Spark: %s", path, errors.first_line(exc))
        return None
    if not names or any(not isinstance(n, str) or n.startswith("/") or ":" in n or "%" in n for n in names):
        return None
    return [f"{path.rstrip('/')}/{n}" for n in names]
