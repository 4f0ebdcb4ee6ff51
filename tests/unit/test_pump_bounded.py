"""The Pump's background paths hold bounded memory whatever the data: the sorter's
heap behind an old pending prewrite, the resolver's reads, GC's deletes (and a
crash between them), and the parts a transaction larger than a read batch is
served in. Real storage on disk throughout; memory is counted in entries held or
with tracemalloc at 1x and 10x the data."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Callable, Iterator

import pytest
from pumpkit import commit, fake, prewrite, row_start_ts

from binlake import errors, failpoint
from binlake.proto import binlog_pb2
from binlake.pump import index as ix
from binlake.pump import sorter, storage
from binlake.pump.storage import Entry, Part, Storage


def _entries(*binlogs: binlog_pb2.Binlog) -> list[Entry]:
    return [Entry(b, b.SerializeToString(), internal=b.tp == binlog_pb2.COMMIT and b.start_ts == b.commit_ts)
            for b in binlogs]


def _txns(st: Storage, first: int, n: int, pad: int = 0) -> None:
    """n transactions start first, first+10, ...; each commits 5 after its start."""
    starts = range(first, first + 10 * n, 10)
    assert st.write(_entries(*(prewrite(s, pad=pad) for s in starts)), timeout=60) == [None] * n
    assert st.write(_entries(*(commit(s, s + 5) for s in starts)), timeout=60) == [None] * n


@pytest.fixture
def st(tmp_path: pathlib.Path) -> Iterator[Storage]:
    s = Storage(tmp_path / "pump", fsync=False)
    yield s
    s.close()


def _peak(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_sorters_heap_does_not_grow_with_what_finished_behind_a_pending_prewrite() -> None:
    s = sorter.SafeTs()
    s.prewrite(1)  # pending throughout: the heap's top
    for n in (10_000, 100_000):
        for ts in range(10, 10 + n):
            s.prewrite(ts * 10)
            s.commit(ts * 10, ts * 10 + 5)
        # Only the one pending entry is needed; what finished behind it is not kept.
        assert len(s.pending) == 1
        assert s.pending.heap_size() <= 2 * len(s.pending) + sorter.COMPACT_SLACK
        assert s.safe_ts == 1
    s.commit(1, 7)
    assert s.pending.heap_size() == 0 and s.safe_ts == s.bound


def test_the_resolver_reads_keys_in_bounded_batches_not_the_prewrites(
        st: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    starts = list(range(100, 100 + 10 * 250, 10))
    assert st.write(_entries(*(prewrite(s, writer=f"w{s}".encode(), pad=20_000) for s in starts)),
                    timeout=60) == [None] * len(starts)
    reads: list[object] = []
    real_read = st.vlog.read
    monkeypatch.setattr(st.vlog, "read", lambda ptr: reads.append(ptr) or real_read(ptr))

    batches: list[list[tuple[int, bytes]]] = []
    peak = _peak(lambda: batches.extend(st.pending_older_than(0.0, batch=64)))
    assert [ts for b in batches for ts, _ in b] == starts
    assert all(key == f"w{ts}".encode() for b in batches for ts, key in b)
    assert max(len(b) for b in batches) == 64
    assert reads == []  # 5 MB of prewrites pending, none read
    assert peak < 256 << 10, peak
    assert list(st.pending_older_than(3600.0)) == []


def test_gc_holds_bounded_memory_whatever_it_removes(tmp_path: pathlib.Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "GC_BATCH_KEYS", 200)
    peaks = []
    for n in (1_000, 10_000):
        with_gc = Storage(tmp_path / f"pump{n}", fsync=False)
        try:
            _txns(with_gc, 100, n)
            ok = with_gc.write(_entries(fake(100 + 10 * n + 100)), timeout=10)
            assert ok == [None]
            cut = 100 + 10 * n  # every transaction is below it
            result: dict[str, int] = {}
            peaks.append(_peak(lambda st=with_gc, cut=cut, result=result: result.update(st.gc(cut))))
            assert result["txns"] == n and with_gc.gc_ts == cut
            assert not list(with_gc.index.db.iterator(prefix=ix.P_COMMIT))
            assert not list(with_gc.index.db.iterator(prefix=ix.P_TXN))
        finally:
            with_gc.close()
    # Ten times the transactions, the same peak (a list of every one would be ten times larger).
    assert peaks[1] < peaks[0] * 1.5 + (32 << 10), peaks


CRASHING_GC = textwrap.dedent("""
    import sys
    from pumpkit import commit, fake, prewrite
    from binlake.proto import binlog_pb2
    from binlake.pump import storage
    from binlake.pump.storage import Entry, Storage

    storage.GC_BATCH_KEYS = 10
    st = Storage(sys.argv[1])
    def put(*bs):
        assert st.write([Entry(b, b.SerializeToString(), internal=b.tp == binlog_pb2.COMMIT
                               and b.start_ts == b.commit_ts) for b in bs], timeout=30) == [None] * len(bs)
    starts = range(100, 100 + 10 * 60, 10)
    put(*(prewrite(s) for s in starts))
    put(*(commit(s, s + 5) for s in starts))
    put(fake(5000))
    st.gc(int(sys.argv[2]))  # dies after its second delete batch
