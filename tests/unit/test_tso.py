"""Tests of binlake.tso: TSO composition, datetime conversion, and the allocator's
promise that timestamps strictly increase across threads, clock jumps and crashes."""

from __future__ import annotations

import datetime as dt
import itertools
import random
import threading

import pytest

from binlake import tso

UTC = dt.UTC
MAX_PHYSICAL = tso.MAX_TS >> tso.LOGICAL_BITS


# -- composition -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("physical", "logical"),
    [(0, 0), (0, 1), (1, 0), (1_763_712_000_000, 12345), (MAX_PHYSICAL, tso.MAX_LOGICAL - 1)],
)
def test_compose_round_trip(physical: int, logical: int) -> None:
    ts = tso.compose(physical, logical)
    assert tso.physical_ms(ts) == physical
    assert tso.logical(ts) == logical
    assert ts == physical * (1 << 18) + logical


def test_compose_edges() -> None:
    assert tso.compose(0) == 0
    assert tso.compose(MAX_PHYSICAL, tso.MAX_LOGICAL - 1) == tso.MAX_TS
    with pytest.raises(ValueError, match="too large"):
        tso.compose(MAX_PHYSICAL + 1, 0)
    with pytest.raises(ValueError, match="physical_ms must be >= 0"):
        tso.compose(-1, 0)
    with pytest.raises(ValueError, match="logical must be in"):
        tso.compose(0, tso.MAX_LOGICAL)
    with pytest.raises(ValueError, match="logical must be in"):
        tso.compose(0, -1)


@pytest.mark.parametrize("bad", ["1", 1.0, None])
def test_compose_rejects_non_integers(bad: object) -> None:
    with pytest.raises(TypeError):
        tso.compose(bad, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        tso.compose(0, bad)  # type: ignore[arg-type]


def test_compose_rejects_bool() -> None:
    with pytest.raises(TypeError):
        tso.compose(True, 0)


@pytest.mark.parametrize("fn", [tso.physical_ms, tso.logical, tso.to_datetime])
@pytest.mark.parametrize("bad", [True, False, "5", 5.0, None])
def test_readers_reject_non_integers(fn: object, bad: object) -> None:
    with pytest.raises(TypeError, match="a TSO is an integer"):
        fn(bad)  # type: ignore[operator]


@pytest.mark.parametrize("fn", [tso.physical_ms, tso.logical, tso.to_datetime])
@pytest.mark.parametrize("bad", [-1, tso.MAX_TS + 1])
def test_readers_reject_out_of_range(fn: object, bad: int) -> None:
    with pytest.raises(ValueError, match=r"a TSO must be in \[0, 2\^63\)"):
        fn(bad)  # type: ignore[operator]


def test_readers_accept_edges() -> None:
    assert tso.physical_ms(0) == 0 and tso.logical(0) == 0
    assert tso.physical_ms(tso.MAX_TS) == MAX_PHYSICAL
    assert tso.logical(tso.MAX_TS) == tso.MAX_LOGICAL - 1
    assert tso.to_datetime(0) == dt.datetime(1970, 1, 1, tzinfo=UTC)
    # The largest TSO is still a representable datetime (some time in the 3080s).
    far = tso.to_datetime(tso.MAX_TS)
    assert far.year > 3000
    assert tso.physical_ms(tso.from_datetime(far)) == MAX_PHYSICAL


# -- datetimes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "moment",
    [
        dt.datetime(1970, 1, 1, tzinfo=UTC),
        dt.datetime(2026, 11, 21, 8, 0, 0, 123000, tzinfo=UTC),
        dt.datetime(2000, 2, 29, 23, 59, 59, 999000, tzinfo=UTC),
    ],
)
def test_datetime_round_trip(moment: dt.datetime) -> None:
    ts = tso.from_datetime(moment)
    assert tso.logical(ts) == 0
    assert tso.to_datetime(ts) == moment


def test_from_datetime_truncates_to_the_millisecond() -> None:
    moment = dt.datetime(2026, 11, 21, 8, 0, 0, 123999, tzinfo=UTC)
    assert tso.to_datetime(tso.from_datetime(moment)) == moment.replace(microsecond=123000)


