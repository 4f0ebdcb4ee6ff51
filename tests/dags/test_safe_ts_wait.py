"""The wait step: SafeTsTrigger and WaitForSafeTsOperator against a real registry.

The registry is a real gRPC server (in-process); the Pumps in it are node
records whose heartbeats the tests send themselves, so a test can move a
Pump's safe ts and GC ts exactly when it wants.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest
from binlake_airflow.operators import WaitForSafeTsOperator
from binlake_airflow.triggers import SafeTsTrigger, check_safe_ts
from pumpkit import PumpFactory, now_ts

from binlake import tso
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeRecord
from binlake.registry.server import RegistryServer

POLL = 0.05


def add_pump(reg: RegistryClient, node_id: str, *, safe_ts: int, gc_ts: int = 0) -> NodeRecord:
    # A Pump that has stored transactions (its max commit ts just below its safe ts): the
    # registry never takes it as holding nothing below the window (empty_below_ts).
    stored = reg.register(NodeRecord(node_id=node_id, kind="pump", addr="127.0.0.1:9"))
    return reg.heartbeat(dataclasses.replace(stored, safe_ts=safe_ts, gc_ts=gc_ts, max_commit_ts=safe_ts - 1))


def report(reg: RegistryClient, node_id: str, **status: int) -> None:
    reg.heartbeat(dataclasses.replace(reg.get_node(node_id), **status))


def run_trigger(trigger: SafeTsTrigger, *, after: float | None = None, then: Callable[[], None] | None = None,
                timeout: float = 20.0) -> tuple[dict[str, Any], float]:
    """The trigger's first event and how long it took; ``then`` runs ``after`` seconds in."""

    async def main() -> tuple[dict[str, Any], float]:
        start = time.monotonic()
        side = None
        if then is not None:
            async def later() -> None:
                await asyncio.sleep(after or 0)
                await asyncio.to_thread(then)

            side = asyncio.create_task(later())
        events = trigger.run()
        try:
            event = await asyncio.wait_for(events.__anext__(), timeout)
        finally:
            await events.aclose()
            if side is not None:
                await side
        return event.payload, time.monotonic() - start

    return asyncio.run(main())


