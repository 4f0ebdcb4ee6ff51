"""A running Pump's duties: fake binlogs, missing-commit resolution through the
writer's status service, operator state changes, shutdown and restart."""

from __future__ import annotations

import time

import grpc
import pytest
from pumpkit import (
    PumpFactory,
    Upstream,
    commit,
    now_ts,
    prewrite,
    pull,
    refusal,
    row_start_ts,
    run_cli,
    status,
    wait_safe,
    wait_until,
    write_one,
)

from binlake import errors
from binlake.pump.node import PumpNode
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeState
from binlake.registry.server import RegistryServer


def test_fake_binlogs_advance_safe_ts_while_idle(pump_factory: PumpFactory) -> None:
    node = pump_factory.start("idle", fake_binlog_interval_s=0.2)
    first = status(node.addr).safe_ts
    assert first > 0  # the first fake binlog is written at start
    seen = [first]
    for _ in range(3):
        seen.append(wait_until(lambda: (s := status(node.addr).safe_ts) > seen[-1] and s, timeout=5))
    assert seen == sorted(seen)
    st = status(node.addr)
    assert st.max_commit_ts == 0 and st.pending_txns == 0  # fake binlogs are no transactions
    # The safe ts tracks the wall clock.
    assert now_ts() - st.safe_ts < now_ts(2_000) - now_ts()
    assert pull(node.addr, 1, st.safe_ts) == []


def test_missing_commit_resolved_as_committed(
    pump_factory: PumpFactory, reg: RegistryClient, upstream: Upstream
) -> None:
    node = pump_factory.start("p1", txn_timeout_s=0.5)
    start = reg.get_ts()
    write_one(node.addr, prewrite(start))
    commit_ts = reg.get_ts()
    st = status(node.addr)
    assert st.pending_txns == 1 and st.safe_ts <= start
    # The upstream committed, but the commit binlog never comes.
    upstream.provider.set_committed(start, commit_ts)
    wait_until(lambda: status(node.addr).pending_txns == 0, timeout=10, what="resolution")
    wait_safe(node.addr, commit_ts + 1)
    (b,) = pull(node.addr, start, commit_ts + 1)
    assert (b.start_ts, b.commit_ts) == (start, commit_ts) and row_start_ts(b) == start
    assert status(node.addr).max_commit_ts >= commit_ts
    # The writer's commit arriving late is an idempotent retry.
    code, _ = refusal(lambda: write_one(node.addr, commit(start, commit_ts)))
    assert code == grpc.StatusCode.ALREADY_EXISTS


