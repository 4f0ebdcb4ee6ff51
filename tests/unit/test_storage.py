"""Pump storage: the prewrite/commit/rollback state machine, reads, recovery and GC.

Real files throughout: a value log on disk and a LevelDB index.
"""

from __future__ import annotations

import pathlib
import threading
import time
from collections.abc import Iterator

import plyvel
import pytest
from pumpkit import commit, fake, prewrite, rollback, row_start_ts

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.pump import index as ix
from binlake.pump.storage import Entry, Storage
from binlake.pump.vlog import ValueLog, encode_record

SEG = 4096


def entry(b: binlog_pb2.Binlog, internal: bool = False) -> Entry:
    return Entry(b, b.SerializeToString(), internal=internal)


def write(st: Storage, *binlogs: binlog_pb2.Binlog) -> list[errors.BinlakeError | None]:
    return st.write([entry(b, internal=(b.tp == binlog_pb2.COMMIT and b.start_ts == b.commit_ts))
                     for b in binlogs], timeout=10)


def ok(st: Storage, *binlogs: binlog_pb2.Binlog) -> None:
    assert write(st, *binlogs) == [None] * len(binlogs)


def served(st: Storage, start: int = 0, end: int = 1 << 62, **kw: int) -> list[tuple[int, int]]:
    return [(b.commit_ts, b.start_ts) for batch in st.read_window(start, end, **kw) for b in batch]


def txn(st: Storage, start: int, commit_ts: int, pad: int = 0) -> None:
    ok(st, prewrite(start, pad=pad))
    ok(st, commit(start, commit_ts))


