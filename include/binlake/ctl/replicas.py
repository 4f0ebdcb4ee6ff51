"""What each Pump holds that no other Pump holds (replicated Pumps, ``replicas`` > 1).

A transaction acknowledged at ``min_acks`` W is on at least W Pumps; one written
while Pumps were down (with W < R), or a prewrite a Pump resolved alone, may be
on one Pump only. ``binlake ctl pumps`` shows those counts, and
``binlake ctl offline-pump`` refuses to retire a Pump holding the only copy of
anything not consumed yet (unless ``--force``), naming the windows that would be
lost. The comparison reads, from every reachable Pump, the complete transactions
between the consumers' lowest checkpoint (below it nothing is needed any more)
and the lowest safe ts of the reachable Pumps (above it a copy may still arrive).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from binlake import errors, tso
from binlake.client.reader import pull_pump
from binlake.registry.model import ConsumerRecord, NodeRecord, NodeState

# How many separate commit_ts spans a refusal names before it summarises.
MAX_SPANS = 5


@dataclasses.dataclass
class SoleCopies:
    """One Pump's transactions found on no other reachable Pump in [start_ts, end_ts)."""

    node_id: str
    start_ts: int
    end_ts: int
    commit_ts: list[int] = dataclasses.field(default_factory=list)

    def spans(self, others: Sequence[int]) -> list[tuple[int, int]]:
        """Commit_ts spans [first, last] of sole copies not interleaved with replicated
        transactions (``others``, sorted): the windows a loss of this Pump would leave holes in."""
        out: list[tuple[int, int]] = []
        j = 0
        for ts in self.commit_ts:
            while j < len(others) and others[j] < ts:
                j += 1
            if out and (j == 0 or others[j - 1] < out[-1][1]):
                out[-1] = (out[-1][0], ts)
            else:
                out.append((ts, ts))
        return out


def unconsumed_range(consumers: Sequence[ConsumerRecord], pumps: Sequence[NodeRecord]) -> tuple[int, int]:
    """[lowest consumer checkpoint (or lowest GC ts), lowest safe ts) of the Pumps given."""
    low = min((c.checkpoint_ts for c in consumers), default=min((p.gc_ts for p in pumps), default=0))
    high = min((p.safe_ts for p in pumps), default=0)
    return max(low, max((p.gc_ts for p in pumps), default=0)), high


def sole_copies(pumps: Sequence[NodeRecord], consumers: Sequence[ConsumerRecord],
                timeout_s: float = 60.0) -> tuple[dict[str, SoleCopies], dict[str, str], list[int]]:
    """Per reachable Pump, its sole copies; the unreachable Pumps (id -> why); and
    the sorted commit_ts of every transaction found on two Pumps or more."""
    live = [p for p in pumps if p.state is not NodeState.OFFLINE]
    held: dict[str, set[tuple[int, int]]] = {}
    down: dict[str, str] = {}
    start, end = unconsumed_range(consumers, live)
    for p in live:
        if start >= end:
            held[p.node_id] = set()
            continue
        try:
            held[p.node_id] = {(b.commit_ts, b.start_ts)
                               for b in pull_pump(p.addr, start, end, node_id=p.node_id, timeout_s=timeout_s)}
        except errors.BinlakeError as exc:
            down[p.node_id] = errors.first_line(exc)
    counts: dict[tuple[int, int], int] = {}
    for keys in held.values():
        for k in keys:
            counts[k] = counts.get(k, 0) + 1
    out = {node: SoleCopies(node, start, end, sorted(c for c, s in keys if counts[(c, s)] == 1))
           for node, keys in held.items()}
    shared = sorted(c for (c, _s), n in counts.items() if n > 1)
    return out, down, shared


def refusal(node_id: str, sole: SoleCopies, shared: Sequence[int]) -> str:
    """The one line ``offline-pump`` refuses with, naming the windows that would be lost."""
    spans = sole.spans(shared)
    named = ", ".join(f"[{tso.format_ts(a)}, {tso.format_ts(b)}]" for a, b in spans[:MAX_SPANS])
    more = f" and {len(spans) - MAX_SPANS} more" if len(spans) > MAX_SPANS else ""
    return (f"pump {node_id} holds the only copy of {len(sole.commit_ts)} transaction(s) not yet consumed, "
            f"commit_ts {named}{more}: retiring it loses them if its disk goes; let the consumers pass "
            "them (binlake ctl consumers) or bring the other pumps back, or retire it anyway with --force")
