"""PumpClient against real Pumps: routing strategies, commit affinity, failover
and probing, a registry outage, coalescing of concurrent writers, and the
reader's de-duplication of a transaction held by two Pumps."""

from __future__ import annotations

import collections
import pathlib
import threading
from typing import Any

import pytest
from pumpkit import (
    PumpFactory,
    commit,
    free_port,
    now_ts,
    prewrite,
    pull,
    row_start_ts,
    run_cli,
    start_registry,
    wait_safe,
    wait_until,
    write_one,
)

from binlake import config, errors, tso
from binlake.client.pump_client import PumpClient
from binlake.client.reader import pull_window
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeRecord
from binlake.registry.server import RegistryServer

CLIENT_DEFAULTS: dict[str, Any] = {
    "refresh_interval_s": 0.2,
    "probe_interval_s": 0.2,
    "write_timeout_s": 5.0,
    "commit_retry_s": 5.0,
    "max_failures": 2,
}


def client_settings(registry_addr: str, **overrides: Any) -> config.ClientSettings:
    return config.load(config.ClientSettings, registry=registry_addr, **{**CLIENT_DEFAULTS, **overrides})


def make_client(registry: RegistryServer, **overrides: Any) -> PumpClient:
    return PumpClient(registry.addr, settings=client_settings(registry.addr, **overrides))


def run_txn(client: PumpClient, reg: RegistryClient) -> tuple[int, int, str]:
    start = reg.get_ts()
    node_id = client.write_prewrite(prewrite(start))
    commit_ts = reg.get_ts()
    client.write_commit(commit(start, commit_ts), node_id)
    return start, commit_ts, node_id


def served_by(addr: str, start: int, end: int) -> list[tuple[int, int]]:
    wait_safe(addr, end)
    return [(b.start_ts, b.commit_ts) for b in pull(addr, start, end)]


@pytest.fixture
def three(pump_factory: PumpFactory) -> dict[str, Any]:
    return {name: pump_factory.start(name) for name in ("p1", "p2", "p3")}


# ---------------------------------------------------------------------------- routing


def test_range_spreads_evenly_and_commits_follow_prewrites(
    three: dict[str, Any], registry: RegistryServer, reg: RegistryClient
) -> None:
    with make_client(registry, strategy="range") as client:
        assert client.available() == ["p1", "p2", "p3"]
        txns = [run_txn(client, reg) for _ in range(30)]
    assert collections.Counter(n for _, _, n in txns) == {"p1": 10, "p2": 10, "p3": 10}
    first, last = txns[0][0], txns[-1][1] + 1
    # Every commit reached the pump that took its prewrite: each pump holds
    # exactly the complete transactions routed to it, and nothing is pending.
    for name, node in three.items():
        expected = [(s, c) for s, c, n in txns if n == name]
        assert served_by(node.addr, first, last) == expected
        assert node.storage.pending_count == 0


def test_hash_is_deterministic(three: dict[str, Any], registry: RegistryServer, reg: RegistryClient) -> None:
    starts = [reg.get_ts() for _ in range(30)]
    with make_client(registry, strategy="hash") as a, make_client(registry, strategy="hash") as b:
        first = {s: a.write_prewrite(prewrite(s)) for s in starts}
        # Another client (same pumps) picks the same pump for each start_ts: the
        # retried prewrite lands where the first one is (ALREADY_EXISTS = success).
        second = {s: b.write_prewrite(prewrite(s)) for s in starts}
        assert first == second
        assert len(set(first.values())) >= 2
        commit_ts = reg.get_ts()
        for s, node_id in first.items():
            b.write_commit(commit(s, commit_ts), node_id)
    for name, node in three.items():
        assert node.storage.pending_count == 0
        assert len(served_by(node.addr, starts[0], commit_ts + 1)) == sum(1 for n in first.values() if n == name)


