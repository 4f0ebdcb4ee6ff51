"""The group pipeline of the sources against a real registry and Pump: groups
form from what waits (waiting only for the pace between steps), keep upstream order in their TSOs,
stay within their bounds, move the position only after the acknowledgement,
and hand a sender failure to the reader."""

from __future__ import annotations

import pathlib
import threading
import time

import pytest
from srckit import Cluster

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.source.emitter import Emitter
from binlake.source.journal import SourceState
from binlake.source.pipeline import GroupPipeline, Item


def value(i: int) -> binlog_pb2.PrewriteValue:
    m = binlog_pb2.TableMutation(table_id=100, inserted_rows=[i.to_bytes(4, "big") * 8],
                                 sequence=[binlog_pb2.INSERT])
    return binlog_pb2.PrewriteValue(schema_version=1, mutations=[m])


class Acks:
    """What the sender reported, in order (as a source's on_acked sees it)."""

    def __init__(self) -> None:
        self.groups: list[list[tuple[object, int, int]]] = []
        self.lock = threading.Lock()

    def __call__(self, items: list[Item], results: list[tuple[int, int]]) -> None:
        with self.lock:
            self.groups.append([(it.position, s, c) for it, (s, c) in zip(items, results, strict=True)])

    def flat(self) -> list[tuple[object, int, int]]:
        return [x for g in self.groups for x in g]


def test_groups_keep_order_and_bounds_and_form_only_from_what_waits(cluster: Cluster, tmp_path: pathlib.Path) -> None:
    state = SourceState(tmp_path / "d")
    emitter = Emitter(cluster.registry.addr, state, kind="test")
    acks = Acks()
    pipe = GroupPipeline(emitter, acks, max_txns=16)
    try:
        with pytest.raises(ValueError, match="both a key and a value"):
            Item("k", None, 1)
        # A burst: far more than one group's bound, with position-only items mixed in.
        for i in range(200):
            pipe.submit(Item(f"f:{i}", value(i), i) if i % 10 else Item(None, None, i))
        pipe.drain()
        got = acks.flat()
        assert [p for p, _s, _c in got] == list(range(200))  # every item once, in order
        sent = [(s, c) for p, s, c in got if p % 10]  # type: ignore[operator]
        assert all(s < c for s, c in sent)
        assert [c for _s, c in sent] == sorted(c for _s, c in sent)  # commit_ts order = upstream order
        assert all(s == 0 and c == 0 for p, s, c in got if not p % 10)  # type: ignore[operator]
        assert max(sum(1 for p, _s, _c in g if p % 10) for g in acks.groups) <= 16  # type: ignore[operator]
        assert pipe.groups < 180 / 4, "a burst is sent in groups"
        # The journal: one line per step, each beginning one group and deciding the one before.
        lines = (tmp_path / "d" / "journal.log").read_text().splitlines()
        assert len(lines) == pipe.steps <= pipe.groups + 1
        # A trickle: each transaction leaves alone, as soon as the sender is free (no waiting for more).
        groups_before, steps_before = pipe.groups, pipe.steps
        for i in range(200, 205):
            pipe.submit(Item(f"f:{i}", value(i), i))
            pipe.drain()
        assert pipe.groups == groups_before + 5
        assert pipe.steps == steps_before + 10  # apart: a prewrite step and a commit step each
        # The Pump serves each transaction once, with the TSOs the sender reported.
        served = [(b.start_ts, b.commit_ts) for b in cluster.binlogs()]
        assert served == [(s, c) for p, s, c in acks.flat() if s]
    finally:
        pipe.close()
        emitter.close()
        state.close()


@pytest.mark.parametrize("linger_s", [0.0, 0.3])
def test_a_commit_step_lingers_for_the_next_transaction(cluster: Cluster, tmp_path: pathlib.Path,
                                                        linger_s: float) -> None:
    """Transactions 100 ms apart: without a linger each costs two steps (prewrite, then
    commit); lingering 300 ms, each commit step also prewrites the next transaction."""
    state = SourceState(tmp_path / "d")
    emitter = Emitter(cluster.registry.addr, state, kind="test")
    acks = Acks()
    pipe = GroupPipeline(emitter, acks, linger_s=linger_s, idle_s=0.5)
    try:
        for i in range(6):
            pipe.submit(Item(f"g:{i}", value(i), i))
            time.sleep(0.1)
        pipe.drain()
        assert [p for p, _s, _c in acks.flat()] == list(range(6))
        assert pipe.groups == 6
        if linger_s:
            assert pipe.steps <= 8, pipe.steps  # 7 when every commit took the next prewrite along
        else:
            assert pipe.steps == 12
        with pytest.raises(ValueError, match="linger_s"):
            GroupPipeline(emitter, acks, linger_s=1.0, idle_s=0.5)
    finally:
        pipe.close()
        emitter.close()
        state.close()


