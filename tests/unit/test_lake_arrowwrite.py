"""Appends of decoded rows to a local Delta table by delta-rs (``lake.store.arrowwrite``):
all rows in one commit or none, a miscount or a failing stream commits nothing, and
the memory held does not grow with the rows streamed."""

from __future__ import annotations

import datetime as dt
import pathlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import psutil
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from binlake import errors
from binlake.lake.store import arrowwrite

SCHEMA = pa.schema([("k", pa.int64()), ("day", pa.date32()), ("v", pa.string())])


def _batches(first: int, n: int, rows: int, width: int = 8) -> Iterator[pa.RecordBatch]:
    for i in range(n):
        lo = first + i * rows
        keys = range(lo, lo + rows)
        yield pa.RecordBatch.from_arrays(
            [pa.array(keys, pa.int64()),
             pa.array([dt.date(2026, 12, 1 + k % 3) for k in keys], pa.date32()),
             pa.array([f"{k:0{width}d}" for k in keys])], schema=SCHEMA)


def _stream(first: int, n: int, rows: int) -> Callable[[], Iterable[pa.RecordBatch]]:
    return lambda: _batches(first, n, rows)


def _keys(path: pathlib.Path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table(columns=["k"]).column("k").to_pylist())


def test_streams_are_appended_whole_in_one_commit(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "changes"
    streams = [_stream(s * 1000, 4, 250) for s in range(5)] + [lambda: iter(())]
    n = arrowwrite.append(str(path), arrowwrite.merged(streams, threads=3), SCHEMA, ["day"], 5000)
    assert n == 5000
    table = DeltaTable(str(path))
    assert table.version() == 0  # created by the append: one commit
    assert table.metadata().partition_columns == ["day"]
    assert (table.protocol().min_reader_version, table.protocol().min_writer_version) == (1, 2)
    assert _keys(path) == list(range(5000))
    # A second append is one more commit holding just its rows.
    assert arrowwrite.append(str(path), _batches(5000, 2, 10), SCHEMA, ["day"], 20) == 20
    assert DeltaTable(str(path)).version() == 1
    assert _keys(path) == list(range(5020))
    assert arrowwrite.can_append(str(path))


@pytest.mark.parametrize("given", [999, 1001, 0])
def test_a_miscount_commits_nothing(tmp_path: pathlib.Path, given: int) -> None:
    path = tmp_path / "changes"
    arrowwrite.append(str(path), _batches(0, 1, 10), SCHEMA, ["day"], 10)
    with pytest.raises(arrowwrite.Miscount) as caught:
        arrowwrite.append(str(path), _batches(100, 1, given), SCHEMA, ["day"], 1000)
    assert caught.value.expected == 1000
    assert caught.value.rows == given if given < 1000 else caught.value.rows > 1000
    assert DeltaTable(str(path)).version() == 0
    assert _keys(path) == list(range(10))


def test_a_failing_stream_or_check_commits_nothing(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "changes"
    arrowwrite.append(str(path), _batches(0, 1, 10), SCHEMA, ["day"], 10)

    def failing() -> Iterator[pa.RecordBatch]:
        yield from _batches(100, 3, 100)
        raise errors.Unavailable("pump p2 went away")

    with pytest.raises(errors.Unavailable, match="pump p2 went away"):
        arrowwrite.append(str(path), arrowwrite.merged([_stream(1000, 3, 100), failing]), SCHEMA, ["day"], 600)

    def lost() -> None:
        raise errors.FailedPrecondition("the lake's write lease was lost")

    with pytest.raises(errors.FailedPrecondition, match="lease was lost"):
        arrowwrite.append(str(path), _batches(100, 2, 10), SCHEMA, ["day"], 20, check=lost)
    assert DeltaTable(str(path)).version() == 0
    assert _keys(path) == list(range(10))


def test_a_table_delta_rs_will_not_write_is_left_to_spark(tmp_path: pathlib.Path) -> None:
    assert not arrowwrite.can_append("s3://bucket/lake/changes")
    assert arrowwrite.can_append(str(tmp_path / "none-yet"))
    with pytest.raises(arrowwrite.NotWritable):
        arrowwrite.append("s3://bucket/lake/changes", iter(()), SCHEMA, ["day"], 0)
    # A table of other columns: delta-rs refuses the append, nothing is committed.
    path = tmp_path / "other"
    other = pa.schema([("x", pa.int64())])
    arrowwrite.append(str(path), iter([pa.RecordBatch.from_arrays([pa.array([1])], schema=other)]), other, [], 1)
    with pytest.raises(arrowwrite.NotWritable, match="cannot append"):
        arrowwrite.append(str(path), _batches(0, 1, 5), SCHEMA, ["day"], 5)
    assert DeltaTable(str(path)).version() == 0


def test_closing_the_merge_early_stops_its_readers(tmp_path: pathlib.Path) -> None:
    before = threading.active_count()
    merged = arrowwrite.merged([_stream(s * 10**6, 10**4, 10) for s in range(4)], threads=4)
    assert next(merged).num_rows == 10
    merged.close()
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before


def _peak_rss_of_append(path: pathlib.Path, batches_per_stream: int) -> int:
    """The process's peak resident bytes while four streams of ``batches_per_stream``
    batches of 4,096 rows of 128-byte values are appended to a new table."""
    proc = psutil.Process()
    peak = [proc.memory_info().rss]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.01)

    def stream(s: int) -> Callable[[], Iterable[pa.RecordBatch]]:
        first = s * 10**8
        return lambda: (pa.RecordBatch.from_arrays(
            [pa.array(range(k, k + 4096), pa.int64()),
             pa.array([dt.date(2026, 12, 1)] * 4096, pa.date32()),
             pa.array([f"{k + j:0128d}" for j in range(4096)])], schema=SCHEMA)
            for k in range(first, first + batches_per_stream * 4096, 4096))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        n = arrowwrite.append(str(path), arrowwrite.merged([stream(s) for s in range(4)]), SCHEMA, ["day"],
                              4 * batches_per_stream * 4096)
    finally:
        stop.set()
        sampler.join()
    assert n == 4 * batches_per_stream * 4096
    assert DeltaTable(str(path)).to_pyarrow_dataset().count_rows() == n
    return peak[0]


def test_the_memory_held_does_not_grow_with_the_rows_streamed(tmp_path: pathlib.Path) -> None:
    """An append of 160 batches (about 90 MB of Arrow), then one of 640 (about 360 MB):
    the second's peak resident memory is within 64 MiB of the first's, though it
    streamed 270 MB more (the queue of batches, a row group and a file's bytes are
    held, never the rows streamed)."""
    small = _peak_rss_of_append(tmp_path / "small", 40)
    big = _peak_rss_of_append(tmp_path / "big", 160)
    grown = big - small
    assert grown < 64 * 2**20, f"the peak grew by {grown / 2**20:.0f} MiB for 270 MB more streamed"


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="threads"):
        next(arrowwrite.merged([], threads=0))
    with pytest.raises(ValueError, match="expected_rows"):
        arrowwrite.append("/tmp/x", iter(()), SCHEMA, [], -1)
    # An empty merge ends at once.
    assert list(arrowwrite.merged([])) == []