@pytest.mark.parametrize(
    "good,bad",
    [
        pytest.param({"disk_free_bytes": 900, "disk_used_bytes": 100}, {"disk_free_bytes": 100, "disk_used_bytes": 900},
                     id="more-free-disk"),
        pytest.param({"disk_free_bytes": 500, "disk_used_bytes": 500, "load": 0.0},
                     {"disk_free_bytes": 500, "disk_used_bytes": 500, "load": 50_000.0}, id="lower-load"),
    ],
)
def test_score_prefers_lower_load_and_more_free_disk(
    pump_factory: PumpFactory, registry: RegistryServer, reg: RegistryClient,
    good: dict[str, Any], bad: dict[str, Any],
) -> None:
    # Pumps that do not heartbeat during the test, so the reports below stay as set.
    nodes = {name: pump_factory.start(name, heartbeat_interval_s=600) for name in ("good", "bad")}
    for name, fields in (("good", good), ("bad", bad)):
        reg.heartbeat(NodeRecord(node_id=name, kind="pump", addr=nodes[name].addr, **fields))
    with make_client(registry, strategy="score") as client:
        picks = collections.Counter(client.write_prewrite(prewrite(reg.get_ts())) for _ in range(200))
    # Expected shares are about 90/10 (disk) and 86/14 (load); 150 is > 4 sigma away.
    assert picks["good"] > 150, picks
    assert picks["good"] + picks["bad"] == 200


# ---------------------------------------------------------------------------- failures


def test_dead_pump_unavailable_after_max_failures() -> None:
    dead = f"127.0.0.1:{free_port()}"
    settings = config.ClientSettings(max_failures=3, probe_interval_s=60, write_timeout_s=2)
    with PumpClient(pumps={"dead": dead}, settings=settings) as client:
        for attempt in range(1, 4):
            assert client.available() == ["dead"]
            with pytest.raises(errors.Unavailable, match="no pump accepted the prewrite") as info:
                client.write_prewrite(prewrite(1000 + attempt))
            assert "dead" in str(info.value)
        assert client.available() == [] and client.unavailable() == ["dead"]
        with pytest.raises(errors.Unavailable, match="no online pump is known"):
            client.write_prewrite(prewrite(2000))


def test_failover_and_probe_takes_pump_back(
    three: dict[str, Any], pump_factory: PumpFactory, registry: RegistryServer, reg: RegistryClient
) -> None:
    with make_client(registry, strategy="range", max_failures=2) as client:
        before = [run_txn(client, reg) for _ in range(6)]
        assert {n for _, _, n in before} == {"p1", "p2", "p3"}
        p2 = three["p2"]
        addr = p2.addr
        p2.stop(grace=0.5, report_paused=False)  # dies as far as the registry knows: still "online"
        assert reg.get_node("p2").state.value == "online"

        during = [run_txn(client, reg) for _ in range(30)]  # every write succeeds
        assert {n for _, _, n in during} == {"p1", "p3"}
        assert client.unavailable() == ["p2"]
        assert client.available() == ["p1", "p3"]

        # Restart p2 on the same address and data dir; the probe takes it back.
        again = pump_factory.start("p2", addr=addr)
        assert again.addr == addr
        wait_until(lambda: "p2" in client.available(), timeout=10, what="probe to take p2 back")
        after = [run_txn(client, reg) for _ in range(30)]
        assert collections.Counter(n for _, _, n in after)["p2"] >= 5
    # Nothing was lost on the restarted pump: its old and new transactions are served.
    end = after[-1][1] + 1
    assert served_by(again.addr, before[0][0], end) == [(s, c) for s, c, n in before + after if n == "p2"]


def test_commit_to_stopped_pump_fails_after_retry_window(
    pump_factory: PumpFactory, registry: RegistryServer, reg: RegistryClient
) -> None:
    node = pump_factory.start("p1")
    with make_client(registry, commit_retry_s=0.5) as client:
        start = reg.get_ts()
        assert client.write_prewrite(prewrite(start)) == "p1"
        node.stop(grace=0.5, report_paused=False)
        with pytest.raises(errors.Unavailable, match="did not acknowledge the commit") as info:
            client.write_commit(commit(start, reg.get_ts()), "p1")
        assert "resolve the transaction from the writer's status" in str(info.value)
        with pytest.raises(errors.InvalidArgument):
            client.write_commit(prewrite(start), "p1")
        with pytest.raises(errors.InvalidArgument):
            client.write_prewrite(commit(start, start + 1))