def test_steps_are_paced_unless_a_full_group_waits(cluster: Cluster, tmp_path: pathlib.Path) -> None:
    """A steady stream (a transaction every 2 ms) with a 50 ms pace: at most one step per
    50 ms, so groups grow; a burst larger than a group does not wait for the pace."""
    state = SourceState(tmp_path / "d")
    emitter = Emitter(cluster.registry.addr, state, kind="test")
    acks = Acks()
    pipe = GroupPipeline(emitter, acks, pace_s=0.05, linger_s=0.0)
    try:
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < 0.5:
            pipe.submit(Item(f"p:{i}", value(i), i))
            i += 1
            time.sleep(0.002)
        pipe.drain()
        elapsed = time.monotonic() - t0
        assert [p for p, _s, _c in acks.flat()] == list(range(i))
        assert pipe.steps <= elapsed / 0.05 + 2, (pipe.steps, elapsed)
        assert pipe.grouped / pipe.groups >= 3, "paced groups carry several transactions"
        with pytest.raises(ValueError, match="pace_s"):
            GroupPipeline(emitter, acks, pace_s=-0.001)
    finally:
        pipe.close()
    # Full groups (max_txns 4) leave at once: strictly paced, 40 transactions would take >= 5.5 s.
    burst = GroupPipeline(emitter, acks, pace_s=0.5, linger_s=0.0, max_txns=4)
    try:
        t0 = time.monotonic()
        for j in range(i, i + 40):
            burst.submit(Item(f"p:{j}", value(j), j))
        burst.drain()
        assert burst.groups >= 10
        assert time.monotonic() - t0 < 4.0
        assert [p for p, _s, _c in acks.flat()] == list(range(i + 40))
        # A drain (a DDL next) is not paced: the prewrite step of a lone transaction and
        # its commit step follow each other at once, not 0.5 s apart.
        time.sleep(0.5)
        t0 = time.monotonic()
        burst.submit(Item(f"p:{i + 40}", value(i + 40), i + 40))
        burst.drain()
        assert time.monotonic() - t0 < 0.3, "the drain waited for the pace"
        assert [p for p, _s, _c in acks.flat()] == list(range(i + 41))
    finally:
        burst.close()
        emitter.close()
        state.close()


class TimedAcks(Acks):
    """Acks that also note when each position was acknowledged."""

    def __init__(self) -> None:
        super().__init__()
        self.at: dict[object, float] = {}

    def __call__(self, items: list[Item], results: list[tuple[int, int]]) -> None:
        now = time.monotonic()
        super().__call__(items, results)
        for it in items:
            self.at[it.position] = now


def test_under_a_stream_steps_grow_to_the_longest_and_a_lone_transaction_still_leaves_at_once(
        cluster: Cluster, tmp_path: pathlib.Path) -> None:
    """The adaptive step: a transaction every ~2 ms through a 20 ms pace carries many
    more per group when steps may grow to 0.5 s than at the fixed pace, each is
    acknowledged within twice the longest step (plus round trips), and a lone
    transaction after the stream still leaves without waiting for the longest step."""
    state = SourceState(tmp_path / "d")
    emitter = Emitter(cluster.registry.addr, state, kind="test")
    means: dict[float, float] = {}
    n = 0
    try:
        for max_pace in (0.02, 0.5):
            acks = TimedAcks()
            pipe = GroupPipeline(emitter, acks, pace_s=0.02, max_pace_s=max_pace, group_txns=10_000, linger_s=0.0)
            try:
                submitted: dict[object, float] = {}
                t0 = time.monotonic()
                first = n
                while time.monotonic() - t0 < 0.8:
                    submitted[n] = time.monotonic()
                    pipe.submit(Item(f"a:{n}", value(n), n))
                    n += 1
                    time.sleep(0.002)
                deadline = time.monotonic() + 10
                while len(acks.at) < n - first and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert [p for p, _s, _c in acks.flat()] == list(range(first, n))
                means[max_pace] = pipe.grouped / pipe.groups
                late = max(acks.at[k] - t for k, t in submitted.items())
                assert late < 2 * max_pace + 0.5, f"acknowledged {late:.2f} s after it was read"
                if max_pace == 0.5:
                    # After the stream: a lone transaction leaves at once, its commit at the pace.
                    time.sleep(0.6)
                    t1 = time.monotonic()
                    pipe.submit(Item(f"a:{n}", value(n), n))
                    while n not in acks.at and time.monotonic() - t1 < 5:
                        time.sleep(0.005)
                    assert acks.at[n] - t1 < 0.35, "a lone transaction waited for the longest step"
                    n += 1
            finally:
                pipe.close()
        assert means[0.5] >= 2.5 * means[0.02], means
        with pytest.raises(ValueError, match="max_pace_s"):
            GroupPipeline(emitter, Acks(), pace_s=0.05, max_pace_s=0.01)
        with pytest.raises(ValueError, match="group_txns"):
            GroupPipeline(emitter, Acks(), group_txns=0)
    finally:
        emitter.close()
        state.close()