""")


def test_a_crash_between_gc_batches_serves_no_hole_and_the_next_gc_removes_the_rest(
        tmp_path: pathlib.Path) -> None:
    data = tmp_path / "pump"
    script = tmp_path / "crash_gc.py"
    script.write_text(CRASHING_GC)
    cut = 405  # commits 105 .. 695: 30 below the cut, 30 at or above it
    env = {**os.environ, failpoint.ENV: f"{storage.FAILPOINT_GC_AFTER_BATCH}:exit:2",
           "PYTHONPATH": os.pathsep.join([str(pathlib.Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, str(script), str(data), str(cut)], env=env, capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 137, res.stderr

    st = Storage(data)
    try:
        # The GC ts was stored before the first delete: nothing below it is served...
        assert st.gc_ts == cut
        with pytest.raises(errors.OutOfRange):
            list(st.read_window(cut - 1, 1000))
        # ...and every window at or above it is whole.
        assert [b.start_ts for batch in st.read_window(cut, 1000) for b in batch] == list(range(400, 700, 10))
        left = [k for k, _ in st.index.db.iterator(prefix=ix.P_COMMIT) if ix.decode_commit_key(k)[0] < cut]
        assert len(left) == 10  # two batches of ten were deleted before the crash
        # The next round removes the leftovers though the GC ts does not move.
        assert st.gc(cut)["txns"] == 10
        assert all(ix.decode_commit_key(k)[0] >= cut for k, _ in st.index.db.iterator(prefix=ix.P_COMMIT))
        assert [b.start_ts for batch in st.read_window(cut, 1000) for b in batch] == list(range(400, 700, 10))
    finally:
        st.close()


def test_a_transaction_larger_than_a_read_batch_is_served_in_bounded_parts(st: Storage) -> None:
    _txns(st, 100, 3)
    big = prewrite(200, pad=300_000)
    assert st.write(_entries(big), timeout=10) == [None]
    _txns(st, 300, 2)
    assert st.write(_entries(commit(200, 250)), timeout=10) == [None]
    assert st.write(_entries(fake(1000)), timeout=10) == [None]

    items = list(st.serve_window(0, 1000, max_bytes=64 << 10))
    parts = [i for i in items if isinstance(i, Part)]
    assert parts and all(len(p.data) <= 64 << 10 for p in parts)
    assert b"".join(p.data for p in parts) == big.SerializeToString()
    assert [p.offset for p in parts] == list(range(0, len(parts) * (64 << 10), 64 << 10))
    # In commit order: the three small ones, the parts, then the rest.
    order = [("part", i.start_ts) if isinstance(i, Part) else ("batch", tuple(b.start_ts for b in i)) for i in items]
    assert order[0] == ("batch", (100, 110, 120)) and order[-1] == ("batch", (300, 310))
    assert {o for o in order[1:-1]} == {("part", 200)}
    # A reader that does not join parts gets it whole; keys alone read no value.
    whole = [b for batch in st.read_window(0, 1000, max_bytes=64 << 10) for b in batch]
    assert [b.start_ts for b in whole] == [100, 110, 120, 200, 300, 310] and row_start_ts(whole[3]) == 200
    keys = [b for i in st.serve_window(0, 1000, keys_only=True, max_txns=4) for b in i]  # type: ignore[union-attr]
    assert [(b.start_ts, b.commit_ts, b.prewrite_value) for b in keys][3] == (200, 250, b"")


def test_a_reader_never_completes_a_transaction_from_parts_out_of_order() -> None:
    from binlake.client.reader import _join
    from binlake.proto import pump_pb2

    data = prewrite(200, pad=1000).SerializeToString()
    joined = bytearray()

    def part(offset: int, size: int) -> pump_pb2.BinlogPart:
        return pump_pb2.BinlogPart(start_ts=200, commit_ts=250, offset=offset, total_bytes=len(data),
                                   data=data[offset:offset + size])

    assert _join(joined, part(0, 400), "pump p1") is None
    with pytest.raises(errors.Unavailable, match="at offset 800, expected 400"):
        _join(joined, part(800, 400), "pump p1")
    assert _join(joined, part(400, 400), "pump p1") is None
    done = _join(joined, part(800, len(data)), "pump p1")
    assert done is not None and (done.tp, done.start_ts, done.commit_ts) == (binlog_pb2.COMMIT, 200, 250)
    assert row_start_ts(done) == 200 and not joined
