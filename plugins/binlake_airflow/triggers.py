"""``SafeTsTrigger``: wait in the triggerer until a commit_ts window is closed.

A window ``[start_ts, end_ts)`` can be read completely only once every Pump
that may hold part of it has a safe ts >= ``end_ts`` (nothing of the window
can still arrive there) and none has collected garbage above ``start_ts``.
The registry knows both from the Pumps' heartbeats, so the trigger polls the
registry; the rule is ``binlake.window.readiness``, the one the planner and the
Pumps apply. With replicated Pumps (min_acks > 1) it also asks each Pump of the
window its Status, as the read plan does, so a Pump that is down is skipped at
once (``window.pump_views``).

The trigger runs in the triggerer's asyncio loop, so the blocking gRPC call
goes to a thread (``asyncio.to_thread``); a waiting window costs one coroutine
and one small RPC per poll instead of a worker slot.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

if TYPE_CHECKING:
    from binlake.registry.model import NodeRecord

# Event kinds in the payload's "status".
READY = "ready"
ERROR = "error"
# Error kinds: "gc" can never succeed again (the binlogs are gone); "missing"
# may, once the Pump is back or the window is planned again.
GC_PASSED = "gc"
MISSING = "missing"

# While waiting, say which Pumps hold the window back at most this often.
_PROGRESS_LOG_EVERY_S = 60.0
# Asks Pumps their Status: (safe ts, GC ts) of those that answered (``window.pump_views``).
Ask = Callable[[list["NodeRecord"], int, int], Mapping[str, tuple[int, int]]]


@dataclasses.dataclass(frozen=True)
class SafeTsCheck:
    """One look at the registry for a window."""

    ready: bool
    # Every Pump the window must be read from, with its reported safe ts.
    safe_ts: dict[str, int]
    # Pumps whose safe ts is still below the window end.
    waiting: list[str]
    # Set when the window can no longer be ingested as planned.
    error: str | None = None
    error_kind: str | None = None
    # Pumps that joined (and may hold part of the window) after it was planned.
    joined: list[str] = dataclasses.field(default_factory=list)

    def payload(self, start_ts: int, end_ts: int) -> dict[str, Any]:
        """The TriggerEvent payload (JSON-serializable)."""
        if self.error is not None:
            return {"status": ERROR, "kind": self.error_kind, "message": self.error,
                    "start_ts": start_ts, "end_ts": end_ts, "safe_ts": self.safe_ts}
        return {"status": READY, "start_ts": start_ts, "end_ts": end_ts, "safe_ts": self.safe_ts,
                "pumps": sorted(self.safe_ts), "joined": self.joined}


def check_safe_ts(nodes: Iterable[NodeRecord], planned: Sequence[str], start_ts: int, end_ts: int,
                  min_acks: int | None = None, ask: Ask | None = None) -> SafeTsCheck:
    """Is window ``[start_ts, end_ts)`` closed on every Pump that may hold part of it?

    ``planned`` are the Pumps chosen when the window was planned. A planned Pump
    that is no longer registered, or whose GC ts passed ``start_ts``, is an
    error. A Pump that registered since and belongs to the window (by the
    planner's rule) is waited for too, so a Pump joining late is never skipped.

    Replicated Pumps (``min_acks`` W > 1, None: the configured one; callers pass the
    registry's, ``replication.cluster_min_acks``): each Pump of the window is
    asked its own Status (``ask``; None: over gRPC, as the read plan does), one
    that does not answer counts as unreachable (``window.pump_views``, the read
    plan's rule: a killed Pump is seen at once, not when its heartbeat goes
    stale), and up to W - 1 of those are skipped (``window.cluster_readiness``).
    """
    from binlake import tso
    from binlake.lake.pumps.planner import pumps_for_window
    from binlake.window import Readiness, Window, cluster_readiness, pump_views, readiness

    window_ts = Window(start_ts, end_ts)
    nodes = list(nodes)
    by_id = {n.node_id: n for n in nodes if n.kind == "pump"}
    window = f"[{tso.format_ts(start_ts)}, {tso.format_ts(end_ts)})"
    missing = [p for p in planned if p not in by_id]
    if missing:
        return SafeTsCheck(
            ready=False, safe_ts={}, waiting=list(missing), error_kind=MISSING,
            error=(f"pump(s) {', '.join(missing)} planned for window {window} are no longer registered; "
                   "see `binlake ctl pumps` and re-run the task to plan the window again"),
        )
    current = {n.node_id for n in pumps_for_window(nodes, start_ts, end_ts)}
    joined = sorted(current - set(planned))
    chosen = sorted(set(planned) | current)
    states = {node_id: readiness(window_ts, by_id[node_id].safe_ts, by_id[node_id].gc_ts) for node_id in chosen}
    for node_id in chosen:
        gc_ts = by_id[node_id].gc_ts
        if states[node_id] is Readiness.GONE:
            return SafeTsCheck(
                ready=False, safe_ts={}, waiting=[], error_kind=GC_PASSED,
                error=(f"window {window} starts below pump {node_id}'s GC ts {tso.format_ts(gc_ts)}: "
                       "its binlogs before that were removed after their retention, so the window can no "
                       "longer be ingested completely"),
            )
    safe = {node_id: by_id[node_id].safe_ts for node_id in chosen}
    if min_acks is None:
        from binlake.registry.replicas import cluster_min_acks

        min_acks = cluster_min_acks(None)
    if min_acks > 1:
        if ask is None:
            from binlake.lake.pumps.pump_check import reachable_answers

            ask = reachable_answers
        answered = ask([by_id[node_id] for node_id in chosen], start_ts, end_ts)
        verdict = cluster_readiness(window_ts, pump_views(chosen, answered), min_acks)
        if verdict.state is Readiness.GONE:
            gc_ts = answered[verdict.gone][1]
            return SafeTsCheck(
                ready=False, safe_ts={}, waiting=[], error_kind=GC_PASSED,
                error=(f"window {window} starts below pump {verdict.gone}'s GC ts {tso.format_ts(gc_ts)}: "
                       "its binlogs before that were removed after their retention, so the window can no "
                       "longer be ingested completely"),
            )
        served = ({p: answered[p][0] for p in verdict.serve_from} if verdict.state is Readiness.READY
                  else safe)
        return SafeTsCheck(ready=verdict.state is Readiness.READY, safe_ts=served, waiting=list(verdict.waiting),
                           joined=joined)
    waiting = [node_id for node_id in chosen if states[node_id] is Readiness.WAITING]
    return SafeTsCheck(ready=not waiting, safe_ts=safe, waiting=waiting, joined=joined)


def describe_waiting(check: SafeTsCheck, nodes: Iterable[NodeRecord], end_ts: int) -> str:
    """One line naming the Pumps that hold the window back, how far behind, and
    how stale their last heartbeat is (a dead Pump shows up as a growing age)."""
    from binlake import tso

    by_id = {n.node_id: n for n in nodes}
    now_ms = time.time_ns() // 1_000_000
    parts = []
    for node_id in check.waiting:
        node = by_id.get(node_id)
        if node is None:
            continue
        behind_s = max(0, (end_ts >> tso.LOGICAL_BITS) - (node.safe_ts >> tso.LOGICAL_BITS)) / 1000
        age = f", last heartbeat {(now_ms - node.updated_at_ms) / 1000:.0f}s ago" if node.updated_at_ms else ""
        parts.append(f"{node_id} (safe ts {behind_s:.1f}s behind, state {node.state}{age})")
    return f"waiting for the safe ts of {', '.join(parts) or 'no pump'} to reach {tso.format_ts(end_ts)}"


class SafeTsTrigger(BaseTrigger):
    """Fires once every Pump of window ``[start_ts, end_ts)`` has a safe ts >= ``end_ts``.

    Yields one TriggerEvent: ``{"status": "ready", "safe_ts": {pump: ts}, ...}``,
    or ``{"status": "error", "kind": "gc" | "missing", "message": ...}`` when a
    Pump's GC ts passes the window start or a planned Pump disappears. An
    unreachable registry is not an error here: the trigger keeps polling and
    the task's deferral timeout bounds the wait.
    """

    def __init__(
        self,
        registry: str,
        start_ts: int,
        end_ts: int,
        pumps: Sequence[str],
        poll_interval: float = 5.0,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Airflow's BaseTrigger.__init__ is unannotated
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval}")
        self.registry = registry
        self.start_ts = int(start_ts)
        self.end_ts = int(end_ts)
        self.pumps = list(pumps)
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "registry": self.registry,
                "start_ts": self.start_ts,
                "end_ts": self.end_ts,
                "pumps": list(self.pumps),
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from binlake import errors
        from binlake.registry.client import RegistryClient
        from binlake.registry.replicas import cluster_min_acks

        client = RegistryClient(self.registry)
        last_log = 0.0
        try:
            while True:
                try:
                    nodes, _revision = await asyncio.to_thread(client.list_nodes, "pump")
                    acks = await asyncio.to_thread(cluster_min_acks, client, self.start_ts, self.end_ts)
                except errors.BinlakeError as exc:
                    # A registry restart is a pause, not a failure: Pumps keep
                    # their data and the window will close once it is back.
                    self.log.warning("registry %s: %s; retrying in %.1fs", self.registry, exc, self.poll_interval)
                else:
                    # In a thread: with min_acks > 1 it asks the Pumps their Status.
                    check = await asyncio.to_thread(check_safe_ts, nodes, self.pumps, self.start_ts,
                                                    self.end_ts, acks)
                    if check.error is not None or check.ready:
                        if check.joined:
                            self.log.info("pump(s) %s joined the window after it was planned; waited for them too",
                                          ", ".join(check.joined))
                        # TriggerEvent.__init__ is unannotated in Airflow.
                        yield TriggerEvent(check.payload(self.start_ts, self.end_ts))  # type: ignore[no-untyped-call]
                        return
                    now = time.monotonic()
                    if now - last_log >= _PROGRESS_LOG_EVERY_S:
                        self.log.info("%s", describe_waiting(check, nodes, self.end_ts))
                        last_log = now
                await asyncio.sleep(self.poll_interval)
        finally:
            client.close()
