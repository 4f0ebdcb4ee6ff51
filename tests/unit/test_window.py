"""The one window type and the one readiness rule the planner, the Pumps and the
Airflow trigger share."""

from __future__ import annotations

import pytest

from binlake import errors, tso
from binlake.window import Readiness, Window, gone_error, readiness, waiting_error


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