def test_registry_briefly_down_client_uses_cached_view(
    pump_factory: PumpFactory, registry: RegistryServer, reg: RegistryClient, tmp_path: pathlib.Path
) -> None:
    nodes = {name: pump_factory.start(name) for name in ("p1", "p2")}
    addr = registry.addr
    restarted: RegistryServer | None = None
    # A registry client with a short timeout, so a refresh gives up quickly.
    short = RegistryClient(addr, timeout_s=0.5)
    client = PumpClient(registry_client=short, settings=client_settings(addr, strategy="range"))
    with client:
        run_txn(client, reg)
        seen = reg.get_node("p1").updated_at_ms
        registry.stop(grace=0)
        try:
            client.refresh()  # keeps the cached list instead of failing
            assert client.available() == ["p1", "p2"]
            base = now_ts()
            txns = []
            for i in range(10):
                start = base + 10 * i
                node_id = client.write_prewrite(prewrite(start))
                client.write_commit(commit(start, start + 5), node_id)
                txns.append((start, start + 5, node_id))
            assert {n for _, _, n in txns} == {"p1", "p2"}
            assert client.available() == ["p1", "p2"]
            # The registry comes back on the same address and data dir; heartbeats resume.
            restarted = start_registry(tmp_path / "registry", addr=addr)
            wait_until(lambda: reg.get_node("p1").updated_at_ms > seen, timeout=15, what="heartbeats")
            end = max(c for _, c, _ in txns) + 1
            for name, node in nodes.items():
                wait_safe(node.addr, end, timeout=20)
                assert [(b.start_ts, b.commit_ts) for b in pull(node.addr, base, end)] == [
                    (s, c) for s, c, n in txns if n == name
                ]
        finally:
            client.close()
            short.close()
            pump_factory.stop_all()  # while a registry is up to hear their last heartbeat
            if restarted is not None:
                restarted.stop(grace=0.5)


def test_concurrent_writers_are_coalesced(
    pump_factory: PumpFactory, registry: RegistryServer, reg: RegistryClient
) -> None:
    node = pump_factory.start("p1")
    threads_n, per_thread = 16, 30
    results: list[tuple[int, int]] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    stats_before = (node.storage.stats.binlogs, node.storage.stats.groups)
    with make_client(registry) as client:
        barrier = threading.Barrier(threads_n)

        def writer() -> None:
            barrier.wait()
            try:
                for _ in range(per_thread):
                    start, commit_ts, _ = run_txn(client, reg)
                    with lock:
                        results.append((start, commit_ts))
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=writer) for _ in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert failures == []
    sent = 2 * threads_n * per_thread
    assert len(results) == threads_n * per_thread
    # Write requests the pump received, whatever their form (unary, batch, stream message).
    rpcs = sum(
        sample.value
        for metric in node.metrics.registry.collect() if metric.name == "binlake_pump_write_requests"
        for sample in metric.samples if sample.name.endswith("_total")
    )
    binlogs = node.storage.stats.binlogs - stats_before[0]
    groups = node.storage.stats.groups - stats_before[1]
    assert binlogs >= sent
    assert rpcs < sent, (rpcs, sent)
    assert groups < binlogs, (groups, binlogs)
    results.sort(key=lambda t: (t[1], t[0]))
    got = served_by(node.addr, min(s for s, _ in results), results[-1][1] + 1)
    assert got == results


def test_a_group_of_prewrites_and_commits_is_one_batch_per_pump_and_fails_over(
    three: dict[str, Any], registry: RegistryServer, reg: RegistryClient
) -> None:
    """write_prewrites/write_commits (a source's group): each Pump's share travels as one
    write request; a Pump that died is left for the others; every commit lands on the
    Pump of its prewrite."""

    def requests(node: Any) -> float:
        return sum(sample.value for metric in node.metrics.registry.collect()
                   if metric.name == "binlake_pump_write_requests"
                   for sample in metric.samples if sample.name.endswith("_total"))

    with make_client(registry, strategy="range", max_failures=1) as client:
        with pytest.raises(errors.InvalidArgument, match="PREWRITE"):
            client.write_prewrites([commit(1, 2)])
        with pytest.raises(ValueError, match="3 binlogs but 1 pumps"):
            client.write_commits([commit(1, 2)] * 3, ["p1"])
        for _ in range(3):  # a stream open to each Pump: the counts below are the group's alone
            run_txn(client, reg)
        before = {n: requests(node) for n, node in three.items()}
        first = reg.get_ts_batch(30)
        pumps = client.write_prewrites([prewrite(first + i) for i in range(30)])
        assert collections.Counter(pumps) == {"p1": 10, "p2": 10, "p3": 10}
        assert {n: requests(node) - before[n] for n, node in three.items()} == {"p1": 1, "p2": 1, "p3": 1}
        c0 = reg.get_ts_batch(30)
        client.write_commits([commit(first + i, c0 + i) for i in range(30)], pumps)
        txns = [(first + i, c0 + i, pumps[i]) for i in range(30)]

        three["p2"].stop(grace=0.5, report_paused=False)  # still "online" to the registry
        s2 = reg.get_ts_batch(12)
        later = client.write_prewrites([prewrite(s2 + i) for i in range(12)])
        assert "p2" not in later and len(later) == 12
        c2 = reg.get_ts_batch(12)
        client.write_commits([commit(s2 + i, c2 + i) for i in range(12)], later)
        txns += [(s2 + i, c2 + i, later[i]) for i in range(12)]
    end = txns[-1][1] + 1
    for name in ("p1", "p3"):
        assert served_by(three[name].addr, first, end) == [(s, c) for s, c, n in txns if n == name]