def test_a_sender_failure_reaches_the_reader_and_nothing_after_it_is_acknowledged(
        cluster: Cluster, tmp_path: pathlib.Path) -> None:
    state = SourceState(tmp_path / "d")
    emitter = Emitter(cluster.registry.addr, state, kind="test",
                      client_settings=_quick_client(cluster.registry.addr))
    acks = Acks()
    pipe = GroupPipeline(emitter, acks)
    try:
        pipe.submit(Item("f:1", value(1), 1))
        pipe.drain()
        cluster.pump.stop(grace=0.2)
        with pytest.raises(errors.Unavailable):
            deadline = time.monotonic() + 60
            i = 2
            while time.monotonic() < deadline:
                pipe.submit(Item(f"f:{i}", value(i), i))
                i += 1
                time.sleep(0.01)
        with pytest.raises(errors.Unavailable):
            pipe.drain()
        assert [p for p, _s, _c in acks.flat()] == [1]  # the position never moved past the failure
    finally:
        pipe.close()
        emitter.close()
        state.close()


def _quick_client(registry: str) -> object:
    from binlake import config

    return config.load(config.ClientSettings, registry=registry, write_timeout_s=2.0, commit_retry_s=2.0,
                       max_failures=1)


@pytest.mark.parametrize("how", ["one", "group"])
def test_a_restart_resends_the_last_decided_commits_at_once(cluster: Cluster, tmp_path: pathlib.Path,
                                                            how: str) -> None:
    """A run killed after its journal decided a transaction and before the commit reached
    the Pump (a snapshot part of an attempt the restart abandons is never re-read): the
    next start delivers that commit itself, so the Pump's safe ts does not wait for its
    txn timeout. Only the last decision line's commits can be missing; earlier ones are not
    re-sent."""
    state = SourceState(tmp_path / "src")
    emitter = Emitter(cluster.registry.addr, state, kind="test")
    value = binlog_pb2.PrewriteValue(schema_version=1)
    emitter.emit("f:1", value)  # acknowledged: not re-sent
    items = [(f"f:{k}", *emitter.prewrite(f"f:{k}", value)) for k in (2, 3)]
    pending = cluster.pump.storage.pending_count
    assert pending == 2
    # "Killed" here: decided in the journal, the commits never sent.
    if how == "one":
        state.decide(items[0][0], emitter.registry.get_ts(), items[0][2])
        state.decide(items[1][0], emitter.registry.get_ts(), items[1][2])
    else:
        state.decide_many([(k, emitter.registry.get_ts(), p) for k, _s, p in items])
    emitter.close()
    state.close()

    again = SourceState(tmp_path / "src")
    expected = [(s, again.decision(k).commit_ts, p) for k, s, p in items]  # type: ignore[union-attr]
    assert again.last_decided == (expected[1:] if how == "one" else expected)
    restarted = Emitter(cluster.registry.addr, again, kind="test")
    try:
        # The last line's transactions are committed on the Pump before the start returns
        # ("one": the first line's commit would, by the rule, have been acknowledged before
        # the second line was written; it is left to the Pump's TxnStatus question here).
        storage = cluster.pump.storage
        assert [storage.is_pending(s) for s, _c, _p in again.last_decided] == [False] * len(again.last_decided)
        if how == "group":
            assert storage.pending_count == 0
    finally:
        restarted.close()
        again.close()
