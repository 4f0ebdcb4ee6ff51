"""A commit_ts window and the one rule that says whether a Pump can serve it.

``Window(start_ts, end_ts)`` is ``[start_ts, end_ts)``, validated once where it is
built (integers, TSOs in [0, 2^63), start before end). ``readiness`` is the rule
the window planner, the Pump's PullBinlogs and the Airflow trigger all apply to a
Pump;
``cluster_readiness`` applies it to every Pump that may hold a window, knowing
each transaction is on at least ``min_acks`` Pumps (replicated Pumps), and is
what the ingest trigger, the Spark data source, ``ctl dump`` and the apply ask.
For one Pump: the window is *gone* when the Pump's GC ts is above its start (binlogs of
the window were collected), *waiting* while the Pump's safe ts is below its end
(transactions of the window may still arrive), else *ready*.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

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


@dataclasses.dataclass(frozen=True)
class PumpView:
    """What a reader knows of one Pump that may hold a window's transactions:
    its safe ts and GC ts, or ``reachable=False`` when it did not answer."""

    node_id: str
    reachable: bool
    safe_ts: int = 0
    gc_ts: int = 0


def pump_views(pumps: Sequence[str], answers: Mapping[str, tuple[int, int]]) -> list[PumpView]:
    """The reachability rule of every reader (the read plan, the ingest trigger,
    ``ctl dump``): a Pump is reachable when it answered its own Status just now
    (``answers``: node id -> (safe ts, GC ts)), and unreachable when it did not,
    whatever the registry's last heartbeat of it says. A killed Pump's last
    heartbeat stays fresh for seconds; its Status call fails at once."""
    if isinstance(pumps, str):
        raise TypeError("pumps must be a sequence of node ids, not one string")
    return [PumpView(p, True, *answers[p]) if p in answers else PumpView(p, False) for p in pumps]


@dataclasses.dataclass(frozen=True)
class ClusterReadiness:
    """``cluster_readiness``'s verdict. ``serve_from`` are the Pumps to read when
    READY; ``waiting`` names the Pumps a WAITING window waits for; ``gone`` the
    Pump whose GC passed the window start; ``skipped`` the unreachable Pumps a
    READY window is served without."""

    state: Readiness
    serve_from: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    unreachable: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    gone: str = ""

    def describe(self, window: Window) -> str:
        """One line saying why the window is not ready (empty when it is)."""
        if self.state is Readiness.READY:
            return ""
        if self.state is Readiness.GONE:
            return f"window {window} starts below pump {self.gone}'s GC ts"
        behind = [p for p in self.waiting if p not in self.unreachable]
        parts = []
        if behind:
            parts.append(f"the safe ts of {', '.join(behind)} to pass {tso.format_ts(window.end_ts)}")
        if self.unreachable and set(self.unreachable) & set(self.waiting):
            parts.append(f"unreachable pump(s) {', '.join(self.unreachable)} (more than min_acks - 1 are down, so "
                         "an acknowledged transaction may be on them only)")
        return f"window {window} waits for " + " and ".join(parts)


def cluster_readiness(window: Window, pumps: list[PumpView], min_acks: int = 1) -> ClusterReadiness:
    """The one readiness rule for a window over every Pump that may hold its
    transactions, with each transaction acknowledged on at least ``min_acks`` (W)
    Pumps.

    Every reachable Pump must have passed the window (``readiness`` above). Up to
    W - 1 unreachable Pumps are skipped: every acknowledged transaction is on W
    Pumps, so at least one reachable Pump holds it. With more than W - 1
    unreachable the window waits for them (W = 1: any unreachable Pump holds the
    window back, as before replication)."""
    if isinstance(min_acks, bool) or not isinstance(min_acks, int) or min_acks < 1:
        raise ValueError(f"min_acks must be an integer >= 1, got {min_acks!r}")
    reachable = [p for p in pumps if p.reachable]
    unreachable = tuple(sorted(p.node_id for p in pumps if not p.reachable))
    for p in reachable:
        if readiness(window, p.safe_ts, p.gc_ts) is Readiness.GONE:
            return ClusterReadiness(Readiness.GONE, gone=p.node_id, unreachable=unreachable)
    behind = [p.node_id for p in reachable if readiness(window, p.safe_ts, p.gc_ts) is Readiness.WAITING]
    # Skipping needs someone to serve from: no reachable Pump at all waits too.
    too_many = len(unreachable) > min_acks - 1 or (unreachable and not reachable)
    waiting = sorted(behind) + (list(unreachable) if too_many else [])
    if waiting:
        return ClusterReadiness(Readiness.WAITING, waiting=tuple(waiting), unreachable=unreachable)
    return ClusterReadiness(Readiness.READY, serve_from=tuple(sorted(p.node_id for p in reachable)),
                            unreachable=unreachable, skipped=unreachable)