def test_from_datetime_naive_vs_aware() -> None:
    plus_two = dt.timezone(dt.timedelta(hours=2))
    naive = dt.datetime(2026, 11, 21, 10, 0, 0)
    utc_ts = tso.from_datetime(dt.datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC))
    # A naive datetime is UTC by default ...
    assert tso.from_datetime(naive) == utc_ts
    # ... or read in the zone given: 10:00 at +02:00 is 08:00 UTC.
    assert tso.from_datetime(naive, plus_two) == utc_ts - tso.compose(2 * 3600 * 1000)
    # An aware datetime keeps its own zone; tz does not reinterpret it.
    aware = dt.datetime(2026, 11, 21, 12, 0, 0, tzinfo=plus_two)
    assert tso.from_datetime(aware) == utc_ts
    assert tso.from_datetime(aware, dt.timezone(dt.timedelta(hours=-5))) == utc_ts


def test_to_datetime_in_a_zone() -> None:
    plus_two = dt.timezone(dt.timedelta(hours=2))
    ts = tso.from_datetime(dt.datetime(2026, 11, 21, 8, 0, 0, tzinfo=UTC))
    local = tso.to_datetime(ts, plus_two)
    assert local.utcoffset() == dt.timedelta(hours=2)
    assert (local.hour, local.minute) == (10, 0)
    assert local == tso.to_datetime(ts)