def test_duplicate_prewrite_on_two_pumps_is_read_once(
    pump_factory: PumpFactory, reg: RegistryClient
) -> None:
    p1, p2 = pump_factory.start("p1"), pump_factory.start("p2")
    start = reg.get_ts()
    write_one(p1.addr, prewrite(start))  # a prewrite retried on another pump after a lost answer
    write_one(p2.addr, prewrite(start))
    other = reg.get_ts()
    write_one(p1.addr, prewrite(other))
    commit_ts = reg.get_ts()
    write_one(p1.addr, commit(start, commit_ts))  # both resolve to the same commit_ts
    write_one(p2.addr, commit(start, commit_ts))
    write_one(p1.addr, commit(other, commit_ts + 1))
    end = commit_ts + 2
    assert len(served_by(p1.addr, start, end)) == 2 and len(served_by(p2.addr, start, end)) == 1
    merged = list(pull_window({"p1": p1.addr, "p2": p2.addr}, start, end, wait=True, wait_timeout_s=10))
    assert [(b.start_ts, b.commit_ts) for b in merged] == [(start, commit_ts), (other, commit_ts + 1)]
    assert [row_start_ts(b) for b in merged] == [start, other]


# ---------------------------------------------------------------------------- background commits


def test_background_commits_land_and_retry_after_a_pump_restart(
    pump_factory: PumpFactory, registry: RegistryServer, reg: RegistryClient
) -> None:
    """``write_commit_async`` sends on the write stream directly; a commit whose
    first attempt fails (the Pump is down) is retried until the Pump is back."""
    port = free_port()
    pump_factory.start("a1", addr=f"127.0.0.1:{port}")
    with make_client(registry, commit_retry_s=20.0) as client:
        done = []
        for _ in range(20):
            start = reg.get_ts()
            node = client.write_prewrite(prewrite(start))
            commit_ts = reg.get_ts()
            client.write_commit_async(commit(start, commit_ts), node).result(timeout=10)
            done.append((start, commit_ts))
        start = reg.get_ts()
        node = client.write_prewrite(prewrite(start))
        commit_ts = reg.get_ts()
        pump_factory.nodes[-1].stop(grace=0.2, report_paused=False)
        late = client.write_commit_async(commit(start, commit_ts), node)
        threading.Timer(1.0, lambda: pump_factory.start("a1", addr=f"127.0.0.1:{port}")).start()
        late.result(timeout=20)
        client.flush(timeout=5)
        done.append((start, commit_ts))
    addr = pump_factory.nodes[-1].addr
    assert served_by(addr, done[0][0], commit_ts + 1) == done


def test_a_broken_channel_fails_writes_promptly_and_never_wedges_the_sender(
    pump_factory: PumpFactory, registry: RegistryServer, reg: RegistryClient
) -> None:
    import time

    node = pump_factory.start("b1")
    with make_client(registry, write_timeout_s=5.0) as client:
        run_txn(client, reg)
        conn = client._conn("b1")
        conn._lt.run(conn._channel.close())  # as if the channel died under the client
        for _ in range(3):  # each write fails on its own, quickly: the sender is not stuck
            t0 = time.monotonic()
            with pytest.raises(errors.Unavailable):
                conn.write(prewrite(reg.get_ts()).SerializeToString())
            assert time.monotonic() - t0 < 4.0
    assert node.storage.pending_count == 0


# ---------------------------------------------------------------------------- replication


