"""The sorter's bookkeeping: pending transactions and the safe ts."""

from __future__ import annotations

from binlake.pump.sorter import Pending, SafeTs


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_safe_ts_is_min_of_bound_and_oldest_pending() -> None:
    s = SafeTs()
    assert s.safe_ts == 0
    s.fake(100)
    assert s.safe_ts == 100
    s.prewrite(120)
    assert s.safe_ts == 100  # the bound is lower than the pending start
    s.fake(150)
    assert s.safe_ts == 120  # now the pending prewrite holds it
    s.prewrite(130)  # arrives when the bound is 150: it will commit above 150
    assert s.safe_ts == 120
    s.commit(120, 160)
    assert (s.bound, s.max_commit_ts) == (160, 160)
    assert s.safe_ts == 150  # next pending: its floor is the bound it arrived under
    s.rollback(130)
    assert s.safe_ts == 160  # nothing pending: the bound
    s.fake(140)  # an older fake binlog never moves the bound back
    assert s.bound == 160 and s.safe_ts == 160
    s.commit(200, 170)  # a commit moves both the bound and max commit ts
    assert s.max_commit_ts == 170 and s.safe_ts == 170
    s.fake(500)
    assert s.max_commit_ts == 170 and s.safe_ts == 500  # fake binlogs are not real commits


def test_initial_bound() -> None:
    s = SafeTs(bound=42)
    assert s.safe_ts == 42
    s.prewrite(10, recovered=True)  # found at start-up: only its start_ts is known
    assert s.safe_ts == 10


def test_late_prewrite_never_moves_the_safe_ts_back() -> None:
    s = SafeTs()
    s.fake(1000)
    assert s.safe_ts == 1000
    # A prewrite with an old start_ts arriving now commits above 1000.
    s.prewrite(10)
    assert s.safe_ts == 1000
    s.fake(2000)
    assert s.safe_ts == 1000  # it still holds the safe ts at its floor
    s.commit(10, 1500)
    assert s.safe_ts == 2000


def test_pending_lazy_deletion() -> None:
    p = Pending()
    for ts in (30, 10, 20, 40):
        p.add(ts, f"loc{ts}", arrived=0.0)
    assert len(p) == 4 and p.oldest() == 10
    # Removing one below the top leaves its heap entry behind (lazily dropped later).
    p.remove(20)
    assert 20 not in p and len(p) == 3
    assert len(p._heap) == 4
    assert p.oldest() == 10
    assert p.location(20) is None
    # Removing the top pops it and every already-removed entry under it.
    p.remove(10)
    assert p.oldest() == 30
    assert sorted(start for _floor, start in p._heap) == [30, 40]
    # Removing something unknown is harmless.
    p.remove(999)
    assert len(p) == 2 and p.oldest() == 30
    p.remove(40)
    p.remove(30)
    assert len(p) == 0 and p.oldest() is None and p._heap == []


def test_pending_membership_and_location() -> None:
    p = Pending()
    p.add(5, ("seg", 1), arrived=1.0)
    assert 5 in p and 6 not in p
    assert p.location(5) == ("seg", 1)
    assert p.location(6) is None


def test_older_than() -> None:
    p = Pending()
    p.add(1, "a", arrived=10.0)
    p.add(2, "b", arrived=12.0)
    p.add(3, "c", arrived=15.0)
    assert sorted(p.older_than(5.0, now=15.0)) == [(1, "a")]
    assert sorted(p.older_than(3.0, now=15.0)) == [(1, "a"), (2, "b")]  # boundary is inclusive
    assert sorted(p.older_than(0.0, now=15.0)) == [(1, "a"), (2, "b"), (3, "c")]
    assert p.older_than(100.0, now=15.0) == []
    p.remove(1)
    assert sorted(p.older_than(0.0, now=15.0)) == [(2, "b"), (3, "c")]


def test_safe_ts_uses_its_clock_for_arrival() -> None:
    clock = Clock()
    s = SafeTs(clock=clock)
    s.prewrite(7, "loc7")
    clock.now += 9.0
    s.prewrite(8, "loc8")
    assert s.pending.older_than(5.0, clock.now) == [(7, "loc7")]
    clock.now += 9.0
    assert sorted(s.pending.older_than(5.0, clock.now)) == [(7, "loc7"), (8, "loc8")]
