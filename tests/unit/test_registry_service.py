"""Tests of the registry without a transport: the SQLite store (persistence,
exclusivity, store specs), the TSO across restarts, node validation and every
rule of the node state machine."""

from __future__ import annotations

import dataclasses
import pathlib
import string
from collections.abc import Iterator

import pytest

from binlake import errors, tso
from binlake.registry.model import NodeRecord, NodeState, ReplicationSetting
from binlake.registry.service import DEAD_AFTER_MS, MAX_TS_COUNT, RegistryService
from binlake.registry.store import DB_FILE_NAME, RegistryStore, SQLiteStore
from binlake.registry.stores import open_store

ONLINE, PAUSING, PAUSED, CLOSING, OFFLINE = (
    NodeState.ONLINE,
    NodeState.PAUSING,
    NodeState.PAUSED,
    NodeState.CLOSING,
    NodeState.OFFLINE,
)
T0_MS = 1_763_712_000_000  # 2025-11-21


class Clock:
    def __init__(self, now_ms: int = T0_MS) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def store(tmp_path: pathlib.Path) -> Iterator[RegistryStore]:
    s = open_store(tmp_path / "registry")
    yield s
    s.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(store: RegistryStore, clock: Clock) -> RegistryService:
    return RegistryService(store, tso_window_ms=3000, clock_ms=clock)


def pump(node_id: str = "pump-1", **fields: object) -> NodeRecord:
    return NodeRecord(node_id=node_id, kind="pump", addr="127.0.0.1:8250", **fields)  # type: ignore[arg-type]


def writer(node_id: str = "writer-1") -> NodeRecord:
    return NodeRecord(node_id=node_id, kind="writer", addr="127.0.0.1:9000")


def force_state(service: RegistryService, node_id: str, state: NodeState) -> NodeRecord:
    """Put a node directly into ``state`` (test setup, bypassing the rules)."""
    record = service.get_node(node_id)
    record.state = state
    record.offline_ts = service.get_ts() if state is OFFLINE else 0
    service.store.put_node(record)
    return record


# -- the store ---------------------------------------------------------------------------


