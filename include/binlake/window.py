"""A commit_ts window and the one rule that says whether a Pump can serve it.

``Window(start_ts, end_ts)`` is ``[start_ts, end_ts)``, validated once where it is
built (integers, TSOs in [0, 2^63), start before end). ``readiness`` is the rule
the window planner, the Pump's PullBinlogs and the Airflow trigger all apply to a
Pump: the window is *gone* when the Pump's GC ts is above its start (binlogs of
the window were collected), *waiting* while the Pump's safe ts is below its end
(transactions of the window may still arrive), else *ready*.
"""

from __future__ import annotations

import dataclasses
import enum

from binlake import errors, tso


@dataclasses.dataclass(frozen=True)
class Window:
    """``[start_ts, end_ts)`` of commit_ts; construction checks it."""

    start_ts: int
    end_ts: int

    def __post_init__(self) -> None:
        for name in ("start_ts", "end_ts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise errors.InvalidArgument(f"{name} must be an integer TSO, got {v!r}")
            if not 0 <= v <= tso.MAX_TS:
                raise errors.InvalidArgument(f"{name} must be a TSO in [0, 2^63), got {v}")
        if self.start_ts >= self.end_ts:
            raise errors.InvalidArgument(
                f"window [{self.start_ts}, {self.end_ts}) is empty: start_ts must be less than end_ts")

    def __str__(self) -> str:
        return f"[{self.start_ts}, {self.end_ts})"


class Readiness(enum.Enum):
    READY = "ready"
    WAITING = "waiting"  # the safe ts is below the window end
    GONE = "gone"  # the GC ts is above the window start


def readiness(window: Window, safe_ts: int, gc_ts: int) -> Readiness:
    """Whether a Pump with ``safe_ts`` and ``gc_ts`` can serve ``window`` completely now."""
    if gc_ts > window.start_ts:
        return Readiness.GONE
    if safe_ts < window.end_ts:
        return Readiness.WAITING
    return Readiness.READY


def gone_error(window: Window, pump: str, gc_ts: int) -> errors.OutOfRange:
    """The refusal for a window below a Pump's GC ts (same words everywhere)."""
    return errors.OutOfRange(
        f"window {window} starts below pump {pump}'s GC ts {tso.format_ts(gc_ts)}: its binlogs before that "
        "were removed after their retention (or by a hard GC limit past a consumer's checkpoint); start the "
        "window at or above the GC ts (or restore from a snapshot)")


def waiting_error(window: Window, pump: str, safe_ts: int) -> errors.FailedPrecondition:
    """The refusal for a window above a Pump's safe ts."""
    return errors.FailedPrecondition(
        f"window end {window.end_ts} is above pump {pump}'s safe ts {tso.format_ts(safe_ts)}: "
        "transactions below the window end may still arrive; retry later or pull with wait")