def test_replicated_group_puts_each_prewrite_on_two_pumps(
    three: dict[str, Any], registry: RegistryServer, reg: RegistryClient
) -> None:
    """replicas = 2: each prewrite of a group is on two Pumps (one batch per Pump), its
    commit on both; a Pump down is replaced by the third; every copy is complete."""
    with make_client(registry, strategy="range", max_failures=1, replicas=2) as client:
        first = reg.get_ts_batch(12)
        placements = client.write_prewrites([prewrite(first + i) for i in range(12)])
        assert all(len(client.holders(p)) == 2 and len(set(client.holders(p))) == 2 for p in placements)
        c0 = reg.get_ts_batch(12)
        client.write_commits([commit(first + i, c0 + i) for i in range(12)], placements)
        txns = [(first + i, c0 + i, client.holders(placements[i])) for i in range(12)]
        three["p2"].stop(grace=0.5, report_paused=False)  # still "online" to the registry
        s2 = reg.get_ts_batch(6)
        later = client.write_prewrites([prewrite(s2 + i) for i in range(6)])
        assert all(sorted(client.holders(p)) == ["p1", "p3"] for p in later)
        c2 = reg.get_ts_batch(6)
        client.write_commits([commit(s2 + i, c2 + i) for i in range(6)], later)
        txns += [(s2 + i, c2 + i, client.holders(later[i])) for i in range(6)]
    end = txns[-1][1] + 1
    for name in ("p1", "p3"):
        assert served_by(three[name].addr, first, end) == [(s, c) for s, c, h in txns if name in h]


def test_replicas_prefer_distinct_hosts() -> None:
    """Two Pumps on one host and one on another: every pair of copies spans both hosts."""
    pumps = {"a": "127.0.0.1:1", "b": "127.0.0.1:2", "c": "127.0.0.2:3"}
    with PumpClient(pumps=pumps, settings=config.load(config.ClientSettings, replicas=2)) as client:
        for ts in range(1, 40):
            assert "c" in client._pick_many(ts, set(), 2)
        assert client.holders("a") == ["a"] and client.holders("a,c") == ["a", "c"]
    with pytest.raises(errors.InvalidArgument, match="min_acks=3 is above replicas=2"):
        config.load(config.ClientSettings, replicas=2, min_acks=3)


def test_client_follows_the_registrys_replication_setting(
    three: dict[str, Any], registry: RegistryServer, reg: RegistryClient
) -> None:
    """A setting made with `ctl replication` applies to prewrites from its TSO on;
    earlier ones keep the R they were written with."""
    with make_client(registry, strategy="range") as client:
        before = reg.get_ts()
        assert client.write_prewrite(prewrite(before)) in three
        res = run_cli("ctl", "replication", "--replicas", "2", "--grace-s", "0.5", "--registry", registry.addr)
        assert res.returncode == 0, res.stderr
        assert "replicas=2 min_acks=2" in res.stdout
        history = reg.get_replication()
        # Reads take the new W once a transaction's lifetime (txn_lookback_s) has passed.
        reads_from = tso.format_ts(tso.compose(tso.physical_ms(history[-1].from_ts) + 600_000))
        assert f"(600s) before its start; min_acks=2 from windows starting at {reads_from}" in res.stdout, res.stdout
        wait_until(lambda: client.replication_at(history[-1].from_ts) == (2, 2), timeout=5, what="the setting")
        assert client.replication_at(before) == (1, 1)
        wait_until(lambda: reg.get_ts() > history[-1].from_ts, timeout=5, what="the setting's TSO")
        after = reg.get_ts()
        placement = client.write_prewrite(prewrite(after))
        assert len(client.holders(placement)) == 2
        client.write_commit(commit(after, reg.get_ts()), placement)
    res = run_cli("ctl", "replication", "--replicas", "1", "--min-acks", "2", "--registry", registry.addr)
    assert res.returncode == 2 and "min_acks=2 is above replicas=1" in res.stderr and "Traceback" not in res.stderr


def test_a_batch_holds_prewrites_or_outcomes_never_both() -> None:
    """A Pump answers a batch of commits and rollbacks without waiting for an fsync,
    one holding a prewrite only after it: the stream's batches keep the two apart
    (oldest first, each kind in its queued order), so a commit never waits for
    another transaction's prewrite fsync."""
    from binlake.client.pump_client import PumpConn, _Item
    from binlake.proto import binlog_pb2

    conn = PumpConn("p1", f"127.0.0.1:{free_port()}", config.ClientSettings(max_batch_binlogs=3))
    try:
        rollback = binlog_pb2.Binlog(tp=binlog_pb2.ROLLBACK, start_ts=7)
        sent = [prewrite(1), commit(2, 3), prewrite(4), commit(5, 6), rollback, prewrite(8), prewrite(9)]
        with conn._lock:
            conn._queue.extend(_Item(b.SerializeToString()) for b in sent)
            batches = []
            while conn._queue:
                batches.append([binlog_pb2.Binlog.FromString(i.payload).start_ts for i in conn._take_batch()])
        assert batches == [[1, 4, 8], [2, 5, 7], [9]]
    finally:
        conn._queue.clear()
        conn.close()