def test_from_datetime_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="before 1970-01-01"):
        tso.from_datetime(dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC))
    with pytest.raises(TypeError, match="expected a datetime"):
        tso.from_datetime(dt.date(2026, 1, 1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected a datetime"):
        tso.from_datetime("2026-01-01")  # type: ignore[arg-type]


def test_parse_datetime() -> None:
    expected = tso.from_datetime(dt.datetime(2026, 11, 21, 8, 0, tzinfo=UTC))
    assert tso.parse_datetime("2026-11-21T08:00:00") == expected
    assert tso.parse_datetime("2026-11-21T09:00:00+01:00") == expected
    assert tso.parse_datetime("2026-11-21T09:00:00", dt.timezone(dt.timedelta(hours=1))) == expected


@pytest.mark.parametrize("text", ["yesterday", "", "2026-13-01T00:00:00", "21/11/2026"])
def test_parse_datetime_errors_are_clear(text: str) -> None:
    with pytest.raises(ValueError) as info:
        tso.parse_datetime(text)
    message = str(info.value)
    assert repr(text) in message
    assert "ISO-8601" in message


def test_parse_datetime_before_epoch() -> None:
    with pytest.raises(ValueError, match="before 1970"):
        tso.parse_datetime("1960-01-01T00:00:00")


def test_format_ts() -> None:
    assert tso.format_ts(0) == "-"
    ts = tso.from_datetime(dt.datetime(2026, 11, 21, 8, 0, 0, 5000, tzinfo=UTC)) + 7
    assert tso.format_ts(ts) == f"{ts} (2026-11-21 08:00:00.005Z)"


# -- the allocator ----------------------------------------------------------------------


class MemoryLimit:
    """A saved TSO limit in memory: a 'crash' is simply dropping the allocator."""

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self.saves = 0

    def load(self) -> int:
        return self.limit

    def save(self, limit: int) -> None:
        self.limit = limit
        self.saves += 1


class FakeClock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def test_allocator_rejects_bad_arguments() -> None:
    limit = MemoryLimit()
    with pytest.raises(ValueError, match="window_ms"):
        tso.TSOAllocator(limit.load, limit.save, window_ms=0)
    alloc = tso.TSOAllocator(limit.load, limit.save)
    with pytest.raises(ValueError, match="count must be in"):
        alloc.allocate(0)
    with pytest.raises(ValueError, match="count must be in"):
        alloc.allocate(tso.MAX_LOGICAL + 1)
    with pytest.raises(TypeError):
        alloc.allocate(True)
    with pytest.raises(TypeError):
        alloc.allocate("3")  # type: ignore[arg-type]


def test_allocator_strictly_increasing_under_threads() -> None:
    limit = MemoryLimit()
    alloc = tso.TSOAllocator(limit.load, limit.save, window_ms=50)
    per_thread: list[list[int]] = [[] for _ in range(8)]
    start = threading.Barrier(len(per_thread))

    def worker(out: list[int]) -> None:
        start.wait()
        for _ in range(3000):
            out.append(alloc.allocate())

    threads = [threading.Thread(target=worker, args=(out,)) for out in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for out in per_thread:
        assert all(a < b for a, b in itertools.pairwise(out))
    everything = [ts for out in per_thread for ts in out]
    assert len(set(everything)) == len(everything)
    # The saved limit covers every ts handed out.
    assert max(tso.physical_ms(ts) for ts in everything) < limit.limit


def test_allocator_batches_are_contiguous_and_disjoint() -> None:
    limit = MemoryLimit()
    clock = FakeClock(1_000_000)
    alloc = tso.TSOAllocator(limit.load, limit.save, clock_ms=clock)
    rng = random.Random(7)
    ranges: list[tuple[int, int]] = []
    for i in range(500):
        count = rng.choice([1, 2, 17, 1000, 40_000, tso.MAX_LOGICAL])
        first = alloc.allocate(count)
        ranges.append((first, first + count))
        if i % 50 == 0:
            clock.now_ms += 1
    for (_, a_end), (b_first, _) in itertools.pairwise(ranges):
        assert a_end <= b_first, "batches overlap or go backwards"
    for first, end in ranges:
        # A batch never straddles a millisecond: all of it has one physical part.
        assert tso.physical_ms(first) == tso.physical_ms(end - 1)


def test_allocator_logical_overflow_borrows_next_millisecond() -> None:
    limit = MemoryLimit()
    clock = FakeClock(5_000)
    alloc = tso.TSOAllocator(limit.load, limit.save, clock_ms=clock)
    first = alloc.allocate(tso.MAX_LOGICAL - 10)
    assert first == tso.compose(5_000, 0)
    nxt = alloc.allocate(20)
    assert nxt == tso.compose(5_001, 0)
    # The clock is still at 5000, yet the allocator never returns to it.
    after = alloc.allocate(1)
    assert after == tso.compose(5_001, 20)
    # Filling a whole millisecond exactly.
    full = alloc.allocate(tso.MAX_LOGICAL)
    assert full == tso.compose(5_002, 0)
    assert alloc.allocate(1) == tso.compose(5_003, 0)


def test_allocator_clock_going_backwards() -> None:
    limit = MemoryLimit()
    clock = FakeClock(10_000)
    alloc = tso.TSOAllocator(limit.load, limit.save, clock_ms=clock)
    before = alloc.allocate(5)
    clock.now_ms = 4_000  # an NTP step backwards
    handed_out = [alloc.allocate() for _ in range(100)]
    assert handed_out[0] > before
    assert all(a < b for a, b in itertools.pairwise(handed_out))
    clock.now_ms = 20_000
    assert tso.physical_ms(alloc.allocate()) == 20_000


def test_allocator_restart_after_crash_with_clock_behind() -> None:
    limit = MemoryLimit()
    clock = FakeClock(100_000)
    alloc = tso.TSOAllocator(limit.load, limit.save, window_ms=3000, clock_ms=clock)
    handed_out = []
    for step in range(200):
        handed_out.append(alloc.allocate(1 + step % 7))
        clock.now_ms += 37  # crosses the saved limit several times
    assert limit.saves > 1
    highest = max(handed_out)
    assert tso.physical_ms(highest) < limit.limit
    # Crash: the allocator vanishes; the new one starts from the saved limit only,
    # on a machine whose clock is far behind.
    del alloc
    restarted = tso.TSOAllocator(limit.load, limit.save, window_ms=3000, clock_ms=FakeClock(1_000))
    fresh = [restarted.allocate() for _ in range(1000)]
    assert min(fresh) > highest
    assert all(a < b for a, b in itertools.pairwise(fresh))
    # And a crash of the restarted allocator is equally safe.
    again = tso.TSOAllocator(limit.load, limit.save, window_ms=3000, clock_ms=FakeClock(1_000))
    assert again.allocate() > max(fresh)


def test_allocator_never_hands_out_past_an_unsaved_limit() -> None:
    limit = MemoryLimit()
    clock = FakeClock(50_000)
    alloc = tso.TSOAllocator(limit.load, limit.save, window_ms=100, clock_ms=clock)
    last = alloc.allocate()

    def failing_save(new_limit: int) -> None:
        raise OSError("disk full")

    alloc._save_limit = failing_save  # the disk fails from now on
    clock.now_ms += 1000  # past the saved limit: a new limit must be saved first
    with pytest.raises(OSError, match="disk full"):
        alloc.allocate()
    assert tso.physical_ms(last) < limit.limit
    restarted = tso.TSOAllocator(limit.load, limit.save, window_ms=100, clock_ms=FakeClock(0))
    assert restarted.allocate() > last