def test_store_persists_across_reopen(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "reg"
    with open_store(directory) as first:
        assert (directory / DB_FILE_NAME).is_file()
        cluster_id = first.cluster_id()
        assert 0 < cluster_id < 1 << 63
        assert first.load_tso_limit() == 0
        first.save_tso_limit(123_456)
        first.put_node(dataclasses.replace(pump(), online_ts=99, load=1.5, metrics_addr="127.0.0.1:9100"))
        first.put_node(dataclasses.replace(writer(), online_ts=100))
        revision = first.revision()
        assert revision == 2
    with open_store(directory) as second:
        assert second.cluster_id() == cluster_id
        assert second.load_tso_limit() == 123_456
        assert second.revision() == revision
        stored = second.get_node("pump-1")
        assert stored == dataclasses.replace(pump(), online_ts=99, load=1.5, metrics_addr="127.0.0.1:9100")
        assert stored.state is ONLINE
        assert {n.node_id for n in second.list_nodes(None)} == {"pump-1", "writer-1"}
        assert [n.node_id for n in second.list_nodes("writer")] == ["writer-1"]
        assert second.get_node("nope") is None


def test_store_tso_limit_never_decreases(store: RegistryStore) -> None:
    store.save_tso_limit(5000)
    store.save_tso_limit(4000)
    assert store.load_tso_limit() == 5000
    with pytest.raises(errors.InvalidArgument):
        store.save_tso_limit(-1)


def test_store_rejects_records_breaking_invariants(store: RegistryStore) -> None:
    import sqlite3

    # offline_ts > 0 exactly when offline: a record saying otherwise is a bug upstream.
    with pytest.raises(sqlite3.IntegrityError):
        store.put_node(dataclasses.replace(pump(), online_ts=5, state=OFFLINE, offline_ts=0))
    assert store.get_node("pump-1") is None
    assert store.revision() == 0


def test_store_is_exclusive_to_one_process(tmp_path: pathlib.Path) -> None:
    with open_store(tmp_path) as _first:
        with pytest.raises(errors.FailedPrecondition, match="in use by another registry"):
            open_store(tmp_path)
    # Released on close.
    open_store(tmp_path).close()


def test_closed_store_says_so(tmp_path: pathlib.Path) -> None:
    s = open_store(tmp_path)
    s.close()
    s.close()  # twice is harmless
    with pytest.raises(errors.Unavailable, match="is closed"):
        s.cluster_id()


def test_open_store_specs(tmp_path: pathlib.Path) -> None:
    url_file = tmp_path / "sub" / "r.db"
    with open_store(f"sqlite:///{url_file}") as s:
        assert isinstance(s, SQLiteStore)
        assert s.describe() == str(url_file)
    assert url_file.is_file()
    with open_store(str(tmp_path / "as-text")) as s:
        assert s.describe() == str(tmp_path / "as-text" / DB_FILE_NAME)

    with pytest.raises(errors.InvalidArgument, match="empty endpoint"):
        open_store("etcd://10.0.0.1:2379,,10.0.0.2:2379")
    with pytest.raises(errors.InvalidArgument, match="must be HOST:PORT"):
        open_store("etcd://10.0.0.1")
    with pytest.raises(errors.InvalidArgument, match="unknown scheme 'redis'"):
        open_store("redis://localhost")
    with pytest.raises(errors.InvalidArgument, match="sqlite:///path/to/file.db"):
        open_store("sqlite://relative.db")
    with pytest.raises(errors.InvalidArgument, match="durable file"):
        open_store("sqlite:///:memory:")
    with pytest.raises(errors.InvalidArgument):
        open_store("")
    a_file = tmp_path / "plain.txt"
    a_file.write_text("x")
    with pytest.raises(errors.InvalidArgument, match="is a file"):
        open_store(a_file)


def test_open_store_refuses_a_non_database(tmp_path: pathlib.Path) -> None:
    (tmp_path / DB_FILE_NAME).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(errors.FailedPrecondition, match="not a usable SQLite database"):
        open_store(tmp_path)
    # The failed open released its lock.
    (tmp_path / DB_FILE_NAME).unlink()
    open_store(tmp_path).close()


# -- TSO through the service --------------------------------------------------------------


def test_get_ts_counts(service: RegistryService) -> None:
    first = service.get_ts(10)
    assert service.get_ts() >= first + 10
    big = service.get_ts(MAX_TS_COUNT)
    assert tso.logical(big) == 0
    for bad in (0, -1, MAX_TS_COUNT + 1):
        with pytest.raises(errors.InvalidArgument, match=r"count must be in \[1, 262144\]"):
            service.get_ts(bad)
    for bad in (True, 1.0, "1"):
        with pytest.raises(errors.InvalidArgument, match="count must be an integer"):
            service.get_ts(bad)  # type: ignore[arg-type]


def test_ts_keeps_increasing_across_restart(tmp_path: pathlib.Path) -> None:
    clock = Clock(T0_MS)
    with open_store(tmp_path) as s:
        svc = RegistryService(s, tso_window_ms=1000, clock_ms=clock)
        seen = []
        for _ in range(50):
            seen.append(svc.get_ts(3))
            clock.now_ms += 97
        cluster_id = s.cluster_id()
    # The restarted registry's clock is an hour behind.
    with open_store(tmp_path) as s:
        assert s.cluster_id() == cluster_id
        svc = RegistryService(s, tso_window_ms=1000, clock_ms=Clock(T0_MS - 3_600_000))
        assert svc.get_ts() > max(seen) + 2


def test_cluster_info(service: RegistryService) -> None:
    cluster_id, revision = service.cluster_info()
    assert cluster_id == service.store.cluster_id()
    assert revision == 0
    service.register(pump())
    assert service.cluster_info() == (cluster_id, 1)


# -- registration -----------------------------------------------------------------------------


def test_register_stamps_online(service: RegistryService, clock: Clock) -> None:
    before = service.get_ts()
    reported = pump(state=OFFLINE, offline_ts=5, max_commit_ts=42, gc_ts=7, updated_at_ms=1)
    record = service.register(reported)
    assert record.state is ONLINE
    assert record.online_ts > before
    assert record.offline_ts == 0
    assert record.updated_at_ms == clock.now_ms
    # Reported status comes along (a restarted Pump knows where its data ends).
    assert (record.max_commit_ts, record.gc_ts) == (42, 7)
    assert service.get_node("pump-1") == record


def test_reregister_after_offline_starts_a_new_period(service: RegistryService) -> None:
    first = service.register(pump())
    service.heartbeat(dataclasses.replace(first, state=OFFLINE))
    assert service.get_node("pump-1").state is OFFLINE
    again = service.register(pump())
    assert again.state is ONLINE
    assert again.online_ts > first.online_ts
    assert again.offline_ts == 0


def test_register_refuses_a_kind_change(service: RegistryService) -> None:
    service.register(pump("node-a"))
    with pytest.raises(errors.FailedPrecondition, match="already registered as a pump"):
        service.register(NodeRecord("node-a", "writer", "127.0.0.1:9000"))


@pytest.mark.parametrize(
    ("node_id", "match"),
    [
        ("", "non-empty"),
        ("x" * 129, "at most 128"),
        ("pump 1", "without whitespace"),
        ("pump\t1", "without whitespace"),
        ("pump\x00", "printable"),
        ("pump\n", "printable"),
    ],
)
def test_register_validates_node_id(service: RegistryService, node_id: str, match: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=match):
        service.register(pump(node_id))


def test_register_accepts_edge_node_ids(service: RegistryService) -> None:
    service.register(pump("x" * 128))
    service.register(pump(string.ascii_letters + string.digits + "-_.:/@"))
    service.register(pump("pümp-ü"))


@pytest.mark.parametrize(
    ("addr", "match"),
    [
        ("localhost", "must be HOST:PORT"),
        (":8250", "has no host"),
        ("127.0.0.1:http", "is not a number"),
        ("127.0.0.1:70000", "0..65535"),
        ("127.0.0.1:0", "port must be > 0"),
        ("", "must be HOST:PORT"),
    ],
)
def test_register_validates_addr(service: RegistryService, addr: str, match: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=match):
        service.register(NodeRecord("pump-1", "pump", addr))


def test_register_validates_kind_metrics_and_status(service: RegistryService) -> None:
    with pytest.raises(errors.InvalidArgument, match="kind must be one of pump, writer"):
        service.register(NodeRecord("d-1", "drainer", "127.0.0.1:8249"))
    with pytest.raises(errors.InvalidArgument, match="metrics_addr"):
        service.register(pump(metrics_addr="nope"))
    with pytest.raises(errors.InvalidArgument, match="safe_ts must be an integer >= 0"):
        service.register(pump(safe_ts=-1))
    with pytest.raises(errors.InvalidArgument, match="load must be a finite number"):
        service.register(pump(load=float("nan")))
    assert service.list_nodes() == ([], 0)


# -- heartbeats ----------------------------------------------------------------------------------


def test_heartbeat_unknown_node(service: RegistryService) -> None:
    with pytest.raises(errors.NotFound, match="node ghost is not registered; a node registers"):
        service.heartbeat(pump("ghost"))


def test_heartbeat_copies_status(service: RegistryService, clock: Clock) -> None:
    registered = service.register(pump(metrics_addr="127.0.0.1:9100"))
    clock.now_ms += 2000
    report = dataclasses.replace(
        registered,
        kind="writer",  # ignored: the kind is fixed at registration
        addr="127.0.0.2:8251",
        metrics_addr="",
        max_commit_ts=1000,
        safe_ts=900,
        gc_ts=100,
        disk_used_bytes=1 << 30,
        disk_free_bytes=1 << 40,
        load=123.5,
        pending_txns=3,
        online_ts=1,  # ignored: stamped by the registry
        updated_at_ms=5,  # ignored: the registry's clock counts
    )
    reply = service.heartbeat(report)
    assert reply.kind == "pump"
    assert reply.online_ts == registered.online_ts
    assert reply.updated_at_ms == clock.now_ms
    assert (reply.addr, reply.metrics_addr) == ("127.0.0.2:8251", "")
    assert (reply.max_commit_ts, reply.safe_ts, reply.gc_ts) == (1000, 900, 100)
    assert (reply.disk_used_bytes, reply.disk_free_bytes, reply.load, reply.pending_txns) == (
        1 << 30,
        1 << 40,
        123.5,
        3,
    )
    assert service.get_node("pump-1") == reply


def test_heartbeat_validates(service: RegistryService) -> None:
    service.register(pump())
    with pytest.raises(errors.InvalidArgument, match="port must be > 0"):
        service.heartbeat(NodeRecord("pump-1", "pump", "127.0.0.1:0"))
    with pytest.raises(errors.InvalidArgument, match="disk_free_bytes"):
        service.heartbeat(pump(disk_free_bytes=-5))


# (stored state, reported state) -> resulting state, as the brief spells out.
HEARTBEAT_RULES = [
    (ONLINE, ONLINE, ONLINE),
    (ONLINE, PAUSING, PAUSING),
    (ONLINE, PAUSED, PAUSED),  # graceful shutdown
    (ONLINE, CLOSING, CLOSING),
    (ONLINE, OFFLINE, OFFLINE),
    (PAUSING, ONLINE, PAUSING),  # the reply tells the node to pause
    (PAUSING, PAUSING, PAUSING),
    (PAUSING, PAUSED, PAUSED),
    (PAUSING, CLOSING, CLOSING),
    (PAUSING, OFFLINE, OFFLINE),
    (PAUSED, ONLINE, PAUSED),  # only a registration brings it back
    (PAUSED, PAUSING, PAUSED),
    (PAUSED, PAUSED, PAUSED),
    (PAUSED, CLOSING, CLOSING),
    (PAUSED, OFFLINE, OFFLINE),
    (CLOSING, ONLINE, CLOSING),
    (CLOSING, PAUSING, CLOSING),
    (CLOSING, PAUSED, CLOSING),
    (CLOSING, CLOSING, CLOSING),
    (CLOSING, OFFLINE, OFFLINE),
    (OFFLINE, ONLINE, OFFLINE),  # an offline node must re-register
    (OFFLINE, PAUSING, OFFLINE),
    (OFFLINE, PAUSED, OFFLINE),
    (OFFLINE, CLOSING, OFFLINE),
    (OFFLINE, OFFLINE, OFFLINE),
]


@pytest.mark.parametrize(("stored", "reported", "expected"), HEARTBEAT_RULES)
def test_heartbeat_state_rules(
    service: RegistryService, stored: NodeState, reported: NodeState, expected: NodeState
) -> None:
    service.register(pump())
    before = force_state(service, "pump-1", stored)
    revision = service.cluster_info()[1]
    reply = service.heartbeat(pump(state=reported))
    assert reply.state is expected
    assert service.get_node("pump-1").state is expected
    assert service.cluster_info()[1] > revision
    if expected is OFFLINE:
        assert reply.offline_ts > 0
        if stored is OFFLINE:
            assert reply.offline_ts == before.offline_ts  # stamped only the first time
        else:
            assert reply.offline_ts > before.online_ts
    else:
        assert reply.offline_ts == 0


def test_offline_ts_is_stamped_once(service: RegistryService) -> None:
    service.register(pump())
    service.set_state("pump-1", CLOSING)
    first = service.heartbeat(pump(state=OFFLINE))
    later_ts = service.get_ts()
    second = service.heartbeat(pump(state=OFFLINE))
    third = service.heartbeat(pump(state=ONLINE))
    assert first.offline_ts == second.offline_ts == third.offline_ts < later_ts
    assert third.state is OFFLINE


def test_pause_round_trip(service: RegistryService) -> None:
    """An operator pauses a Pump: the Pump sees PAUSING in its heartbeat reply,
    drains, reports PAUSED; a restart (registration) brings it back."""
    service.register(pump())
    assert service.set_state("pump-1", PAUSING).state is PAUSING
    assert service.heartbeat(pump(state=ONLINE)).state is PAUSING
    assert service.heartbeat(pump(state=PAUSED)).state is PAUSED
    assert service.heartbeat(pump(state=ONLINE)).state is PAUSED
    assert service.register(pump()).state is ONLINE


# -- operator state changes --------------------------------------------------------------------------


# (current state, requested state) -> resulting state, or the error raised.
SET_STATE_RULES = [
    (ONLINE, PAUSING, PAUSING),
    (PAUSING, PAUSING, PAUSING),
    (PAUSED, PAUSING, PAUSED),
    (CLOSING, PAUSING, errors.FailedPrecondition),
    (OFFLINE, PAUSING, errors.FailedPrecondition),
    (ONLINE, CLOSING, CLOSING),
    (PAUSING, CLOSING, CLOSING),
    (PAUSED, CLOSING, CLOSING),
    (CLOSING, CLOSING, CLOSING),
    (OFFLINE, CLOSING, OFFLINE),
    (ONLINE, PAUSED, errors.FailedPrecondition),
    (PAUSING, PAUSED, errors.FailedPrecondition),
    (CLOSING, PAUSED, errors.FailedPrecondition),
    (ONLINE, OFFLINE, errors.FailedPrecondition),  # a live pump
    (CLOSING, OFFLINE, errors.FailedPrecondition),  # a live pump
    (OFFLINE, OFFLINE, OFFLINE),
]


@pytest.mark.parametrize(("current", "target", "expected"), SET_STATE_RULES)
def test_set_state_rules(
    service: RegistryService, current: NodeState, target: NodeState, expected: object
) -> None:
    service.register(pump())
    before = force_state(service, "pump-1", current)
    if isinstance(expected, type) and issubclass(expected, Exception):
        with pytest.raises(expected) as info:
            service.set_state("pump-1", target)
        message = str(info.value)
        # The message names both the current and the requested state.
        assert f"from {current.value} to {target.value}" in message
        assert service.get_node("pump-1") == before
        return
    reply = service.set_state("pump-1", target)
    assert reply.state is expected
    assert service.get_node("pump-1") == reply
    # Operator changes leave the node's own report time alone.
    assert reply.updated_at_ms == before.updated_at_ms


def test_set_state_online_is_not_for_operators(service: RegistryService) -> None:
    service.register(pump())
    force_state(service, "pump-1", PAUSED)
    with pytest.raises(errors.InvalidArgument, match="restart the node to bring it online"):
        service.set_state("pump-1", ONLINE)


def test_set_state_unknown_node_names_known_nodes(service: RegistryService) -> None:
    with pytest.raises(errors.NotFound, match="no nodes are registered"):
        service.set_state("ghost", PAUSING)
    service.register(pump("pump-b"))
    service.register(pump("pump-a"))
    with pytest.raises(errors.NotFound, match="node ghost is not registered; registered nodes: pump-a, pump-b"):
        service.set_state("ghost", PAUSING)


def test_set_state_accepts_state_names(service: RegistryService) -> None:
    service.register(pump())
    assert service.set_state("pump-1", "Pausing").state is PAUSING
    with pytest.raises(errors.InvalidArgument, match="unknown node state 'asleep'"):
        service.set_state("pump-1", "asleep")


def test_live_pump_offline_explains_closing(service: RegistryService, clock: Clock) -> None:
    service.register(pump())
    clock.now_ms += DEAD_AFTER_MS  # exactly 60 s silent: not yet dead
    with pytest.raises(errors.FailedPrecondition) as info:
        service.set_state("pump-1", OFFLINE)
    message = str(info.value)
    assert "from online to offline" in message
    assert "closing" in message and "offline-pump" in message


def test_dead_pump_may_be_set_offline(service: RegistryService, clock: Clock) -> None:
    registered = service.register(pump())
    service.set_state("pump-1", CLOSING)
    clock.now_ms += DEAD_AFTER_MS + 1
    reply = service.set_state("pump-1", OFFLINE)
    assert reply.state is OFFLINE
    assert reply.offline_ts > registered.online_ts
    assert reply.updated_at_ms == registered.updated_at_ms


def test_writer_may_be_set_offline(service: RegistryService) -> None:
    registered = service.register(writer())
    reply = service.set_state("writer-1", OFFLINE)
    assert reply.state is OFFLINE
    assert reply.offline_ts > registered.online_ts
    # Its heartbeats no longer bring it back; a registration does.
    assert service.heartbeat(writer()).state is OFFLINE
    assert service.register(writer()).state is ONLINE


# -- reads ------------------------------------------------------------------------------------------


def test_get_node(service: RegistryService) -> None:
    with pytest.raises(errors.NotFound, match="node ghost is not registered"):
        service.get_node("ghost")
    with pytest.raises(errors.InvalidArgument):
        service.get_node("")


def test_list_nodes(service: RegistryService) -> None:
    assert service.list_nodes() == ([], 0)
    for node_id in ("pump-c", "pump-a", "pump-b"):
        service.register(pump(node_id))
    service.register(writer("w-0"))
    nodes, revision = service.list_nodes()
    assert [n.node_id for n in nodes] == ["pump-a", "pump-b", "pump-c", "w-0"]
    assert revision == 4
    pumps, _ = service.list_nodes("pump")
    assert [n.node_id for n in pumps] == ["pump-a", "pump-b", "pump-c"]
    assert [n.node_id for n in service.list_nodes("writer")[0]] == ["w-0"]
    assert len(service.list_nodes("")[0]) == 4
    with pytest.raises(errors.InvalidArgument, match="kind must be one of pump, writer"):
        service.list_nodes("drainer")
    service.set_state("pump-a", PAUSING)
    assert service.list_nodes()[1] == 5


# -- consumers (hold Pump GC) -------------------------------------------------------------


def test_consumer_checkpoint_only_moves_forward_and_survives_a_restart(
    tmp_path: pathlib.Path, clock: Clock
) -> None:
    with open_store(tmp_path / "r") as store:
        svc = RegistryService(store, clock_ms=clock)
        first = svc.update_consumer("lake:/data/lake", 100, "the lake")
        assert (first.checkpoint_ts, first.description, first.registered_at_ms) == (100, "the lake", T0_MS)
        clock.now_ms += 5
        assert svc.update_consumer("lake:/data/lake", 50).checkpoint_ts == 100  # late report: ignored
        moved = svc.update_consumer("lake:/data/lake", 300)
        assert (moved.checkpoint_ts, moved.description, moved.updated_at_ms) == (300, "the lake", T0_MS + 5)
    with open_store(tmp_path / "r") as store:
        assert [c.checkpoint_ts for c in RegistryService(store).list_consumers()] == [300]


def test_consumer_removal_and_bad_input(service: RegistryService) -> None:
    service.update_consumer("b", 1)
    service.update_consumer("a", 2)
    assert [c.consumer_id for c in service.list_consumers()] == ["a", "b"]
    assert service.remove_consumer("a").checkpoint_ts == 2
    with pytest.raises(errors.NotFound, match=r"consumer a is not registered \(registered: b\)"):
        service.remove_consumer("a")
    for bad_id in ("", "has space", "x" * 200):
        with pytest.raises(errors.InvalidArgument, match="consumer id"):
            service.update_consumer(bad_id, 1)
    for bad_ts in (-1, True, 1.5, 1 << 63):
        with pytest.raises(errors.InvalidArgument, match="checkpoint_ts must be a TSO"):
            service.update_consumer("c", bad_ts)  # type: ignore[arg-type]


def test_registry_and_etcd_address_lists() -> None:
    from binlake.net import parse_addr_list
    from binlake.registry.etcd import parse_etcd_url, prefix_end

    assert parse_addr_list("a:8230") == ["a:8230"]
    assert parse_addr_list(" a:8230, b:8230 ,a:8230") == ["a:8230", "b:8230"]
    for bad, message in (("", "is empty"), ("a:8230,,b:8230", "entry 2 is empty"), ("a:8230,", "entry 2 is empty"),
                         ("a:8230;b:8230", "not one HOST:PORT"), ("a:82x0", "not a number"), ("a:0", "port > 0"),
                         ("a", "HOST:PORT")):
        with pytest.raises(errors.InvalidArgument, match=message):
            parse_addr_list(bad, "--registry")
    target = parse_etcd_url("etcd://h1:2379,h2:2379,h1:2379/apps/binlake/")
    assert target.endpoints == ("h1:2379", "h2:2379") and target.prefix == "/apps/binlake"
    assert parse_etcd_url("etcd+http://h1:2379").prefix == "/binlake"
    for bad in ("etcd+https://h1:2379", "etcd://h1", "etcd://h1:0", "etcd://"):
        with pytest.raises(errors.InvalidArgument):
            parse_etcd_url(bad)
    assert prefix_end(b"/binlake/nodes/") == b"/binlake/nodes0"


def test_replication_history_applies_from_a_tso_ahead_and_survives_restart(
        tmp_path: pathlib.Path, service: RegistryService) -> None:
    from binlake.registry import replicas

    assert service.get_replication() == []
    history = service.set_replication(2, 2, 30_000)
    now = service.get_ts()
    # It applies 30 s ahead of the TSO handed out when it was set: writers read it meanwhile.
    assert len(history) == 1 and 29_000 <= tso.physical_ms(history[0].from_ts) - tso.physical_ms(now) <= 30_000
    with pytest.raises(errors.FailedPrecondition, match="already applies from"):
        service.set_replication(3, 2, 0)  # would apply before the pending one
    later = service.set_replication(3, 2, 60_000)
    assert [(s.replicas, s.min_acks) for s in later] == [(2, 2), (3, 2)]
    for bad, match in (((2, 3, 0), "above replicas"), ((0, 0, 0), "replicas must be"),
                       ((2, 1, -1), "grace_ms must be"), ((17, 1, 0), "replicas must be")):
        with pytest.raises(errors.InvalidArgument, match=match):
            service.set_replication(*bad)
    assert service.get_replication() == later
    # Prewrites pick the setting in force at their start_ts; before the first, R = W = 1.
    one = ReplicationSetting(0, 1, 1)
    assert replicas.setting_at(later, later[0].from_ts - 1) == one
    assert replicas.setting_at(later, later[0].from_ts) == later[0]
    assert replicas.setting_at(later, later[1].from_ts + 5) == later[1]
    # A window is read with the lowest W in force from a transaction's lifetime before it to its end.
    lookback = tso.compose(replicas.TXN_LOOKBACK_MS)
    start = later[0].from_ts + lookback
    assert replicas.min_acks_for_window(later, start, start + 10) == 2
    assert replicas.min_acks_for_window(later, start - 2, start + 10) == 1
    assert replicas.min_acks_for_window([], start, start + 10) == 1
    # A shorter promised lifetime (txn_lookback_s) brings the new W to windows sooner; the
    # windows before the change keep the old one whatever it is.
    short = tso.compose(2_000)
    assert replicas.min_acks_for_window(later, later[0].from_ts + short, later[0].from_ts + short + 10,
                                           lookback_ms=2_000) == 2
    assert replicas.min_acks_for_window(later, later[0].from_ts + short - 2, later[0].from_ts + short,
                                           lookback_ms=2_000) == 1
    assert replicas.min_acks_for_window(later, later[0].from_ts - 10, later[0].from_ts, lookback_ms=0) == 1
    with pytest.raises(ValueError, match="lookback_ms"):
        replicas.min_acks_for_window(later, start, start + 10, lookback_ms=-1)


def test_replication_history_is_kept_by_the_sqlite_store(tmp_path: pathlib.Path) -> None:
    with open_store(tmp_path / "r") as store:
        store.add_replication(ReplicationSetting(100, 2, 1))
    with open_store(tmp_path / "r") as store:
        assert store.list_replication() == [ReplicationSetting(100, 2, 1)]


# -- replication from a cluster's start, and what each Pump held nothing below --------------


def test_a_new_clusters_replication_applies_from_ts_0_and_a_served_store_keeps_its_own(
        tmp_path: pathlib.Path) -> None:
    from binlake.registry.replicas import min_acks_for_window
    from binlake.registry.service import create_replication

    with open_store(tmp_path / "new") as store:
        assert create_replication(store, 2, 2) == [ReplicationSetting(0, 2, 2)]
        # A restart with the same flags changes nothing; another value is refused.
        assert create_replication(store, 2, 2) == [ReplicationSetting(0, 2, 2)]
        with pytest.raises(errors.FailedPrecondition, match="replicas=2 min_acks=2.*binlake ctl replication"):
            create_replication(store, 3, 2)
        history = store.list_replication()
        # The first ingest reads the DDL history from ts 0 with W = 2.
        assert min_acks_for_window(history, 0, tso.compose(T0_MS)) == 2
    with open_store(tmp_path / "served") as store:
        RegistryService(store, clock_ms=Clock()).get_ts()  # it has handed out TSOs: writes may exist under R = 1
        with pytest.raises(errors.FailedPrecondition, match="already serves a cluster with replicas=1 min_acks=1"):
            create_replication(store, 2, 2)
        assert create_replication(store, 1, 1) == [] and store.list_replication() == []
        for bad in ((0, 1), (17, 1), (2, 3)):
            with pytest.raises(errors.InvalidArgument):
                create_replication(store, *bad)


def test_the_registry_keeps_what_a_pump_held_nothing_below(service: RegistryService) -> None:
    rec = service.register(pump(safe_ts=100))
    assert rec.empty_below_ts == 100
    # A Pump's own value is ignored; an empty Pump's safe ts raises it.
    assert service.heartbeat(pump(safe_ts=200, empty_below_ts=10**12)).empty_below_ts == 200
    # Once it stored a transaction the value stays, across a restart too.
    assert service.heartbeat(pump(safe_ts=300, max_commit_ts=250)).empty_below_ts == 200
    assert service.register(pump(safe_ts=400, max_commit_ts=250)).empty_below_ts == 200
    assert service.register(writer()).empty_below_ts == 0
    # A Pump whose GC removed binlogs had stored them, even when it reports no max commit ts.
    collected = service.register(pump(node_id="p-gc", safe_ts=500, gc_ts=450))
    assert collected.empty_below_ts == 0
    assert service.heartbeat(pump(node_id="p-gc", safe_ts=600, gc_ts=450)).empty_below_ts == 0


def test_a_store_from_before_empty_below_ts_opens_with_it_unknown(tmp_path: pathlib.Path) -> None:
    import sqlite3

    with open_store(tmp_path / "reg") as store:
        store.put_node(pump(online_ts=5, safe_ts=9))
    conn = sqlite3.connect(tmp_path / "reg" / DB_FILE_NAME)
    conn.execute("ALTER TABLE nodes DROP COLUMN empty_below_ts")  # the layout before the column
    conn.commit()
    conn.close()
    with open_store(tmp_path / "reg") as store:
        got = store.get_node("pump-1")
        assert got is not None and got.empty_below_ts == 0 and got.safe_ts == 9
        service = RegistryService(store, clock_ms=Clock())
        assert service.heartbeat(pump(safe_ts=20)).empty_below_ts == 20


def test_the_planner_leaves_out_a_pump_that_held_nothing_of_the_window() -> None:
    from binlake.lake.pumps.planner import pumps_for_window

    nodes = [NodeRecord("p1", "pump", "127.0.0.1:1", safe_ts=900),
             NodeRecord("p2", "pump", "127.0.0.1:2", safe_ts=900, empty_below_ts=500)]
    assert [n.node_id for n in pumps_for_window(nodes, 100, 500)] == ["p1"]
    assert [n.node_id for n in pumps_for_window(nodes, 100, 501)] == ["p1", "p2"]
    # A cluster nothing was written to: every Pump is asked, and the window is read empty.
    empty = [NodeRecord("p1", "pump", "127.0.0.1:1", safe_ts=900, empty_below_ts=900),
             NodeRecord("p2", "pump", "127.0.0.1:2", safe_ts=900, empty_below_ts=500)]
    assert [n.node_id for n in pumps_for_window(empty, 100, 400)] == ["p1", "p2"]
    assert [n.node_id for n in pumps_for_window(empty, 100, 700)] == ["p2"]


def test_registry_replication_flags_are_checked_in_one_line(tmp_path: pathlib.Path) -> None:
    import subprocess
    import sys

    from binlake.registry.service import create_replication

    with open_store(tmp_path / "reg") as store:
        create_replication(store, 2, 2)
    binlake = pathlib.Path(sys.executable).parent / "binlake"
    for flags, words in ((["--replicas", "3"], "already serves a cluster with replicas=2"),
                         (["--replicas", "2", "--min-acks", "3"], "min_acks=3 is above replicas=2")):
        res = subprocess.run([str(binlake), "registry", "--data-dir", str(tmp_path / "reg"), "--addr", "127.0.0.1:0",
                              *flags], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert res.returncode == 2 and words in res.stderr, (flags, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_up_checks_its_replication_flags_against_the_pumps_and_the_store_before_starting(
        tmp_path: pathlib.Path) -> None:
    import argparse

    from binlake.registry.service import create_replication
    from binlake.stack.commands import _replication

    def flags(**kw: object) -> argparse.Namespace:
        return argparse.Namespace(**{"data_dir": str(tmp_path), "pumps": 3, "replicas": None, "min_acks": None, **kw})

    assert _replication(flags()) is None
    assert _replication(flags(replicas=2)) == (2, 2)  # no store yet: the registry creates it with this
    for bad, words in (({"replicas": 4}, r"between 1 and --pumps \(3\)"), ({"replicas": 2, "min_acks": 3}, "--min-acks 3"),
                       ({"min_acks": 1}, "--min-acks needs --replicas")):
        with pytest.raises(errors.InvalidArgument, match=words):
            _replication(flags(**bad))
    with open_store(tmp_path / "registry") as store:
        create_replication(store, 2, 2)
    assert _replication(flags(replicas=2)) == (2, 2)
    with pytest.raises(errors.FailedPrecondition, match="already serves a cluster with replicas=2"):
        _replication(flags(replicas=3))
    with open_store(tmp_path / "registry") as store:
        assert store.list_replication() == [ReplicationSetting(0, 2, 2)]  # the check wrote nothing
