"""What each Pump holds that no other Pump holds (replicated Pumps, ``replicas`` > 1).

A transaction acknowledged at ``min_acks`` W is on at least W Pumps; one written
while Pumps were down (with W < R), or a prewrite a Pump resolved alone, may be
on one Pump only. ``binlake ctl pumps`` shows those counts, and
``binlake ctl offline-pump`` refuses to retire a Pump holding the only copy of
anything not consumed yet (unless ``--force``), naming the windows that would be
lost. The comparison reads, from every reachable Pump, the keys (commit_ts,
start_ts; no mutations) of the transactions between the consumers' lowest
checkpoint (below it nothing is needed any more) and the lowest safe ts of the
reachable Pumps (above it a copy may still arrive), and merges the Pumps' ordered
streams as they come, keeping per Pump a count and its spans' edges: bounded
memory however many transactions are unconsumed.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Iterator, Mapping, Sequence

from binlake import errors, tso
from binlake.client.reader import pull_pump
from binlake.registry.model import ConsumerRecord, NodeRecord, NodeState

# How many separate commit_ts spans a refusal names before it summarises.
MAX_SPANS = 5


@dataclasses.dataclass
class SoleCopies:
    """One Pump's transactions found on no other reachable Pump in [start_ts, end_ts):
    how many, the first and last commit_ts, and the commit_ts spans [first, last] of
    sole copies not interleaved with replicated transactions (the windows a loss of
    this Pump would leave holes in; the first ``MAX_SPANS`` kept, all counted).
    Built one transaction at a time (``add``): nothing per transaction is kept."""

    node_id: str
    start_ts: int
    end_ts: int
    count: int = 0
    first: int = 0
    last: int = 0
    spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    span_count: int = 0

    def add(self, commit_ts: int, shared_below: int | None) -> None:
        """One more sole copy, in commit_ts order; ``shared_below``: the largest
        commit_ts below it of a transaction found on two Pumps or more (None: none)."""
        if self.count and (shared_below is None or shared_below < self.last):
            if self.span_count <= MAX_SPANS:
                self.spans[-1] = (self.spans[-1][0], commit_ts)
        else:
            self.span_count += 1
            if self.span_count <= MAX_SPANS:
                self.spans.append((commit_ts, commit_ts))
        if not self.count:
            self.first = commit_ts
        self.count += 1
        self.last = commit_ts


def unconsumed_range(consumers: Sequence[ConsumerRecord], pumps: Sequence[NodeRecord]) -> tuple[int, int]:
    """[lowest consumer checkpoint (or lowest GC ts), lowest safe ts) of the Pumps given."""
    low = min((c.checkpoint_ts for c in consumers), default=min((p.gc_ts for p in pumps), default=0))
    high = min((p.safe_ts for p in pumps), default=0)
    return max(low, max((p.gc_ts for p in pumps), default=0)), high


class _PumpFailed(Exception):
    def __init__(self, node_id: str, why: str) -> None:
        super().__init__(why)
        self.node_id, self.why = node_id, why


def _tagged(node: str, keys: Iterator[tuple[int, int]]) -> Iterator[tuple[int, int, str]]:
    for commit_ts, start_ts in keys:
        yield commit_ts, start_ts, node


def merge_sole_copies(streams: Mapping[str, Iterator[tuple[int, int]]], start_ts: int,
                      end_ts: int) -> dict[str, SoleCopies]:
    """Per Pump, its sole copies, from each Pump's (commit_ts, start_ts) keys in
    order: one merge of the ordered streams, holding one key per Pump and the
    spans' edges, never a set of the transactions."""
    out = {node: SoleCopies(node, start_ts, end_ts) for node in streams}
    merged = heapq.merge(*(_tagged(node, keys) for node, keys in streams.items()))
    current: int | None = None
    # The largest commit_ts of a replicated transaction: seen so far, and below the current commit_ts.
    shared_max: int | None = None
    shared_below: int | None = None
    for (commit_ts, _start), group in itertools.groupby(merged, key=lambda k: (k[0], k[1])):
        if commit_ts != current:
            current, shared_below = commit_ts, shared_max
        holders = [node for _c, _s, node in group]
        if len(holders) > 1:
            shared_max = commit_ts
        else:
            out[holders[0]].add(commit_ts, shared_below)
    return out


def _keys(p: NodeRecord, start: int, end: int, timeout_s: float) -> Iterator[tuple[int, int]]:
    try:
        for b in pull_pump(p.addr, start, end, node_id=p.node_id, timeout_s=timeout_s, keys_only=True):
            yield b.commit_ts, b.start_ts
    except errors.BinlakeError as exc:
        raise _PumpFailed(p.node_id, errors.first_line(exc)) from None


def sole_copies(pumps: Sequence[NodeRecord], consumers: Sequence[ConsumerRecord],
                timeout_s: float = 60.0) -> tuple[dict[str, SoleCopies], dict[str, str]]:
    """Per reachable Pump, its sole copies, and the unreachable Pumps (id -> why).
    The Pumps' keys are merged as they stream (``merge_sole_copies``); a Pump that
    fails is counted unreachable and the merge runs again without it."""
    live = [p for p in pumps if p.state is not NodeState.OFFLINE]
    start, end = unconsumed_range(consumers, live)
    down: dict[str, str] = {}
    while True:
        reading = [p for p in live if p.node_id not in down]
        if start >= end:
            return {p.node_id: SoleCopies(p.node_id, start, end) for p in reading}, down
        try:
            return merge_sole_copies({p.node_id: _keys(p, start, end, timeout_s) for p in reading},
                                     start, end), down
        except _PumpFailed as exc:
            down[exc.node_id] = exc.why


def refusal(node_id: str, sole: SoleCopies) -> str:
    """The one line ``offline-pump`` refuses with, naming the windows that would be lost."""
    named = ", ".join(f"[{tso.format_ts(a)}, {tso.format_ts(b)}]" for a, b in sole.spans[:MAX_SPANS])
    more = f" and {sole.span_count - MAX_SPANS} more" if sole.span_count > MAX_SPANS else ""
    return (f"pump {node_id} holds the only copy of {sole.count} transaction(s) not yet consumed, "
            f"commit_ts {named}{more}: retiring it loses them if its disk goes; let the consumers pass "
            "them (binlake ctl consumers) or bring the other pumps back, or retire it anyway with --force")
