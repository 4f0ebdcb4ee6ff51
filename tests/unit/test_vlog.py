"""The value log: records, segments, torn tails and damage."""

from __future__ import annotations

import os
import pathlib
import zlib

import pytest

from binlake import errors
from binlake.pump.vlog import HEADER, MAGIC, CorruptLog, Pointer, ValueLog, encode_record

SEG = 4096


def payload(i: int, size: int = 1000) -> bytes:
    body = f"record-{i:06d}-".encode()
    return (body * (size // len(body) + 1))[:size]


def seg_path(directory: pathlib.Path, segment: int) -> pathlib.Path:
    return directory / f"{segment:012d}.vlog"


def flip_byte(path: pathlib.Path, offset: int) -> None:
    with path.open("r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


@pytest.fixture
def vdir(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "vlog"


def test_record_round_trip(vdir: pathlib.Path) -> None:
    log = ValueLog(vdir, segment_bytes=1 << 20)
    items = [b"", b"a", payload(1, 10), payload(2, 5000), bytes(range(256))]
    ptrs = log.append(items)
    assert log.sync() >= 1
    for ptr, item in zip(ptrs, items, strict=True):
        assert ptr.length == len(item)
        assert log.read(ptr) == item
    # Records are back to back, and the head is just past the last one.
    for a, b in zip(ptrs, ptrs[1:], strict=False):
        assert b.offset == a.end
    assert log.head == (1, ptrs[-1].end)
    assert [(p, d) for p, d in log.scan(1, 0)] == list(zip(ptrs, items, strict=True))
    # Scanning from the middle yields the rest.
    assert [d for _, d in log.scan(1, ptrs[2].offset)] == items[2:]
    log.close()
    # The on-disk layout is the documented one.
    raw = seg_path(vdir, 1).read_bytes()
    assert raw.startswith(encode_record(b"") + encode_record(b"a"))
    assert HEADER.unpack_from(raw, 0) == (MAGIC, 0, zlib.crc32(b""))
    # Reopen: everything still readable, appends continue after the last record.
    log = ValueLog(vdir, segment_bytes=1 << 20)
    assert log.head == (1, ptrs[-1].end)
    assert [log.read(p) for p in ptrs] == items
    (more,) = log.append([b"after reopen"])
    log.sync()
    assert more.offset == ptrs[-1].end
    assert log.read(more) == b"after reopen"
    log.close()


def test_pointer_pack_round_trip() -> None:
    ptr = Pointer(segment=7, offset=123456789012, length=4242)
    assert Pointer.unpack(ptr.pack()) == ptr
    assert Pointer.unpack(b"xx" + ptr.pack(), 2) == ptr
    assert ptr.end == 123456789012 + HEADER.size + 4242


def test_segment_rolls_at_segment_bytes(vdir: pathlib.Path) -> None:
    log = ValueLog(vdir, segment_bytes=SEG)
    rec = HEADER.size + 1000
    per_segment = SEG // rec  # 4 records of 1012 bytes fit in 4096
    items = [payload(i) for i in range(10)]
    ptrs = log.append(items[:3]) + log.append(items[3:])
    log.sync()
    assert [p.segment for p in ptrs] == [1 + i // per_segment for i in range(10)]
    assert log.segments() == [1, 2, 3]
    for ptr in ptrs:
        assert ptr.end <= SEG
    for seg in (1, 2):
        assert seg_path(vdir, seg).stat().st_size == per_segment * rec
    assert log.head == (3, 2 * rec)
    assert [d for _, d in log.scan(1, 0)] == items
    # A scan starting inside segment 2 continues into segment 3.
    assert [d for _, d in log.scan(2, ptrs[5].offset)] == items[5:]
    # A record larger than a whole segment still goes somewhere (alone in a fresh segment).
    (big,) = log.append([b"B" * (2 * SEG)])
    log.sync()
    assert big.segment == 4 and big.offset == 0
    assert log.read(big) == b"B" * (2 * SEG)
    log.close()
    reopened = ValueLog(vdir, segment_bytes=SEG)
    assert reopened.segments() == [1, 2, 3, 4]
    assert [d for _, d in reopened.scan(1, 0)] == [*items, b"B" * (2 * SEG)]
    reopened.close()


@pytest.mark.parametrize(
    "damage",
    ["cut_payload", "cut_header", "garbage", "cut_and_garbage", "bad_crc"],
)
def test_torn_tail_is_cut_and_appends_continue(vdir: pathlib.Path, damage: str) -> None:
    log = ValueLog(vdir, segment_bytes=1 << 20)
    items = [payload(i, 300) for i in range(5)]
    ptrs = log.append(items)
    log.close()
    path = seg_path(vdir, 1)
    last = ptrs[-1]
    with path.open("r+b") as fh:
        if damage == "cut_payload":
            fh.truncate(last.offset + HEADER.size + 100)
        elif damage == "cut_header":
            fh.truncate(last.offset + 5)
        elif damage == "garbage":
            fh.seek(0, os.SEEK_END)
            fh.write(os.urandom(77))
        elif damage == "cut_and_garbage":
            fh.truncate(last.offset + HEADER.size + 100)
            fh.seek(0, os.SEEK_END)
            fh.write(b"\x00garbage\xff" * 9)
        else:
            fh.seek(last.offset + HEADER.size + 10)
            fh.write(b"!")
    good = items if damage == "garbage" else items[:-1]
    good_end = ptrs[len(good) - 1].end

    log = ValueLog(vdir, segment_bytes=1 << 20)
    assert [d for _, d in log.scan(1, 0)] == good
    assert path.stat().st_size == good_end
    assert log.head == (1, good_end)
    new = log.append([b"new-1", b"new-2"])
    log.sync()
    assert new[0].offset == good_end
    assert [log.read(p) for p in new] == [b"new-1", b"new-2"]
    log.close()

    log = ValueLog(vdir, segment_bytes=1 << 20)
    assert [d for _, d in log.scan(1, 0)] == [*good, b"new-1", b"new-2"]
    log.close()


def test_zeros_written_ahead_end_the_records_after_a_crash(vdir: pathlib.Path) -> None:
    """The newest segment is zero-filled ahead of its records. After a crash (no
    close) the zeros mark the end; a record of the unacknowledged last group that
    reached the disk past a lost header is cut off on open, so the appends that
    follow never make it readable again (here the next record ends exactly where
    it starts)."""
    log = ValueLog(vdir, segment_bytes=1 << 20)
    items = [payload(i, 300) for i in range(3)]
    ptrs = log.append(items)
    log.sync()
    path = seg_path(vdir, 1)
    assert path.stat().st_size > ptrs[-1].end  # written ahead
    stale_at = ptrs[-1].end + HEADER.size + 100
    with path.open("r+b") as fh:
        fh.seek(stale_at)
        fh.write(encode_record(b"never acknowledged"))
    os.close(log._fd)  # the process dies: no close()

    log = ValueLog(vdir, segment_bytes=1 << 20)
    assert path.stat().st_size == ptrs[-1].end and log.head == (1, ptrs[-1].end)
    assert [d for _, d in log.scan(1, 0)] == items
    (new,) = log.append([b"x" * 100])
    log.sync()
    assert new.end == stale_at
    os.close(log._fd)  # crashes again

    log = ValueLog(vdir, segment_bytes=1 << 20)
    assert [d for _, d in log.scan(1, 0)] == [*items, b"x" * 100]
    log.close()
    assert path.stat().st_size == new.end  # a clean close leaves no zeros behind


def test_torn_tail_only_in_the_scanned_part(vdir: pathlib.Path) -> None:
    """A scan that starts past the good records still cuts the torn tail."""
    log = ValueLog(vdir, segment_bytes=SEG)
    ptrs = log.append([payload(i) for i in range(6)])  # segments 1 and 2
    log.close()
    with seg_path(vdir, 2).open("ab") as fh:
        fh.write(HEADER.pack(MAGIC, 500, 0) + b"short")
    log = ValueLog(vdir, segment_bytes=SEG)
    assert [p for p, _ in log.scan(2, ptrs[-1].end)] == []
    assert seg_path(vdir, 2).stat().st_size == ptrs[-1].end
    log.close()


def test_corruption_in_older_segment_raises(vdir: pathlib.Path) -> None:
    log = ValueLog(vdir, segment_bytes=SEG)
    ptrs = log.append([payload(i) for i in range(10)])
    log.close()
    victim = ptrs[1]
    assert victim.segment == 1
    flip_byte(seg_path(vdir, 1), victim.offset + HEADER.size + 3)
    log = ValueLog(vdir, segment_bytes=SEG)
    with pytest.raises(CorruptLog, match="not the newest segment"):
        list(log.scan(1, 0))
    # Nothing was cut: damage is reported, not "repaired".
    assert seg_path(vdir, 1).stat().st_size == 4 * (HEADER.size + 1000)
    # A bad magic number in an older segment is damage too.
    log.close()
    with seg_path(vdir, 2).open("r+b") as fh:
        fh.write(b"\0\0\0\0")
    log = ValueLog(vdir, segment_bytes=SEG)
    with pytest.raises(CorruptLog, match="bad magic"):
        list(log.scan(2, 0))
    log.close()


def test_read_detects_checksum_mismatch(vdir: pathlib.Path) -> None:
    log = ValueLog(vdir, segment_bytes=1 << 20)
    a, b = log.append([payload(1, 200), payload(2, 200)])
    log.sync()
    assert log.read(a) == payload(1, 200)
    flip_byte(seg_path(vdir, 1), a.offset + HEADER.size + 50)
    with pytest.raises(CorruptLog, match="checksum"):
        log.read(a)
    # A pointer whose length disagrees with the header is refused too.
    with pytest.raises(CorruptLog):
        log.read(Pointer(b.segment, b.offset, b.length - 1))
    # A pointer past the end of the file is "short".
    with pytest.raises(CorruptLog, match="short"):
        log.read(Pointer(1, b.end, 10))
    assert log.read(b) == payload(2, 200)
    log.close()


def test_remove_below_never_removes_active_segment(vdir: pathlib.Path) -> None:
    log = ValueLog(vdir, segment_bytes=SEG)
    ptrs = log.append([payload(i) for i in range(10)])
    log.sync()
    assert log.segments() == [1, 2, 3]
    assert log.read(ptrs[0]) == payload(0)  # opens a cached read fd for segment 1
    assert log.remove_below(2) == [1]
    assert log.segments() == [2, 3]
    with pytest.raises(errors.OutOfRange, match="removed by GC"):
        log.read(ptrs[0])
    # Asking for far more than exists stops at the active segment.
    assert log.remove_below(1_000) == [2]
    assert log.segments() == [3]
    assert log.remove_below(1_000) == []
    assert log.read(ptrs[-1]) == payload(9)
    (p,) = log.append([b"still appending"])
    log.sync()
    assert p.segment == 3 and log.read(p) == b"still appending"
    log.close()


def test_roll_makes_old_segment_durable_before_the_next_exists(
    vdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torn record may only ever sit in the newest segment (anything else is
    reported as damage), so the old segment is fsynced before the new one is
    created. The real calls run; they are only recorded, in order."""
    import binlake.pump.vlog as vlog_mod

    log = ValueLog(vdir, segment_bytes=SEG)
    events: list[tuple[str, object]] = []
    fd_paths: dict[int, str] = {}
    real_open, real_fdatasync = os.open, os.fdatasync

    def spy_open(path, flags, *args):
        fd = real_open(path, flags, *args)
        fd_paths[fd] = pathlib.Path(path).name
        events.append(("open", pathlib.Path(path).name))
        return fd

    def spy_fdatasync(fd):
        events.append(("fdatasync", fd_paths.get(fd, fd)))
        return real_fdatasync(fd)

    fd_paths[log._fd] = "000000000001.vlog"
    monkeypatch.setattr(vlog_mod.os, "open", spy_open)
    monkeypatch.setattr(vlog_mod.os, "fdatasync", spy_fdatasync)
    ptrs = log.append([payload(i) for i in range(6)])  # crosses into segment 2 in one batch
    assert [p.segment for p in ptrs] == [1, 1, 1, 1, 2, 2]
    assert events.index(("fdatasync", "000000000001.vlog")) < events.index(("open", "000000000002.vlog"))
    assert log.sync() == 2  # the rolled-over segment's fsync is counted too
    assert events[-1] == ("fdatasync", "000000000002.vlog")
    monkeypatch.undo()
    assert [log.read(p) for p in ptrs] == [payload(i) for i in range(6)]
    log.close()


def test_segment_bytes_minimum(vdir: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="segment_bytes"):
        ValueLog(vdir, segment_bytes=100)


def test_sync_appended_runs_beside_appends_and_rolls(vdir: pathlib.Path) -> None:
    """The Pump fsyncs outside the append leadership: ``sync_appended`` on other
    threads while one thread appends across many segment rolls (each roll closes
    the descriptor a sync may be using) never fails, counts the rolls' fsyncs,
    and ``mark_synced`` only ever moves the synced head of the newest segment
    forward, never past what was appended."""
    import threading

    log = ValueLog(vdir, segment_bytes=SEG)
    stop = threading.Event()
    errs: list[BaseException] = []
    fsyncs = [0]

    def syncer() -> None:
        while not stop.is_set():
            try:
                head = log.head
                fsyncs[0] += log.sync_appended()
                log.mark_synced(head)
                assert log.synced_head <= log.head
            except BaseException as exc:  # pragma: no cover - reported below
                errs.append(exc)
                return

    threads = [threading.Thread(target=syncer) for _ in range(2)]
    for t in threads:
        t.start()
    ptrs = []
    for i in range(200):
        ptrs += log.append([payload(i, 700)])
    stop.set()
    for t in threads:
        t.join()
    assert errs == []
    assert ptrs[-1].segment > 20  # it rolled many times meanwhile
    head = log.head
    fsyncs[0] += log.sync_appended()
    log.mark_synced(head)
    assert log.synced_head == log.head
    assert fsyncs[0] >= ptrs[-1].segment  # every roll's fsync was counted
    assert [log.read(p) for p in ptrs] == [payload(i, 700) for i in range(200)]
    log.close()
