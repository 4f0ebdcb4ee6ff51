"""What only one Pump holds: the commit_ts spans ``ctl offline-pump`` names, and the
range of binlogs compared (from the consumers' checkpoint to the lowest safe ts)."""

from __future__ import annotations

from binlake.ctl.replicas import SoleCopies, refusal, unconsumed_range
from binlake.registry.model import ConsumerRecord, NodeRecord


def test_spans_break_only_at_replicated_transactions() -> None:
    sole = SoleCopies("p1", 0, 100, [10, 11, 15, 40, 41, 90])
    # 20 and 50 are on two Pumps: the sole copies around them form separate spans.
    assert sole.spans([20, 50]) == [(10, 15), (40, 41), (90, 90)]
    assert sole.spans([]) == [(10, 90)]
    line = refusal("p1", sole, [20, 50])
    assert "only copy of 6 transaction(s)" in line and "--force" in line and line.count("[") == 3


def test_compared_range_starts_at_the_lowest_checkpoint() -> None:
    pumps = [NodeRecord("p1", "pump", "127.0.0.1:1", safe_ts=500, gc_ts=5),
             NodeRecord("p2", "pump", "127.0.0.1:2", safe_ts=400, gc_ts=7)]
    assert unconsumed_range([ConsumerRecord("lake", 100), ConsumerRecord("other", 300)], pumps) == (100, 400)
    # No consumer: everything the Pumps still hold (above the highest GC ts, readable on all).
    assert unconsumed_range([], pumps) == (7, 400)
