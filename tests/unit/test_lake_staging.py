"""The lake's staging directory: where it is, what counts as a leftover, what the sweep removes."""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from binlake.lake.store import staging


def test_only_a_local_lake_stages(tmp_path: pathlib.Path) -> None:
    assert staging.staging_dir(str(tmp_path)) == str(tmp_path / staging.STAGING_DIR)
    assert staging.staging_dir(f"file:{tmp_path}") == str(tmp_path / staging.STAGING_DIR)
    assert staging.staging_dir("s3://bucket/lake") is None
    assert staging.left_over("s3://bucket/lake") == []
    with pytest.raises(ValueError, match="lake must be"):
        staging.staging_dir(" ")


def test_leftovers_and_the_sweep(tmp_path: pathlib.Path) -> None:
    lake = str(tmp_path)
    assert staging.left_over(lake) == []  # no directory yet
    where = tmp_path / staging.STAGING_DIR
    where.mkdir()
    old, new = where / "changes-1-2--a.parquet", where / "changes-2-3--b.parquet"
    for f in (old, new):
        f.write_bytes(b"x")
    hour_ago = time.time() - staging.STALE_S - 5
    os.utime(old, (hour_ago, hour_ago))
    assert staging.left_over(lake) == [str(old), str(new)]
    # Only files older than STALE_S go: a younger one may still be read by its write.
    assert staging.sweep(str(where)) == [old.name]
    assert staging.left_over(lake) == [str(new)]
    staging.remove([str(new), str(new)])  # a file removed meanwhile is no error
    assert staging.left_over(lake) == []


def _batches(n: int, rows: int, width: int) -> Iterator[Any]:
    import pyarrow as pa

    for i in range(n):
        yield pa.RecordBatch.from_arrays(
            [pa.array(range(i * rows, (i + 1) * rows), pa.int64()),
             pa.array([f"{k:0{width}d}" for k in range(i * rows, (i + 1) * rows)])], names=["k", "v"])


def test_streams_are_staged_in_bounded_memory_and_read_back_whole(tmp_path: pathlib.Path) -> None:
    """Two streams of 40 batches (about 2.5 MB each, 200 MB in all) reach their
    files while the Arrow memory held stays near a batch per stream; the files
    hold every row, and an empty stream makes no file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])
    held: list[int] = []

    def sampled() -> Iterator[Any]:
        for batch in _batches(40, 20_000, 100):
            held.append(pa.total_allocated_bytes())  # what every batch made so far still holds
            yield batch

    base = pa.total_allocated_bytes()
    streams = [sampled, sampled, lambda: iter(())]
    staged = staging.stage_streams(str(tmp_path), streams, schema, "changes-1-2", threads=2)
    assert staged.rows == 2 * 40 * 20_000
    assert len(staged.paths) == 2
    assert staging.left_over(str(tmp_path)) == sorted(staged.paths)  # each file is the write's marker
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in staged.paths) == staged.rows
    keys = sorted(k for p in staged.paths for k in pq.read_table(p, columns=["k"]).column("k").to_pylist())
    assert keys == sorted(list(range(40 * 20_000)) * 2)
    # A few batches (2.3 MB each) per stream at most, against 180 MB if they were kept.
    assert max(held) - base < 25 * 2**20, (max(held) - base)
    staged.remove()
    assert staging.left_over(str(tmp_path)) == []


def test_a_failing_stream_leaves_no_staged_file(tmp_path: pathlib.Path) -> None:
    import pyarrow as pa

    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])

    def broken() -> Iterator[Any]:
        yield from _batches(2, 10, 5)
        raise RuntimeError("pump went away")

    with pytest.raises(RuntimeError, match="pump went away"):
        staging.stage_streams(str(tmp_path), [lambda: _batches(3, 10, 5), broken], schema, "changes-1-2")
    assert staging.left_over(str(tmp_path)) == []
    with pytest.raises(ValueError, match="local lake"):
        staging.stage_streams("s3://bucket/lake", [lambda: _batches(1, 1, 1)], schema)