def test_trigger_serializes_and_round_trips() -> None:
    from airflow.sdk._shared.module_loading import import_string
    from airflow.sdk.serde import deserialize, serialize

    trigger = SafeTsTrigger("127.0.0.1:8230", 10 << 18, 20 << 18, ["pump1", "pump2"], poll_interval=2.5)
    classpath, kwargs = trigger.serialize()
    assert classpath == "binlake_airflow.triggers.SafeTsTrigger"
    # The way the triggerer (and dag.test) rebuilds it: serde-encoded kwargs.
    again = import_string(classpath)(**deserialize(serialize(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    assert kwargs == {"registry": "127.0.0.1:8230", "start_ts": 10 << 18, "end_ts": 20 << 18,
                      "pumps": ["pump1", "pump2"], "poll_interval": 2.5}


def test_window_above_safe_ts_waits_then_fires(reg: RegistryClient, registry: RegistryServer) -> None:
    start, end = now_ts(-60_000), now_ts(60_000)
    add_pump(reg, "pump1", safe_ts=now_ts())
    add_pump(reg, "pump2", safe_ts=end + 5)
    trigger = SafeTsTrigger(registry.addr, start, end, ["pump1", "pump2"], poll_interval=POLL)
    event, took = run_trigger(trigger, after=0.5, then=lambda: report(reg, "pump1", safe_ts=end))
    assert event["status"] == "ready"
    assert event["safe_ts"] == {"pump1": end, "pump2": end + 5}
    assert event["start_ts"] == start and event["end_ts"] == end
    assert took >= 0.5, "fired before pump1's safe ts reached the window end"


def test_pump_joining_during_the_wait_is_waited_for(reg: RegistryClient, registry: RegistryServer) -> None:
    start, end = now_ts(-60_000), now_ts(60_000)
    add_pump(reg, "pump1", safe_ts=now_ts())
    trigger = SafeTsTrigger(registry.addr, start, end, ["pump1"], poll_interval=POLL)

    def join_then_catch_up() -> None:
        # pump9 registers while pump1 still holds the window open; then pump1
        # closes it, and the trigger must keep waiting for pump9.
        add_pump(reg, "pump9", safe_ts=now_ts())
        report(reg, "pump1", safe_ts=end)
        time.sleep(0.4)
        report(reg, "pump9", safe_ts=end)

    event, took = run_trigger(trigger, after=0.0, then=join_then_catch_up)
    assert event["status"] == "ready"
    assert event["pumps"] == ["pump1", "pump9"] and event["joined"] == ["pump9"]
    assert took >= 0.4


def test_gc_passing_the_window_start_is_an_error(reg: RegistryClient, registry: RegistryServer) -> None:
    start, end = now_ts(-60_000), now_ts(60_000)
    add_pump(reg, "pump1", safe_ts=now_ts())
    gc = start + (1 << 18)
    trigger = SafeTsTrigger(registry.addr, start, end, ["pump1"], poll_interval=POLL)
    event, _ = run_trigger(trigger, after=0.3, then=lambda: report(reg, "pump1", gc_ts=gc))
    assert event["status"] == "error" and event["kind"] == "gc"
    assert "pump pump1's GC ts" in event["message"] and tso.format_ts(gc) in event["message"]


def test_planned_pump_missing_is_an_error(reg: RegistryClient, registry: RegistryServer) -> None:
    start, end = now_ts(-60_000), now_ts(-1000)
    add_pump(reg, "pump1", safe_ts=now_ts())
    event, _ = run_trigger(SafeTsTrigger(registry.addr, start, end, ["pump1", "ghost"], poll_interval=POLL))
    assert event["status"] == "error" and event["kind"] == "missing"
    assert "ghost" in event["message"] and "no longer registered" in event["message"]


def test_unreachable_registry_keeps_polling() -> None:
    from pumpkit import free_port

    trigger = SafeTsTrigger(f"127.0.0.1:{free_port()}", 1 << 18, 2 << 18, ["pump1"], poll_interval=POLL)
    with pytest.raises(TimeoutError):
        run_trigger(trigger, timeout=1.0)


def test_check_is_pure_and_uses_the_planner_rule() -> None:
    end = 100 << 18
    nodes = [NodeRecord("pump1", "pump", "127.0.0.1:9", safe_ts=end),
             NodeRecord("w1", "writer", "127.0.0.1:8")]
    check = check_safe_ts(nodes, ["pump1"], 50 << 18, end)
    assert check.ready and check.safe_ts == {"pump1": end} and check.error is None


def test_replicated_window_skips_up_to_w_minus_one_pumps_that_do_not_answer() -> None:
    """With min_acks W = 2 a Pump that does not answer its own Status is skipped (its
    transactions are on another Pump too) even while its heartbeat is fresh - the
    read plan's rule, ``window.pump_views``; two that do not answer make the window
    wait, naming them; W = 1 waits for the one by the registry's view."""
    start, end = 50 << 18, 100 << 18
    fresh = time.time_ns() // 1_000_000
    nodes = [NodeRecord(p, "pump", "127.0.0.1:9", safe_ts=end - (p == "p2"), updated_at_ms=fresh)
             for p in ("p1", "p2", "p3")]
    answers = {"p1": (end, 0), "p3": (end + 5, 0)}

    def ask(asked: list[NodeRecord], s: int, e: int) -> dict[str, tuple[int, int]]:
        assert [n.node_id for n in asked] == ["p1", "p2", "p3"] and (s, e) == (start, end)
        return answers

    check = check_safe_ts(nodes, ["p1", "p2", "p3"], start, end, min_acks=2, ask=ask)
    assert check.ready and check.safe_ts == {"p1": end, "p3": end + 5}
    check = check_safe_ts(nodes, ["p1", "p2", "p3"], start, end, min_acks=1, ask=ask)
    assert not check.ready and check.waiting == ["p2"]
    del answers["p3"]
    check = check_safe_ts(nodes, ["p1", "p2", "p3"], start, end, min_acks=2, ask=ask)
    assert not check.ready and check.waiting == ["p2", "p3"]


def test_trigger_skips_a_killed_pump_at_once(reg: RegistryClient, registry: RegistryServer,
                                             pump_factory: PumpFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real Pumps p1 and p3 and a Pump p2 that is gone while its last heartbeat is
    fresh (its port answers nothing): with min_acks = 2 the trigger fires from p1
    and p3 without waiting for p2's heartbeat to go stale, as ``plan_read`` would."""
    monkeypatch.setenv("BINLAKE_CLIENT_REPLICAS", "2")
    monkeypatch.setenv("BINLAKE_CLIENT_MIN_ACKS", "2")
    start, end = now_ts(-60_000), now_ts(-500)
    pump_factory.start("p1")
    pump_factory.start("p3")
    add_pump(reg, "p2", safe_ts=end - 1)  # heartbeat just now; nothing listens at its address
    event, took = run_trigger(SafeTsTrigger(registry.addr, start, end, ["p1", "p2", "p3"], poll_interval=POLL))
    assert event["status"] == "ready" and event["pumps"] == ["p1", "p3"], event
    assert took < 5, took  # the heartbeat rule waited 10 s


# ------------------------------------------------------------------------------ operator


def _operator(registry: str, start: int, end: int, pumps: Any) -> WaitForSafeTsOperator:
    return WaitForSafeTsOperator(task_id="wait", registry=registry, start_ts=start, end_ts=end, pumps=pumps,
                                 poll_interval=POLL)


def test_operator_returns_at_once_when_the_window_is_closed(reg: RegistryClient, registry: RegistryServer) -> None:
    start, end = now_ts(-60_000), now_ts(-1000)
    add_pump(reg, "pump1", safe_ts=now_ts())
    # Templated values arrive as strings when rendered from Jinja.
    result = _operator(registry.addr, str(start), str(end), "pump1").execute({})  # type: ignore[arg-type]
    assert result["deferred"] is False and list(result["safe_ts"]) == ["pump1"]


def test_operator_defers_to_the_trigger(reg: RegistryClient, registry: RegistryServer) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    start, end = now_ts(-60_000), now_ts(60_000)
    add_pump(reg, "pump1", safe_ts=now_ts())
    op = _operator(registry.addr, start, end, ["pump1"])
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({})  # type: ignore[arg-type]
    assert deferred.value.method_name == "execute_complete"
    trigger = deferred.value.trigger
    assert isinstance(trigger, SafeTsTrigger)
    assert (trigger.start_ts, trigger.end_ts, trigger.pumps) == (start, end, ["pump1"])
    # The trigger's event resumes the task.
    event, _ = run_trigger(trigger, after=0.2, then=lambda: report(reg, "pump1", safe_ts=end))
    result = op.execute_complete({}, event)  # type: ignore[arg-type]
    assert result == {"safe_ts": {"pump1": end}, "pumps": ["pump1"], "deferred": True}


def test_operator_error_events() -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    op = _operator("127.0.0.1:8230", 1, 2, ["pump1"])
    with pytest.raises(AirflowFailException, match="GC ts"):
        op.execute_complete({}, {"status": "error", "kind": "gc", "message": "below pump pump1's GC ts 5"})  # type: ignore[arg-type]
    with pytest.raises(AirflowException, match="no longer registered") as missing:
        op.execute_complete({}, {"status": "error", "kind": "missing", "message": "pump1 no longer registered"})  # type: ignore[arg-type]
    # A vanished Pump may come back: that one may be retried.
    assert not isinstance(missing.value, AirflowFailException)
    with pytest.raises(AirflowException, match="without an event"):
        op.execute_complete({}, None)  # type: ignore[arg-type]
