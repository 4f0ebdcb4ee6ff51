"""The one window type and the one readiness rule the planner, the Pumps and the
Airflow trigger share."""

from __future__ import annotations

import pytest

from binlake import errors, tso
from binlake.window import (
    PumpView,
    Readiness,
    Window,
    cluster_readiness,
    gone_error,
    readiness,
    waiting_error,
)


def test_window_is_validated_where_it_is_built() -> None:
    assert str(Window(1, 2)) == "[1, 2)"
    for start, end, match in ((2, 2, "empty"), (3, 2, "empty"), (-1, 2, r"\[0, 2\^63\)"),
                              (0, tso.MAX_TS + 1, r"\[0, 2\^63\)"), (True, 2, "integer"), (1.0, 2, "integer")):
        with pytest.raises(errors.InvalidArgument, match=match):
            Window(start, end)  # type: ignore[arg-type]


@pytest.mark.parametrize(("safe_ts", "gc_ts", "expected"), [
    (20, 10, Readiness.READY),     # safe ts at the end, GC ts at the start: both edges included
    (19, 10, Readiness.WAITING),   # a transaction with commit_ts 19 may still arrive
    (30, 11, Readiness.GONE),      # commit_ts 10 may have been collected
    (5, 11, Readiness.GONE),       # gone wins: waiting cannot bring it back
])
def test_readiness(safe_ts: int, gc_ts: int, expected: Readiness) -> None:
    assert readiness(Window(10, 20), safe_ts, gc_ts) is expected


def test_refusals_name_the_pump_and_its_ts() -> None:
    gone = str(gone_error(Window(10, 20), "p1", 11))
    assert "below pump p1's GC ts 11 (" in gone and "removed after their retention" in gone
    assert errors.is_final(gone_error(Window(10, 20), "p1", 11))
    waiting = waiting_error(Window(10, 20), "p1", 19)
    assert "above pump p1's safe ts 19 (" in str(waiting) and not errors.is_final(waiting)


def test_cluster_readiness_skips_at_most_w_minus_one_unreachable_pumps() -> None:
    w = Window(10, 20)
    up, behind, down = PumpView("a", True, 25, 5), PumpView("b", True, 15, 5), PumpView("c", False)
    # W = 1 (no replication): an unreachable Pump holds the window back, as before.
    v = cluster_readiness(w, [up, down], 1)
    assert (v.state, v.waiting) == (Readiness.WAITING, ("c",))
    assert "unreachable pump(s) c" in v.describe(w)
    # W = 2: one unreachable Pump is skipped; the window is served from the others.
    v = cluster_readiness(w, [up, PumpView("d", True, 20, 10), down], 2)
    assert (v.state, v.serve_from, v.skipped) == (Readiness.READY, ("a", "d"), ("c",))
    assert v.describe(w) == ""
    # ... but every reachable Pump must have passed the window.
    v = cluster_readiness(w, [up, behind, down], 2)
    assert (v.state, v.waiting) == (Readiness.WAITING, ("b",))
    assert "safe ts of b" in v.describe(w) and "unreachable" not in v.describe(w)
    # Two unreachable with W = 2: wait, naming both.
    v = cluster_readiness(w, [up, down, PumpView("e", False)], 2)
    assert (v.state, v.waiting) == (Readiness.WAITING, ("c", "e"))
    # Nobody reachable to serve from: wait even within W - 1.
    assert cluster_readiness(w, [down], 2).state is Readiness.WAITING
    # A reachable Pump whose GC passed the window start: gone.
    v = cluster_readiness(w, [up, PumpView("g", True, 30, 11), down], 2)
    assert (v.state, v.gone) == (Readiness.GONE, "g")
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="min_acks"):
            cluster_readiness(w, [up], bad)  # type: ignore[arg-type]