@pytest.fixture
def sdir(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "pump"


@pytest.fixture
def st(sdir: pathlib.Path) -> Iterator[Storage]:
    s = Storage(sdir, segment_bytes=1 << 20)
    yield s
    s.close()


# ---------------------------------------------------------------------------- state machine


def test_prewrite_commit_is_served(st: Storage) -> None:
    ok(st, prewrite(10))
    assert st.is_pending(10) and st.pending_count == 1
    ok(st, commit(10, 20))
    assert not st.is_pending(10) and st.pending_count == 0
    assert st.max_commit_ts == 20 and st.safe_ts == 20
    (b,) = [b for batch in st.read_window(0, 100) for b in batch]
    assert (b.tp, b.start_ts, b.commit_ts) == (binlog_pb2.COMMIT, 10, 20)
    assert b.prewrite_key == b""  # a served transaction does not carry the writer id
    assert row_start_ts(b) == 10  # it carries the prewrite's mutations
    assert st.stats.binlogs == 2 and st.stats.groups == 2 and st.stats.fsyncs >= 2


def test_commit_without_prewrite(st: Storage) -> None:
    (err,) = write(st, commit(10, 20))
    assert isinstance(err, errors.FailedPrecondition)
    assert "no prewrite" in str(err) and "10" in str(err)
    assert served(st) == [] and st.stats.binlogs == 0


def test_duplicate_commit_same_ts_already_exists(st: Storage) -> None:
    txn(st, 10, 20)
    (err,) = write(st, commit(10, 20))
    assert isinstance(err, errors.AlreadyExists)
    assert "already stored with commit_ts 20" in str(err)
    assert served(st) == [(20, 10)]


def test_duplicate_commit_different_ts_refused(st: Storage) -> None:
    txn(st, 10, 20)
    (err,) = write(st, commit(10, 25))
    assert isinstance(err, errors.FailedPrecondition)
    assert "already committed with commit_ts 20" in str(err) and "25" in str(err)
    assert served(st) == [(20, 10)]


def test_rollback_after_commit_refused(st: Storage) -> None:
    txn(st, 10, 20)
    (err,) = write(st, rollback(10))
    assert isinstance(err, errors.FailedPrecondition)
    assert "already committed" in str(err)
    assert served(st) == [(20, 10)]


def test_commit_after_rollback_refused(st: Storage) -> None:
    ok(st, prewrite(10))
    ok(st, rollback(10))
    (err,) = write(st, commit(10, 20))
    assert isinstance(err, errors.FailedPrecondition)
    assert "rolled back" in str(err)
    (again,) = write(st, rollback(10))
    assert isinstance(again, errors.AlreadyExists)
    assert served(st) == []


def test_rollback_without_prewrite_refused(st: Storage) -> None:
    (err,) = write(st, rollback(10))
    assert isinstance(err, errors.FailedPrecondition) and "no prewrite" in str(err)


def test_duplicate_prewrite_already_exists(st: Storage) -> None:
    ok(st, prewrite(10))
    (err,) = write(st, prewrite(10))
    assert isinstance(err, errors.AlreadyExists) and "already stored" in str(err)
    ok(st, commit(10, 20))
    # Still refused once the transaction is finished.
    (err,) = write(st, prewrite(10))
    assert isinstance(err, errors.AlreadyExists)
    assert served(st) == [(20, 10)]


def test_prewrite_and_commit_in_one_group(st: Storage) -> None:
    results = write(st, prewrite(10), commit(10, 20), prewrite(11), prewrite(11), commit(12, 30), rollback(11))
    assert results[:2] == [None, None]
    assert results[2] is None
    assert isinstance(results[3], errors.AlreadyExists)
    assert isinstance(results[4], errors.FailedPrecondition)
    assert results[5] is None
    assert st.stats.groups == 1 and st.stats.binlogs == 4
    assert served(st) == [(20, 10)]
    assert st.pending_count == 0


class _RecordingBatch:
    """A LevelDB write batch that records the keys it was given."""

    def __init__(self, wb: plyvel.WriteBatch, log: list[tuple[str, bytes]]) -> None:
        self._wb = wb
        self._log = log

    def put(self, key: bytes, value: bytes) -> None:
        self._log.append(("put", key))
        self._wb.put(key, value)

    def delete(self, key: bytes) -> None:
        self._log.append(("delete", key))
        self._wb.delete(key)

    def write(self) -> None:
        self._wb.write()


def test_a_transaction_finished_within_one_index_batch_writes_no_wait_key(
        st: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    """The W key of a transaction whose prewrite and outcome reach the index in
    the same batch is neither put nor deleted (one atomic write would do both);
    one whose outcome comes in a later batch gets it, and loses it then. Either
    way the index ends the same: no W key, the outcome and the commit key."""
    ops: list[tuple[str, bytes]] = []
    db = st.index.db

    class RecordingDB:
        def __getattr__(self, name: str) -> object:
            return getattr(db, name)

        def write_batch(self) -> _RecordingBatch:
            return _RecordingBatch(db.write_batch(), ops)

    monkeypatch.setattr(st.index, "db", RecordingDB())
    # 10 and 11 finish in one batch; 12 stays pending across it; 13 is rolled back in it.
    ok(st, prewrite(10), commit(10, 20), prewrite(11), prewrite(12), commit(11, 21), prewrite(13), rollback(13))
    assert [k for op, k in ops if k[:1] == ix.P_WAIT] == [ix.wait_key(12)]
    ops.clear()
    ok(st, commit(12, 22))  # a later batch: the W key put before is deleted
    assert ops.count(("delete", ix.wait_key(12))) == 1
    assert st.index.pending() == []
    for start, commit_ts in ((10, 20), (11, 21), (12, 22)):
        assert ix.decode_txn(st.index.db.get(ix.txn_key(start)))[:2] == ("C", commit_ts)
    assert ix.decode_txn(st.index.db.get(ix.txn_key(13)))[0] == "R"
    assert served(st) == [(20, 10), (21, 11), (22, 12)]
    assert st.pending_count == 0


def test_refused_entries_are_not_stored(st: Storage) -> None:
    ok(st, prewrite(10))
    size = st.vlog.head
    assert write(st, commit(99, 100), prewrite(10)) != [None, None]
    assert st.vlog.head == size


def test_concurrent_writers_share_groups(st: Storage) -> None:
    errs: list[object] = []

    def worker(base: int) -> None:
        for i in range(25):
            start = base + 2 * i
            for b in (prewrite(start), commit(start, start + 1)):
                res = write(st, b)
                if res != [None]:
                    errs.append(res)

    threads = [threading.Thread(target=worker, args=(1000 * (t + 1),)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errs == []
    assert st.stats.binlogs == 400
    assert len(served(st)) == 200
    assert st.stats.groups <= 400


def test_a_submitter_that_may_not_lead_hands_the_commit_to_the_committer(st: Storage) -> None:
    """A write stream with another batch unanswered submits with may_lead=False: its
    thread returns at once (to read the next batch) and the committer thread
    commits; the acknowledgement still comes only after the fsync."""
    acked: list[tuple[str, object, int]] = []
    done = threading.Event()

    def callback(results: object, exc: BaseException | None) -> None:
        acked.append((threading.current_thread().name, results, st.stats.fsyncs))
        done.set()

    st.submit_cb([entry(prewrite(5000))], callback, may_lead=False)
    assert done.wait(10)
    assert acked == [("pump-committer", [None], 1)]
    ok(st, commit(5000, 5001))
    assert served(st) == [(5001, 5000)]


# ---------------------------------------------------------------------------- reads


def test_read_window_order_and_bounds(st: Storage) -> None:
    # Commit order differs from start order and from arrival order.
    for start in (50, 10, 30, 20, 40):
        ok(st, prewrite(start))
    for start, commit_ts in [(20, 100), (50, 90), (40, 70), (30, 60), (10, 60)]:
        ok(st, commit(start, commit_ts))
    assert served(st) == [(60, 10), (60, 30), (70, 40), (90, 50), (100, 20)]
    # [start, end) on commit_ts.
    assert served(st, 60, 90) == [(60, 10), (60, 30), (70, 40)]
    assert served(st, 61, 100) == [(70, 40), (90, 50)]
    assert served(st, 101, 200) == []


def test_read_window_batches(st: Storage) -> None:
    for i in range(10):
        txn(st, 100 + i, 200 + i, pad=100)
    batches = list(st.read_window(0, 1000, max_txns=3))
    assert [len(b) for b in batches] == [3, 3, 3, 1]
    assert [b.commit_ts for batch in batches for b in batch] == list(range(200, 210))
    # A byte limit cuts batches too (soft: a batch ends once it reaches the limit).
    size = len(prewrite(100, pad=100).SerializeToString())
    by_bytes = list(st.read_window(0, 1000, max_bytes=2 * size))
    assert [len(b) for b in by_bytes] == [2, 2, 2, 2, 2]
    assert [len(b) for b in st.read_window(0, 1000, max_bytes=2 * size + 1)] == [3, 3, 3, 1]
    assert list(st.read_window(500, 1000)) == []


def test_rolled_back_never_served(st: Storage) -> None:
    ok(st, prewrite(10), prewrite(11))
    ok(st, rollback(10))
    ok(st, commit(11, 30))
    ok(st, fake(50))
    assert served(st) == [(30, 11)]
    assert st.safe_ts == 50


def test_fake_binlog_moves_bound_only(st: Storage) -> None:
    ok(st, fake(100))
    assert st.safe_ts == 100 and st.max_commit_ts == 0
    assert served(st) == []
    ok(st, prewrite(150))
    ok(st, fake(200))
    assert st.safe_ts == 150  # held by the pending prewrite
    # A fake binlog from outside (not internal) is refused: no prewrite for it.
    (err,) = st.write([entry(fake(300), internal=False)])
    assert isinstance(err, errors.FailedPrecondition)


def test_pending_older_than_names_the_writer(st: Storage) -> None:
    ok(st, prewrite(10))
    assert list(st.pending_older_than(0.0)) == [[(10, b"w1")]]
    assert list(st.pending_older_than(3600.0)) == []


def test_wait_safe(st: Storage) -> None:
    assert not st.wait_safe(100, timeout=0.05)
    threading.Timer(0.1, lambda: ok(st, fake(150))).start()
    assert st.wait_safe(100, timeout=5)


# ---------------------------------------------------------------------------- restart and recovery


def snapshot(st: Storage) -> dict[str, object]:
    return {
        "served": served(st),
        "pending": sorted(ts for ts, _ in st.index.pending()),
        "pending_count": st.pending_count,
        "safe_ts": st.safe_ts,
        "bound": st.sorter.bound,
        "max_commit_ts": st.max_commit_ts,
        "gc_ts": st.gc_ts,
    }


def populate(st: Storage) -> None:
    txn(st, 10, 20)
    txn(st, 15, 25)
    ok(st, prewrite(30))  # pending
    ok(st, prewrite(31))
    ok(st, rollback(31))
    ok(st, fake(40))


def test_reopen_after_close_keeps_everything(sdir: pathlib.Path) -> None:
    st = Storage(sdir, segment_bytes=SEG)
    populate(st)
    before = snapshot(st)
    assert before["served"] == [(20, 10), (25, 15)]
    assert before["pending"] == [30] and before["safe_ts"] == 30 and before["bound"] == 40
    st.close()
    st = Storage(sdir, segment_bytes=SEG)
    try:
        assert snapshot(st) == before
        # The state machine remembers finished transactions too.
        assert isinstance(write(st, commit(31, 50))[0], errors.FailedPrecondition)
        assert isinstance(write(st, commit(10, 20))[0], errors.AlreadyExists)
        assert isinstance(write(st, prewrite(30))[0], errors.AlreadyExists)
        ok(st, commit(30, 45))
        assert served(st)[-1] == (45, 30) and st.safe_ts == 45
    finally:
        st.close()


def test_recovery_replays_records_past_the_index_head(sdir: pathlib.Path) -> None:
    """A crash after the fsync but before the index batch: the log has records the
    index does not; reopening replays them exactly once."""
    st = Storage(sdir, segment_bytes=SEG)
    populate(st)
    head_before = st.index.head()
    st.close()

    log = ValueLog(sdir / "vlog", segment_bytes=SEG)
    extra = [prewrite(50), commit(50, 60), commit(30, 55), prewrite(70), fake(80)]
    log.append([b.SerializeToString() for b in extra])
    log.sync()
    log.close()

    st = Storage(sdir, segment_bytes=SEG)
    try:
        after = snapshot(st)
        assert after["served"] == [(20, 10), (25, 15), (55, 30), (60, 50)]
        assert after["pending"] == [70] and after["pending_count"] == 1
        assert after["bound"] == 80 and after["max_commit_ts"] == 60 and after["safe_ts"] == 70
        assert st.index.head() != head_before and st.index.head() == st.vlog.head
    finally:
        st.close()
    # Reopening again replays nothing new and duplicates nothing.
    st = Storage(sdir, segment_bytes=SEG)
    try:
        assert snapshot(st) == after
        assert isinstance(write(st, prewrite(50))[0], errors.AlreadyExists)
        ok(st, commit(70, 90))
        assert served(st)[-1] == (90, 70)
    finally:
        st.close()


def test_recovery_without_index_head_replays_whole_log_once(sdir: pathlib.Path) -> None:
    st = Storage(sdir, segment_bytes=SEG)
    populate(st)
    for i in range(6):  # spread over several segments
        txn(st, 100 + i, 200 + i, pad=1500)
    ok(st, fake(300))
    before = snapshot(st)
    st.close()

    db = plyvel.DB(str(sdir / "index"))
    db.delete(ix.META_HEAD)
    db.close()

    st = Storage(sdir, segment_bytes=SEG)
    try:
        assert len(st.vlog.segments()) > 1
        assert snapshot(st) == before
        assert len(served(st)) == len(set(served(st))) == 8
    finally:
        st.close()


def test_recovery_cuts_torn_tail(sdir: pathlib.Path) -> None:
    st = Storage(sdir, segment_bytes=1 << 20)
    txn(st, 10, 20)
    ok(st, prewrite(30))
    before = snapshot(st)
    st.close()
    seg = sorted((sdir / "vlog").glob("*.vlog"))[-1]
    good = seg.stat().st_size
    torn = prewrite(40).SerializeToString()
    with seg.open("ab") as fh:
        fh.write(encode_record(torn)[:-5])
    st = Storage(sdir, segment_bytes=1 << 20)
    try:
        assert seg.stat().st_size == good
        assert snapshot(st) == before
        ok(st, prewrite(40), commit(30, 50), commit(40, 60))
        assert served(st) == [(20, 10), (50, 30), (60, 40)]
    finally:
        st.close()
    st = Storage(sdir, segment_bytes=1 << 20)
    try:
        assert served(st) == [(20, 10), (50, 30), (60, 40)]
    finally:
        st.close()


def test_second_storage_on_same_dir_refused(sdir: pathlib.Path, st: Storage) -> None:
    with pytest.raises(errors.FailedPrecondition, match="another Pump"):
        Storage(sdir)


def test_closed_storage_refuses_writes(sdir: pathlib.Path) -> None:
    st = Storage(sdir)
    st.close()
    st.close()  # twice is harmless
    with pytest.raises(errors.Unavailable, match="closed"):
        st.submit([entry(prewrite(1))])


# ---------------------------------------------------------------------------- GC


def test_gc_removes_below_gc_ts_and_refuses_reads_below(st: Storage) -> None:
    for i in range(10):
        txn(st, 100 * (i + 1), 100 * (i + 1) + 50)  # commits 150, 250, ..., 1050
    ok(st, prewrite(2000), rollback(2000))
    ok(st, fake(5000))
    result = st.gc(650)
    assert result == {"gc_ts": 650, "txns": 5, "segments": 0}
    assert st.gc_ts == 650
    assert served(st, 650) == [(c, c - 50) for c in (650, 750, 850, 950, 1050)]
    with pytest.raises(errors.OutOfRange, match="below this pump's GC ts 650"):
        served(st, 649, 1000)
    # Removed transactions are forgotten by the index entirely.
    assert st.index.db.get(ix.txn_key(100)) is None
    assert st.index.db.get(ix.txn_key(600)) is not None
    # Rollbacks below the GC ts go too.
    st.gc(3000)
    assert st.index.db.get(ix.rollback_key(2000)) is None
    assert st.index.db.get(ix.txn_key(2000)) is None
    assert served(st, 3000) == []


def test_gc_clamped_to_safe_ts_and_never_backwards(st: Storage) -> None:
    txn(st, 100, 150)
    ok(st, prewrite(400))
    ok(st, fake(1000))
    assert st.safe_ts == 400
    assert st.gc(10_000)["gc_ts"] == 400  # clamped to the safe ts
    assert st.gc_ts == 400
    assert st.gc(200) == {"gc_ts": 400, "txns": 0, "segments": 0}  # never backwards
    assert st.gc_ts == 400
    ok(st, commit(400, 500))  # commits above the GC ts are still stored and served
    assert served(st, 400) == [(500, 400)]
    assert st.gc(800)["gc_ts"] == 800
    assert served(st, 800, 1000) == []


def test_gc_ts_survives_restart(sdir: pathlib.Path) -> None:
    st = Storage(sdir)
    txn(st, 100, 150)
    ok(st, fake(1000))
    st.gc(500)
    st.close()
    st = Storage(sdir)
    try:
        assert st.gc_ts == 500
        with pytest.raises(errors.OutOfRange):
            served(st, 0, 600)
    finally:
        st.close()


def test_gc_deletes_old_segments_but_not_a_pending_prewrites(sdir: pathlib.Path) -> None:
    st = Storage(sdir, segment_bytes=SEG)
    try:
        for i in range(9):  # ~1.5 KiB prewrites: two per segment
            txn(st, 100 + 10 * i, 105 + 10 * i, pad=1500)
        first_segments = st.vlog.segments()
        assert len(first_segments) >= 4
        ok(st, prewrite(1000, pad=1500))  # pending: it stays pending across GC
        pending_seg = st.index.pending()[0][1].segment
        for i in range(6):
            txn(st, 1100 + 10 * i, 1105 + 10 * i, pad=1500)
        ok(st, fake(5000))
        assert st.safe_ts == 1000
        segments_before = st.vlog.segments()

        result = st.gc(5000)
        assert result["gc_ts"] == 1000 and result["txns"] == 9
        assert result["segments"] > 0
        remaining = st.vlog.segments()
        assert remaining[0] == pending_seg
        assert set(segments_before) - set(remaining) == set(range(segments_before[0], pending_seg))
        # The pending prewrite is intact and its transaction completes.
        assert list(st.pending_older_than(0.0)) == [[(1000, b"w1")]]
        ok(st, commit(1000, 6000))
        got = [b for batch in st.read_window(1000, 7000) for b in batch]
        assert [(b.commit_ts, b.start_ts) for b in got] == [
            *[(1105 + 10 * i, 1100 + 10 * i) for i in range(6)], (6000, 1000)
        ]
        assert all(row_start_ts(b) == b.start_ts for b in got)

        # Committed at 6000, it keeps its segment alive while the GC ts is at or below 6000...
        ok(st, fake(7000))
        st.gc(6000)
        assert st.vlog.segments()[0] == pending_seg
        assert [b.start_ts for batch in st.read_window(6000, 7000) for b in batch] == [1000]
        # ...and once the GC ts passes it, its segment goes.
        st.gc(6001)
        assert st.vlog.segments()[0] > pending_seg
        # The active segment is never deleted.
        st.gc(7000)
        assert st.vlog.head[0] in st.vlog.segments()
        ok(st, prewrite(8000), commit(8000, 8001))
    finally:
        st.close()
    # Recovery after GC deleted the first segments still works.
    st = Storage(sdir, segment_bytes=SEG)
    try:
        assert st.gc_ts == 7000
        ok(st, fake(9000))
        assert served(st, 7000) == [(8001, 8000)]
    finally:
        st.close()


# ---------------------------------------------------------------------------- acknowledge before indexing


def test_safe_ts_does_not_move_back_across_reopen(sdir: pathlib.Path) -> None:
    """A prewrite stored under bound 100 holds the safe ts at 100, not at its
    start_ts 50; its floor is kept in the index, so a restart keeps 100 too."""
    st = Storage(sdir)
    ok(st, fake(100))
    ok(st, prewrite(50))
    ok(st, fake(200))
    assert st.safe_ts == 100
    st.close()
    st = Storage(sdir)
    try:
        assert st.safe_ts == 100 and st.is_pending(50)
        ok(st, commit(50, 210))
        assert st.safe_ts == 210
    finally:
        st.close()


def test_acknowledged_before_indexed_and_replayed(sdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``submit`` resolves on the value-log fsync, before the index batch: with
    the index batch failing, the writes are still acknowledged (checked in
    memory: the duplicate prewrite is refused), the index holds none of them,
    and reopening replays them exactly once."""
    from binlake import failpoint
    from binlake.pump.storage import FAILPOINT_BEFORE_INDEX

    monkeypatch.setenv(failpoint.ENV, f"{FAILPOINT_BEFORE_INDEX}:raise")
    failpoint._hits.clear()
    st = Storage(sdir)
    try:
        results = st.submit([entry(prewrite(10)), entry(commit(10, 20)), entry(prewrite(10))]).result(10)
        assert results[:2] == [None, None] and isinstance(results[2], errors.AlreadyExists)
        assert not st.wait_indexed(timeout=5)  # the index batch failed: nothing was indexed
        assert st.index.db.get(ix.txn_key(10)) is None and st.index.pending() == []
        with pytest.raises(errors.Unavailable, match="fatal"):
            st.submit([entry(prewrite(11))])
    finally:
        st.close()
    monkeypatch.delenv(failpoint.ENV)
    st = Storage(sdir)
    try:
        ok(st, fake(30))
        assert served(st) == [(20, 10)]
        assert isinstance(write(st, commit(10, 20))[0], errors.AlreadyExists)
    finally:
        st.close()
    st = Storage(sdir)
    try:
        assert served(st) == [(20, 10)]
    finally:
        st.close()


def test_finished_transactions_forgotten_by_memory_are_checked_in_the_index(
    sdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import binlake.pump.storage as storage_mod

    monkeypatch.setattr(storage_mod, "DONE_MEMORY", 2)
    st = Storage(sdir)
    try:
        for i in range(6):
            txn(st, 100 + i, 200 + i)
        assert len(st._done) <= 3 and st._done_floor >= 100
        assert isinstance(write(st, prewrite(100))[0], errors.AlreadyExists)
        assert isinstance(write(st, commit(101, 999))[0], errors.FailedPrecondition)
        ok(st, prewrite(99))  # below the floor but never seen: a new transaction
    finally:
        st.close()


def test_prewrites_are_acknowledged_after_their_fsync_and_only_fsynced_records_are_indexed(
    st: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The durability rule: a prewrite's acknowledgement comes after an fsync that
    covers it; a commit's may come before (it is fsynced with a later group or
    by the committer thread within ``COMMIT_SYNC_DELAY_S``, no reader asking);
    and the indexer (hence the safe ts and every read) never gets a record no
    fsync covers yet. Fsyncs run outside the leadership (pipelined), so other
    groups may be appended while a prewrite's fsync runs: what is checked is the
    prewrite's own record against the synced head at its acknowledgement."""
    unsynced_index: list[tuple[int, int]] = []
    queue_for_index = st._queue_for_index

    def checked(durable: list) -> None:  # type: ignore[type-arg]
        # On the fsync's thread, as it hands records to the indexer.
        synced = st.vlog.synced_head
        unsynced_index.extend((p.segment, p.end) for w in durable for p in w.pointers
                              if (p.segment, p.end) > synced)
        queue_for_index(durable)

    monkeypatch.setattr(st, "_queue_for_index", checked)
    # (kind, start_ts, synced head at the ack, head at the ack)
    acks: list[tuple[str, int, tuple[int, int], tuple[int, int]]] = []

    def submit(kind: str, b: binlog_pb2.Binlog) -> None:
        done = threading.Event()

        def cb(res: object, exc: BaseException | None) -> None:
            acks.append((kind, b.start_ts, st.vlog.synced_head, st.vlog.head))
            assert res == [None] and exc is None
            done.set()

        st.submit_cb([entry(b)], cb)
        assert done.wait(10)

    def writer(base: int) -> None:
        for i in range(40):
            submit("prewrite", prewrite(base + i))
            submit("commit", commit(base + i, base + 10_000 + i))

    threads = [threading.Thread(target=writer, args=(1000 * (k + 1),)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Each prewrite's record (its pointer, from the index) ends at or before the
    # synced head its acknowledgement saw.
    late = []
    for kind, start, synced, _head in acks:
        if kind == "prewrite":
            st.wait_indexed(timeout=5)
            ptr = ix.decode_txn(st.index.db.get(ix.txn_key(start)))[2]
            if (ptr.segment, ptr.end) > synced:
                late.append(start)
    assert len([a for a in acks if a[0] == "prewrite"]) == 120 and late == []
    # Some commits were acknowledged before their fsync.
    assert any(synced < head for kind, _s, synced, head in acks if kind == "commit")
    # No reader asks: the committer thread fsyncs the last commits within its delay.
    deadline = time.monotonic() + 5
    while st.vlog.synced_head != st.vlog.head and time.monotonic() < deadline:
        time.sleep(0.001)
    assert st.vlog.synced_head == st.vlog.head
    assert st.wait_indexed(timeout=5)
    assert unsynced_index == []
    assert len(served(st)) == 120 and st.pending_count == 0


def test_commits_are_acknowledged_while_a_prewrite_fsync_runs(st: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pipelined group commit: while a prewrite group waits in its fsync, another
    thread's group of commits is appended and acknowledged; the prewrite is
    acknowledged only once an fsync covering it returned. A commit for a
    prewrite no fsync has covered yet waits for one (never acknowledged on the
    strength of a record a power loss could take)."""
    ok(st, prewrite(100))
    in_fsync = threading.Event()
    release = threading.Event()
    sync_appended = st.vlog.sync_appended

    def slow_sync() -> int:  # every fsync waits for the test's word
        in_fsync.set()
        assert release.wait(10)
        return sync_appended()

    monkeypatch.setattr(st.vlog, "sync_appended", slow_sync)
    order: list[str] = []
    acked = {name: threading.Event() for name in ("prewrite 200", "commit 100", "commit 200")}

    def submit(name: str, b: binlog_pb2.Binlog) -> None:
        # Each on a thread of its own: a submitting thread may be the one that fsyncs.
        def cb(res: object, exc: BaseException | None) -> None:
            assert res == [None] and exc is None, (res, exc)
            order.append(name)
            acked[name].set()

        threading.Thread(target=st.submit_cb, args=([entry(b)], cb), daemon=True).start()

    submit("prewrite 200", prewrite(200))
    assert in_fsync.wait(10)
    # The commit of an earlier (durable) prewrite: acknowledged while the fsync waits.
    submit("commit 100", commit(100, 150))
    assert acked["commit 100"].wait(10) and not acked["prewrite 200"].is_set()
    # The commit of prewrite 200, whose fsync has not returned: it waits for an fsync.
    submit("commit 200", commit(200, 250))
    assert not acked["commit 200"].wait(0.2) and not acked["prewrite 200"].is_set()
    release.set()
    assert acked["prewrite 200"].wait(10) and acked["commit 200"].wait(10)
    assert order == ["commit 100", "prewrite 200", "commit 200"]
    assert st.wait_indexed(timeout=5) and served(st) == [(150, 100), (250, 200)]