def test_missing_commit_resolved_as_rolled_back(
    pump_factory: PumpFactory, reg: RegistryClient, upstream: Upstream
) -> None:
    node = pump_factory.start("p1", txn_timeout_s=0.5)
    start = reg.get_ts()
    write_one(node.addr, prewrite(start))
    upstream.provider.set_rolled_back(start)
    wait_until(lambda: status(node.addr).pending_txns == 0, timeout=10, what="resolution")
    after = reg.get_ts()
    wait_safe(node.addr, after)
    assert pull(node.addr, start, after) == []
    code, details = refusal(lambda: write_one(node.addr, commit(start, start + 10)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "rolled back" in details


def test_missing_commit_running_keeps_waiting(
    pump_factory: PumpFactory, reg: RegistryClient, upstream: Upstream
) -> None:
    node = pump_factory.start("p1", txn_timeout_s=0.3, fake_binlog_interval_s=0.2)
    start = reg.get_ts()
    write_one(node.addr, prewrite(start))
    ghost = reg.get_ts()
    write_one(node.addr, prewrite(ghost, writer=b"ghost"))  # a writer the registry does not know
    # Several timeouts and fake binlogs later the transactions still hold the safe ts.
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        st = status(node.addr)
        assert st.pending_txns == 2
        assert st.safe_ts <= start
        time.sleep(0.1)
    assert node.storage.sorter.bound > ghost  # fake binlogs kept coming
    code, details = refusal(lambda: pull(node.addr, start, ghost + 1))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "safe ts" in details
    # Once the writer knows, the pump resolves it; the ghost still holds the safe ts.
    commit_ts = reg.get_ts()
    upstream.provider.set_committed(start, commit_ts)
    wait_until(lambda: status(node.addr).pending_txns == 1, timeout=10, what="resolution")
    assert status(node.addr).safe_ts == ghost
    # The ghost writer registers late and answers: then everything moves on.
    from pumpkit import register_writer

    from binlake.writer.txn_status import MemoryStatusProvider, TxnStatusServer

    ghost_provider = MemoryStatusProvider()
    ghost_server = TxnStatusServer(ghost_provider).start()
    try:
        register_writer(reg, ghost_server.addr, "ghost")
        ghost_provider.set_rolled_back(ghost)
        wait_until(lambda: status(node.addr).pending_txns == 0, timeout=10, what="ghost resolution")
    finally:
        ghost_server.stop(0.2)
    wait_safe(node.addr, commit_ts + 1)
    assert [(b.start_ts, b.commit_ts) for b in pull(node.addr, start, commit_ts + 1)] == [(start, commit_ts)]


def test_pause_pump(pump_factory: PumpFactory, reg: RegistryClient, registry: RegistryServer) -> None:
    node = pump_factory.start("p1")
    start = reg.get_ts()
    write_one(node.addr, prewrite(start))
    res = run_cli("ctl", "pause-pump", "p1", "--registry", registry.addr)
    assert res.returncode == 0, res.stderr
    assert "pausing" in res.stdout
    wait_until(lambda: status(node.addr).state == "pausing", timeout=5, what="pump to learn it is pausing")
    st = status(node.addr)
    assert st.accepting_writes is False
    # New transactions are refused...
    other = reg.get_ts()
    code, details = refusal(lambda: write_one(node.addr, prewrite(other)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "pausing" in details and "takes no new transactions" in details
    # ...while the pending one keeps the pump from reporting paused.
    time.sleep(0.6)
    assert reg.get_node("p1").state is NodeState.PAUSING
    commit_ts = reg.get_ts()
    write_one(node.addr, commit(start, commit_ts))
    wait_until(lambda: reg.get_node("p1").state is NodeState.PAUSED, timeout=30, what="paused")
    assert status(node.addr).state == "paused"
    # A paused pump still serves reads.
    wait_safe(node.addr, commit_ts + 1)
    assert [(b.start_ts, b.commit_ts) for b in pull(node.addr, start, commit_ts + 1)] == [(start, commit_ts)]


def test_offline_pump(pump_factory: PumpFactory, reg: RegistryClient, registry: RegistryServer) -> None:
    node = pump_factory.start("p1")
    start = reg.get_ts()
    write_one(node.addr, prewrite(start))
    commit_ts = reg.get_ts()
    write_one(node.addr, commit(start, commit_ts))
    res = run_cli("ctl", "offline-pump", "p1", "--registry", registry.addr, timeout=120)  # a CLI start under load
    assert res.returncode == 0, res.stderr
    assert "closing" in res.stdout and "stays readable" in res.stdout
    rec = wait_until(
        lambda: (r := reg.get_node("p1")).state is NodeState.OFFLINE and r, timeout=30, what="offline"
    )
    assert rec.offline_ts > rec.online_ts > 0
    # The Pump took the state before reporting it: the registry never leads it.
    assert status(node.addr).state == "offline"
    code, _ = refusal(lambda: write_one(node.addr, prewrite(reg.get_ts())))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    # Still readable.
    wait_safe(node.addr, commit_ts + 1)
    assert [(b.start_ts, b.commit_ts) for b in pull(node.addr, start, commit_ts + 1)] == [(start, commit_ts)]


def test_graceful_stop_reports_paused(pump_factory: PumpFactory, reg: RegistryClient) -> None:
    node = pump_factory.start("p1")
    assert reg.get_node("p1").state is NodeState.ONLINE
    node.stop()
    assert reg.get_node("p1").state is NodeState.PAUSED
    with pytest.raises(grpc.RpcError):
        status(node.addr)


def test_stop_without_report_stays_online(pump_factory: PumpFactory, reg: RegistryClient) -> None:
    node = pump_factory.start("p1")
    node.stop(report_paused=False)
    assert reg.get_node("p1").state is NodeState.ONLINE


def test_restart_on_same_data_dir(pump_factory: PumpFactory, reg: RegistryClient) -> None:
    node = pump_factory.start("p1")
    first = reg.get_node("p1")
    start = reg.get_ts()
    write_one(node.addr, prewrite(start))
    commit_ts = reg.get_ts()
    write_one(node.addr, commit(start, commit_ts))
    pending = reg.get_ts()
    write_one(node.addr, prewrite(pending))
    node.stop()
    assert reg.get_node("p1").state is NodeState.PAUSED

    # No node id given: the data dir remembers it.
    again = pump_factory.create("p1", node_id=None)
    assert again.node_id == "p1"
    again.start()
    rec = reg.get_node("p1")
    assert rec.state is NodeState.ONLINE and rec.addr == again.addr
    assert rec.online_ts > first.online_ts
    st = status(again.addr)
    assert st.node_id == "p1" and st.pending_txns == 1 and st.accepting_writes
    # The pending prewrite survived and still takes its commit.
    commit2 = reg.get_ts()
    write_one(again.addr, commit(pending, commit2))
    wait_safe(again.addr, commit2 + 1)
    got = [(b.start_ts, b.commit_ts) for b in pull(again.addr, start, commit2 + 1)]
    assert got == [(start, commit_ts), (pending, commit2)]
    again.stop()
    # A different node id on this data dir is refused...
    with pytest.raises(errors.FailedPrecondition, match="belongs to pump 'p1'"):
        PumpNode(pump_factory.settings("p1", node_id="someone-else"))
    # ...and the refusal leaves the data dir free for the right one.
    third = pump_factory.start("p1")
    assert status(third.addr).pending_txns == 0
    assert len(pull(third.addr, start, commit2 + 1)) == 2


def test_two_pumps_on_one_data_dir(pump_factory: PumpFactory) -> None:
    node = pump_factory.start("p1")
    with pytest.raises(errors.FailedPrecondition, match="in use by another pump") as info:
        PumpNode(pump_factory.settings("p1"))
    assert str(node.data_dir) in str(info.value) and "--data-dir" in str(info.value)
    # The first one is unaffected.
    assert status(node.addr).accepting_writes
