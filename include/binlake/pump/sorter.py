"""The sorter's bookkeeping: which transactions are pending, and the safe ts.

A Pump's *safe ts* S promises: every transaction routed to this Pump with
commit_ts < S is stored, complete. Two facts give it:

* ``bound``: the largest fake-binlog ts or commit_ts stored. A writer fetches
  its commit_ts only after its prewrite was acknowledged, so any transaction
  whose prewrite is not here yet will commit above every ts this Pump has
  already seen.
* the oldest pending prewrite: a transaction whose prewrite is here but whose
  commit is not has commit_ts > start_ts, so the window below its start_ts is
  unaffected, and the window above it must wait.

So ``safe_ts = min(bound, oldest pending floor)``, where a pending
transaction's *floor* is ``max(start_ts, bound when its prewrite was stored)``:
its writer fetches commit_ts after the prewrite's acknowledgement, so the
commit lands above every ts the Pump had seen by then. The floor keeps the safe
ts from moving backwards when a prewrite with an old start_ts arrives late.
The storage keeps each pending prewrite's floor in the index beside it, so a
restart restores the same floors and the safe ts never moves back across a
crash (a prewrite stored without one gets start_ts: conservative). This module is pure bookkeeping (no I/O), driven by the
storage's indexer in value-log order (so ``bound`` at a prewrite is what the log
held before it, whenever the indexer gets to it).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any

# The heap is rebuilt from the pending set once it holds this many entries more
# than twice the pending transactions (see ``Pending``).
COMPACT_SLACK = 1024


class Pending:
    """Pending transactions with O(1) membership and amortised O(log n) oldest.

    Bounded by the pending set, not by what finished meanwhile: a finished
    transaction's heap entry is dropped lazily when it reaches the top, so behind
    one old pending prewrite every later transaction's entry would stay; once
    the heap holds more than twice the pending set (plus ``COMPACT_SLACK``) it is
    rebuilt from the pending set alone (amortised O(1) per removal)."""

    __slots__ = ("_info", "_heap")

    def __init__(self) -> None:
        # start_ts -> (arrival monotonic time, where the prewrite is stored, floor)
        self._info: dict[int, tuple[float, Any, int]] = {}
        # (floor, start_ts); see the module docstring for the floor.
        self._heap: list[tuple[int, int]] = []

    def add(self, start_ts: int, location: Any, arrived: float, floor: int = 0) -> None:
        floor = max(start_ts, floor)
        self._info[start_ts] = (arrived, location, floor)
        heapq.heappush(self._heap, (floor, start_ts))

    def location(self, start_ts: int) -> Any:
        info = self._info.get(start_ts)
        return None if info is None else info[1]

    def arrived(self, start_ts: int) -> float | None:
        """When the pending prewrite of ``start_ts`` arrived (None: not pending)."""
        info = self._info.get(start_ts)
        return None if info is None else info[0]

    def remove(self, start_ts: int) -> None:
        self._info.pop(start_ts, None)
        heap, info = self._heap, self._info
        # Lazy deletion: drop finished entries only when they reach the top...
        while heap and heap[0][1] not in info:
            heapq.heappop(heap)
        # ...and rebuild once finished ones dominate (an old prewrite still pending).
        if len(heap) > 2 * len(info) + COMPACT_SLACK:
            self._heap = [(f, ts) for ts, (_a, _l, f) in info.items()]
            heapq.heapify(self._heap)

    def heap_size(self) -> int:
        """Entries the heap holds (pending ones and finished ones not yet dropped)."""
        return len(self._heap)

    def starts(self) -> list[int]:
        """Every pending start_ts."""
        return list(self._info)

    def __contains__(self, start_ts: int) -> bool:
        return start_ts in self._info

    def __len__(self) -> int:
        return len(self._info)

    def oldest(self) -> int | None:
        """The lowest floor among pending transactions (None when none is pending)."""
        return self._heap[0][0] if self._heap else None

    def older_than(self, age_s: float, now: float) -> list[tuple[int, Any]]:
        """(start_ts, location) of transactions waiting longer than ``age_s``."""
        return [(ts, loc) for ts, (arrived, loc, _f) in self._info.items() if now - arrived >= age_s]


class SafeTs:
    """The safe-ts bound and the pending set together."""

    def __init__(self, bound: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.bound = bound
        self.max_commit_ts = 0
        self.pending = Pending()
        self._clock = clock

    def prewrite(self, start_ts: int, location: Any = None, *, recovered: bool = False,
                 floor: int | None = None) -> int:
        """Add a pending prewrite; return its floor. ``floor``: the one stored with
        it (a prewrite found in the index at start-up); ``recovered`` without a
        stored floor: when it arrived is unknown, so the floor is its start_ts."""
        if floor is None:
            floor = start_ts if recovered else max(start_ts, self.bound)
        self.pending.add(start_ts, location, self._clock(), floor=floor)
        return floor

    def commit(self, start_ts: int, commit_ts: int) -> None:
        self.pending.remove(start_ts)
        self.bound = max(self.bound, commit_ts)
        self.max_commit_ts = max(self.max_commit_ts, commit_ts)

    def rollback(self, start_ts: int) -> None:
        self.pending.remove(start_ts)

    def fake(self, ts: int) -> None:
        self.bound = max(self.bound, ts)

    @property
    def safe_ts(self) -> int:
        oldest = self.pending.oldest()
        return self.bound if oldest is None else min(self.bound, oldest)
