"""What only one Pump holds: the commit_ts spans ``ctl offline-pump`` names, the
range of binlogs compared (from the consumers' checkpoint to the lowest safe ts),
and the merge of the Pumps' ordered key streams in bounded memory."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Iterator

from binlake.ctl.replicas import MAX_SPANS, merge_sole_copies, refusal, unconsumed_range
from binlake.registry.model import ConsumerRecord, NodeRecord


def _spans(sole: list[int], shared: list[int]) -> list[tuple[int, int]]:
    """The spans by their definition: a replicated commit_ts strictly between two
    sole copies (or equal to the earlier one) separates them."""
    out: list[tuple[int, int]] = []
    for ts in sole:
        if out and not any(out[-1][1] <= s < ts for s in shared):
            out[-1] = (out[-1][0], ts)
        else:
            out.append((ts, ts))
    return out


def test_spans_break_only_at_replicated_transactions() -> None:
    # p1 alone: 10 11 15 40 41 90; 20 and 50 on both Pumps.
    streams = {"p1": iter([(10, 1), (11, 2), (15, 3), (20, 4), (40, 5), (41, 6), (50, 7), (90, 8)]),
               "p2": iter([(20, 4), (50, 7)])}
    out = merge_sole_copies(streams, 0, 100)
    assert out["p1"].spans == [(10, 15), (40, 41), (90, 90)] and out["p1"].count == 6
    assert (out["p1"].first, out["p1"].last) == (10, 90)
    assert out["p2"].count == 0 and out["p2"].spans == []
    line = refusal("p1", out["p1"])
    assert "only copy of 6 transaction(s)" in line and "--force" in line and line.count("[") == 3


def test_the_merge_matches_the_definition_on_random_placements() -> None:
    rng = random.Random(7)
    for _ in range(50):
        keys = sorted({(rng.randrange(60), rng.randrange(1000)) for _ in range(40)})
        held: dict[str, list[tuple[int, int]]] = {"p1": [], "p2": [], "p3": []}
        for k in keys:
            for node in rng.sample(sorted(held), rng.choice((1, 1, 2, 3))):
                held[node].append(k)
        shared = sorted(c for c, s in keys if sum((c, s) in v for v in held.values()) > 1)
        out = merge_sole_copies({n: iter(v) for n, v in held.items()}, 0, 100)
        for node, mine in held.items():
            sole = [c for c, s in mine if sum((c, s) in v for v in held.values()) == 1]
            want = _spans(sole, shared)
            assert out[node].count == len(sole)
            assert out[node].span_count == len(want) and out[node].spans == want[:MAX_SPANS]


def _stream(n: int, every: int) -> Iterator[tuple[int, int]]:
    return ((i, i) for i in range(0, n, every))


def test_the_merge_holds_no_set_of_the_transactions() -> None:
    peaks = []
    for n in (10_000, 100_000):
        tracemalloc.start()
        out = merge_sole_copies({"p1": _stream(n, 1), "p2": _stream(n, 3)}, 0, n)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        # p2 holds every third: p1's sole copies come in runs of two between them.
        assert out["p1"].count == n - len(range(0, n, 3))
        assert out["p1"].span_count == len({i // 3 for i in range(n) if i % 3})
        assert len(out["p1"].spans) == MAX_SPANS
    # Ten times the transactions, the same memory (a set of them would be ten times larger).
    assert peaks[1] < peaks[0] * 1.5 + (16 << 10), peaks


def test_compared_range_starts_at_the_lowest_checkpoint() -> None:
    pumps = [NodeRecord("p1", "pump", "127.0.0.1:1", safe_ts=500, gc_ts=5),
             NodeRecord("p2", "pump", "127.0.0.1:2", safe_ts=400, gc_ts=7)]
    assert unconsumed_range([ConsumerRecord("lake", 100), ConsumerRecord("other", 300)], pumps) == (100, 400)
    # No consumer: everything the Pumps still hold (above the highest GC ts, readable on all).
    assert unconsumed_range([], pumps) == (7, 400)
