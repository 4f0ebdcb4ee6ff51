"""The group pipeline of a log-reading source: the reader thread (the one that
reads the upstream log) hands every finished upstream transaction over, and
one sender thread sends them to the Pumps in groups
(``Emitter.emit_group``) while the reader goes on reading.

Why: per transaction, the two-phase send costs two TSO calls, two fsync'ed
journal lines and two Pump round trips (each a Pump fsync). One at a time,
that capped a source near 150 upstream transactions/s, far below what one
MySQL client commits. Grouped, those round trips are paid once per group.

Steps: the sender works in steps (``Emitter.step``), each of which decides
and commits the group prewritten by the step before and begins and prewrites
the next group: one TSO call (the one group's commit_ts, then the next one's
start_ts), one fsync'ed journal line, one batch per Pump (the commits and the
prewrites together). Under load every step carries two groups, so a
transaction costs its group's share of ONE of each round trip; alone, it
takes two steps (prewrite, then commit), as before.

Grouping rule: the sender takes everything waiting when it becomes free, up
to ``max_txns`` transactions and ``max_bytes`` of row data (always at least
one). Beyond the pace below, it never waits for more before a prewrite: on a
slow upstream each transaction leaves as soon as it is read; under load,
groups grow to what arrived since the previous step began. The other
wait: a group prewritten and waiting for its commit, with nothing new, waits
up to ``linger_s`` (2 ms) for the next transaction, so that one step commits
the one and prewrites the other. Without it, an upstream committing every
few milliseconds cost two steps per transaction (a prewrite step, then a
commit-only step), each a TSO call, a journal line and a Pump batch; measured
with ``binlake bench source``, the steps per transaction and the CPU of the
source, Pump and registry fall with it. The price: a commit acknowledged up
to ``linger_s`` later; the upstream never waits for it.

Pace: a step begins at least ``pace_s`` after the one before it began
(``--step-ms``), unless a full group waits. Why: nearly all of a step's cost
is per step, in all three processes (the TSO call, the journal's fsync, the
Pump's batch with its fsync, each process's gRPC and thread work), and a
transaction costs its group's share of it. Without a pace, a busy upstream
got steps as fast as their round trips allowed (about 3 ms here), so groups
stayed at a few transactions; paced, groups grow to what arrives in
``pace_s`` and the CPU per transaction falls (measured in bench/RESULTS.md).
The price: an acknowledgement (and the checkpoint) up to ``pace_s`` later;
the upstream never waits for it, and a lone transaction after a quiet spell
still leaves at once. A ``drain`` (the reader before a DDL, or stopping) is
not paced: while one waits, the sender steps as soon as its last step is
answered, so a DDL never waits for the pace (a DDL-heavy upstream would
otherwise pay up to ``pace_s`` per statement).

Adaptive step: after the pace, a step whose next group is still small (fewer
than ``group_txns``, 256, transactions waiting, but at least one) waits on for more,
up to ``max_pace_s`` after the previous step began. Why: a step costs about
2 ms of CPU across the source, Pump and registry (mostly grpcio) whatever it
carries, so at a few hundred transactions/s a 25 ms step carried 5-15 of them
and each paid 130-400 us of fixed cost, several times the C replica's whole
cost. Under a steady stream the step now grows (fewer steps/s, larger groups)
until the group reaches ``group_txns`` or the step ``max_pace_s``; when the
stream is faster, the group fills sooner and the step shrinks back towards
``pace_s``. Only a stream waits on: the step extends only when the group the
sender took last had more than one transaction, so a trickle (one per pace or
fewer) is sent as before, and an empty queue never extends a step (a lone
transaction after a quiet spell still leaves at once). Bound: a
transaction is prewritten at most ``max_pace_s`` after it was read plus one
step's round trips, and decided and acknowledged by the next step, so its
acknowledgement (and the checkpoint past it) comes at most 2 x ``max_pace_s``
plus two steps' round trips after it was read (about 0.25 s at the defaults);
a drain skips the wait as it skips the pace.

Back-pressure: ``submit`` blocks while a full group is already waiting, so
memory holds at most the group in flight plus one more.

Positions: each item carries the upstream position just after it (opaque to
this module). Only after a group's commits are acknowledged does the sender
call ``on_acked`` with the group's items, in order; the source moves its
acknowledged position and its checkpoint there, so a checkpoint is never
inside a group, let alone inside a TABLE_MAP/ROWS run. Items without a
transaction (a ROTATE, a transaction on untracked tables) travel through the
same queue, so the position never passes a transaction still unacknowledged.

Failure: an exception in the sender stops it; the items still waiting are
dropped (nothing of them was sent: the source re-reads them from its
acknowledged position after a reconnect or a restart), and the next
``submit``/``check``/``drain`` raises the exception in the reader thread.
The crash argument for a group is in ``source.journal``: its begins are one
journal line and its decisions another (all or none).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.source.emitter import Emitter, Prewritten, Sent

log = logging.getLogger(__name__)

# Bounds of one group. 512 matches the PumpClient's default batch (max_batch_binlogs).
# 16 MiB keeps a group of wide rows from holding much memory (a single larger transaction
# still forms a group of its own; the queue holds at most one more group), and is not 8:
# in bulk each step also pays a fixed part (the TSO call, the journal's fsync, the first
# batch's trip and the last one's fsync at the Pump), and twice the bytes per step gave
# 1.00-1.05 M row changes/s against 0.78-0.81 M in alternated runs (bench/RESULTS.md).
MAX_GROUP_TXNS = 512
MAX_GROUP_BYTES = 16 << 20
# With nothing to send for this long, the sender calls on_idle (a due checkpoint).
IDLE_S = 0.05
# How long a group waiting for its commit waits for a next transaction to share the step.
LINGER_S = 0.002
# The least time between the starts of two steps (unless a full group waits): see "Pace".
# 25 ms, not 10: measured (bench/RESULTS.md, Sources) the chain's CPU per small upstream
# transaction falls by a third or more from 10 to 25 ms at a few hundred transactions/s,
# little more beyond; each step costs about a millisecond of gRPC CPU on each side
# whatever it carries (bench/grpc_pace.py), and 25 ms of acknowledgement delay is
# invisible to the upstream and small against the lake's windows of seconds.
PACE_S = 0.025
# The adaptive step (see "Adaptive step"): a step with fewer than GROUP_TXNS transactions
# waiting waits on for more, up to MAX_PACE_FACTOR x the pace after the previous step
# began. 256 (half a full group): at ~2 ms of CPU per step that is ~8 us per transaction,
# small against the per-transaction work (the source's reader, the Pump's per-binlog
# parse and index); only a stream faster than ~2,500 transactions/s fills it before the
# longest step, and then the step shrinks towards the pace. 4 x 25 ms: an
# acknowledgement at most ~0.25 s late, small against the lake's windows of seconds.
GROUP_TXNS = 256
MAX_PACE_FACTOR = 4


def check_steps(pace_s: Any, max_pace_s: Any) -> tuple[float, float]:
    """A source's (pace, longest step) in seconds, from ``--step-ms`` and ``--max-step-ms``
    (None: MAX_PACE_FACTOR x the pace; see "Adaptive step"); InvalidArgument naming the
    options otherwise."""
    if isinstance(pace_s, bool) or not isinstance(pace_s, (int, float)) or not 0 <= pace_s <= 1:
        raise errors.InvalidArgument(f"the step pace must be in [0, 1] seconds (--step-ms 0..1000), got {pace_s!r}")
    if max_pace_s is None:
        max_pace_s = MAX_PACE_FACTOR * float(pace_s)
    if isinstance(max_pace_s, bool) or not isinstance(max_pace_s, (int, float)) or not pace_s <= max_pace_s <= 4:
        raise errors.InvalidArgument(f"the longest step must be in [the pace, 4] seconds (--max-step-ms from "
                                     f"--step-ms up to 4000), got {max_pace_s!r} with a pace of {float(pace_s)!r}")
    return float(pace_s), float(max_pace_s)


class Item:
    """One upstream transaction read from the log (``key`` None: a position only)."""

    __slots__ = ("event_ts", "key", "position", "rows", "size", "value")

    def __init__(self, key: str | None, value: binlog_pb2.PrewriteValue | bytes | None, position: Any,
                 event_ts: float = 0.0, rows: int = 0) -> None:
        if (key is None) != (value is None):
            raise ValueError("an item has both a key and a value, or neither")
        self.key = key
        # Serialized here, in the reader thread, once (or given serialized): its size bounds
        # the group, and the sender puts these bytes into the prewrite as they are.
        self.value = value.SerializeToString() if isinstance(value, binlog_pb2.PrewriteValue) else value
        self.position = position
        self.event_ts = event_ts
        self.rows = rows
        self.size = len(self.value) if self.value is not None else 0


class GroupPipeline:
    """The sender thread and its queue. ``on_acked(items, results)`` runs in the sender
    after each group (results: (start_ts, commit_ts) per item, (0, 0) for a position
    only); ``on_idle()`` runs in the sender when nothing came for ``idle_s``."""

    def __init__(self, emitter: Emitter, on_acked: Callable[[list[Item], list[tuple[int, int]]], None],
                 on_idle: Callable[[], None] | None = None, *, max_txns: int = MAX_GROUP_TXNS,
                 max_bytes: int = MAX_GROUP_BYTES, idle_s: float = IDLE_S, linger_s: float = LINGER_S,
                 pace_s: float = PACE_S, max_pace_s: float | None = None, group_txns: int = GROUP_TXNS,
                 name: str = "source-sender") -> None:
        if isinstance(max_txns, bool) or not isinstance(max_txns, int) or max_txns < 1:
            raise ValueError(f"max_txns must be a positive integer, got {max_txns!r}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be a positive integer, got {max_bytes!r}")
        if not idle_s > 0:
            raise ValueError(f"idle_s must be > 0, got {idle_s!r}")
        if not 0 <= linger_s < idle_s:
            raise ValueError(f"linger_s must be in [0, idle_s), got {linger_s!r}")
        if isinstance(pace_s, bool) or not isinstance(pace_s, (int, float)) or not 0 <= pace_s <= 1:
            raise ValueError(f"pace_s must be in [0, 1] seconds, got {pace_s!r}")
        if max_pace_s is None:
            max_pace_s = MAX_PACE_FACTOR * float(pace_s)
        if (isinstance(max_pace_s, bool) or not isinstance(max_pace_s, (int, float))
                or not pace_s <= max_pace_s <= 4):
            raise ValueError(f"max_pace_s must be in [pace_s, 4] seconds, got {max_pace_s!r}")
        if isinstance(group_txns, bool) or not isinstance(group_txns, int) or group_txns < 1:
            raise ValueError(f"group_txns must be a positive integer, got {group_txns!r}")
        self._linger_s = linger_s
        self._pace_s = float(pace_s)
        self._max_pace_s = float(max_pace_s)
        # Transactions (keyed items) waiting in the queue: the adaptive step's measure.
        self._queued_txns = 0
        self.group_txns = group_txns
        # Transactions in the last group the sender took (the adaptive step's sign of a stream).
        self._last_group = 0
        # True while the sender waits for any item (idle or lingering): only then, or when
        # the queue fills, does a submit wake it (not once per transaction while it paces).
        self._wants_item = False
        # True while the sender's step waits for a group of group_txns (the adaptive step):
        # then the submit that completes one wakes it.
        self._wants_group = False
        # Readers waiting in drain(): while any does, the sender skips the pace and the linger.
        self._draining = 0
        self._emitter = emitter
        self._on_acked = on_acked
        self._on_idle = on_idle
        self.max_txns, self.max_bytes, self._idle_s = max_txns, max_bytes, idle_s
        self._cond = threading.Condition()
        self._queue: collections.deque[Item] = collections.deque()
        self._queued_bytes = 0
        self._inflight = False
        self._closed = False
        self._error: BaseException | None = None
        self.groups = 0  # groups begun (steps that prewrote something)
        self.grouped = 0  # transactions sent in groups (position-only items not counted)
        self.steps = 0  # Emitter.step calls (one journal line each)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- reader side
    def submit(self, item: Item) -> None:
        """Queue ``item`` after every earlier one; blocks while a full group already waits."""
        with self._cond:
            while (self._error is None and not self._closed
                   and (len(self._queue) >= self.max_txns or self._queued_bytes >= self.max_bytes)):
                self._cond.wait()
            self._raise()
            if self._closed:
                raise RuntimeError("the source's sender is closed")
            self._queue.append(item)
            self._queued_bytes += item.size
            self._queued_txns += item.key is not None
            if self._wants_item or self._full() or (self._wants_group and self._queued_txns >= self.group_txns):
                self._cond.notify_all()

    def _full(self) -> bool:
        """A full group waits (holding _cond): the sender goes now, whatever the pace."""
        return len(self._queue) >= self.max_txns or self._queued_bytes >= self.max_bytes

    def check(self) -> None:
        """Raise the sender's failure, if it had one."""
        if self._error is not None:
            with self._cond:
                self._raise()

    def drain(self) -> None:
        """Wait until everything submitted is acknowledged (before a DDL: its TSOs must follow)."""
        with self._cond:
            self._draining += 1
            self._cond.notify_all()  # a sender waiting out the pace goes now
            try:
                while self._error is None and (self._queue or self._inflight):
                    self._cond.wait()
            finally:
                self._draining -= 1
            self._raise()

    def close(self) -> None:
        """Stop the sender: the group in flight finishes (and is acknowledged), the rest is dropped."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._queued_bytes = 0
            self._queued_txns = 0
            self._cond.notify_all()
        self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    # -- sender
    def _run(self) -> None:
        # The group prewritten by the last step, to be decided by the next: its items
        # (with the position-only items among and after them) and each keyed item's state.
        carried: list[Item] = []
        carried_state: list[Prewritten | Sent | None] = []
        last_start = -1e9  # monotonic start of the previous step
        while True:
            with self._cond:
                self._wants_item = True
                while not self._queue and not self._closed and not carried:
                    if not self._cond.wait(self._idle_s):
                        break
                self._wants_item = False
                if (self._queue or carried) and self._pace_s:
                    # The pace: woken early only by a full group or close.
                    due = last_start + self._pace_s
                    while not self._closed and not self._full() and not self._draining:
                        left = due - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                    # The adaptive step: transactions keep arriving (the last group had more
                    # than one) but this group is still small, so wait on for more, up to the
                    # longest step. A trickle (one per step or less) never waits on.
                    due = last_start + self._max_pace_s
                    self._wants_group = True
                    while (self._last_group > 1 and 0 < self._queued_txns < self.group_txns
                           and not self._closed and not self._full() and not self._draining):
                        left = due - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                    self._wants_group = False
                if carried and not self._queue and not self._closed and self._linger_s and not self._draining:
                    # A commit-only step is due: let a transaction arriving meanwhile share it.
                    self._wants_item = True
                    self._cond.wait(self._linger_s)
                    self._wants_item = False
                new: list[Item] = []
                self._last_group = 0  # a commit-only step: the stream paused
                if self._queue and not self._closed:
                    new.append(self._queue.popleft())
                    size = new[0].size
                    sent = 1 if new[0].key is not None else 0
                    while self._queue and sent < self.max_txns and size + self._queue[0].size <= self.max_bytes:
                        it = self._queue.popleft()
                        new.append(it)
                        size += it.size
                        sent += it.key is not None
                    self._queued_bytes -= size
                    self._queued_txns -= sent
                    self._last_group = sent
                if not new and not carried:
                    if self._closed:
                        return
                    idle = True
                else:
                    idle = False
                    self._inflight = True
                    self._cond.notify_all()  # room for the reader
            try:
                if idle:
                    if self._on_idle is not None:
                        self._on_idle()
                    continue
                last_start = time.monotonic()
                carried, carried_state = self._step(carried, carried_state, new)
            except BaseException as exc:
                with self._cond:
                    self._error = exc
                    self._queue.clear()
                    self._queued_bytes = 0
                    self._queued_txns = 0
                    self._inflight = False
                    self._cond.notify_all()
                return
            with self._cond:
                self._inflight = bool(carried)
                self._cond.notify_all()

    def _step(self, carried: list[Item], carried_state: list[Prewritten | Sent | None],
              new: list[Item]) -> tuple[list[Item], list[Prewritten | Sent | None]]:
        """One ``Emitter.step``: commit the carried group, prewrite ``new``; report what is
        done (in order) and return what the next step carries."""
        decide = [st for st in carried_state if isinstance(st, Prewritten)]
        txns = [(it.key, it.value) for it in new if it.key is not None and it.value is not None]
        commit_ts, outs = self._emitter.step(decide, txns)
        self.steps += 1
        if txns:
            self.groups += 1
            self.grouped += len(txns)
        done: list[Item] = list(carried)
        results: list[tuple[int, int]] = []
        by_key = {p.key: c for p, c in zip(decide, commit_ts, strict=True)}
        for st in carried_state:
            if st is None:
                results.append((0, 0))
            elif isinstance(st, Prewritten):
                results.append((st.start_ts, by_key[st.key]))
            else:
                results.append((st.start_ts, st.commit_ts))
        # The new items up to the first one only prewritten are done too (position-only
        # items and re-sent commits, after the carried group); the rest is carried.
        it_out = iter(outs)
        states: list[Prewritten | Sent | None] = [next(it_out) if it.key is not None else None for it in new]
        cut = next((i for i, st in enumerate(states) if isinstance(st, Prewritten)), len(new))
        for it, st in zip(new[:cut], states[:cut], strict=True):
            done.append(it)
            results.append((st.start_ts, st.commit_ts) if isinstance(st, Sent) else (0, 0))
        if done:
            self._on_acked(done, results)
        return new[cut:], states[cut:]
