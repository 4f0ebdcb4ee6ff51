"""A registry group on a real etcd (Debian's etcd-server) over loopback: the etcd
store, the election, followers that name the leader, clients that follow it,
the fence that stops a leader cut off from etcd, etcd member and quorum loss,
and the one-line refusals of bad input. The multi-host runs with kill -9 and
partitions are in tests/e2e/test_registry_cluster.py."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from binlake import errors
from binlake.config import RegistrySettings
from binlake.net import free_port
from binlake.registry.client import RegistryClient
from binlake.registry.etcd import parse_etcd_url
from binlake.registry.etcd_store import EtcdStore
from binlake.registry.model import ConsumerRecord, NodeRecord, NodeState, ReplicationSetting
from binlake.registry.server import RegistryServer
from binlake.registry.stores import open_store
from binlake.testing.etcdcluster import EtcdCluster

pytestmark = pytest.mark.skipif(not EtcdCluster.available(), reason="etcd is not installed (apt-get install etcd-server)")


@pytest.fixture(scope="module")
def etcd3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd3"), 3).start()
    yield cluster
    cluster.stop()


def _group(store: str, n: int = 3) -> list[RegistryServer]:
    return [RegistryServer(RegistrySettings(addr=f"127.0.0.1:{free_port()}", store=store)).start() for _ in range(n)]


def _leader(servers: list[RegistryServer], timeout: float = 10.0) -> RegistryServer:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leaders = [s for s in servers if s.election is not None and s.election.is_leader()]
        assert len(leaders) <= 1, "two members lead at once"
        if leaders:
            return leaders[0]
        time.sleep(0.05)
    raise AssertionError("no leader elected")


def test_etcd_store_keeps_state_in_transactions(etcd3: EtcdCluster) -> None:
    url = etcd3.url("/store-test")
    with open_store(url) as a, open_store(url) as b:
        assert isinstance(a, EtcdStore)
        # One cluster id, chosen once by whichever opened first.
        assert a.cluster_id() == b.cluster_id() > 0
        assert a.load_tso_limit() == 0 and a.revision() == 0
        a.save_tso_limit(1000)
        b.save_tso_limit(500)  # never decreases
        assert a.load_tso_limit() == 1000
        rec = NodeRecord("p1", "pump", "127.0.0.1:1", NodeState.ONLINE, online_ts=7, updated_at_ms=1)
        a.put_node(rec)
        b.put_node(rec)
        assert a.revision() == 2 and b.get_node("p1") == rec and a.list_nodes("writer") == []
        a.put_consumer(ConsumerRecord("c1", 5, "lake", 1, 2))
        assert [c.consumer_id for c in b.list_consumers()] == ["c1"]
        assert b.delete_consumer("c1") and not a.delete_consumer("c1")
        # The replication history: appended, listed in from_ts order, never overwritten.
        a.add_replication(ReplicationSetting(200, 2, 2))
        b.add_replication(ReplicationSetting(30, 1, 1))
        assert [r.from_ts for r in a.list_replication()] == [30, 200]
        with pytest.raises(errors.Unavailable, match="already exists"):
            b.add_replication(ReplicationSetting(200, 3, 2))
        # A fenced writer whose leader key is not there any more writes nothing.
        a.fence(12345)
        with pytest.raises(errors.NotLeader):
            a.save_tso_limit(5000)
        assert b.load_tso_limit() == 1000
    with pytest.raises(errors.FailedPrecondition, match="holds cluster"):
        EtcdStore(parse_etcd_url(url), expect_cluster_id=1)


def test_a_group_created_with_replicas_records_it_once_from_ts_0(etcd3: EtcdCluster) -> None:
    """The compose file's members, all given ``--replicas 2`` on a new store and
    started at once: the setting is recorded once, from ts 0; a member given
    another value is refused in one line."""
    import concurrent.futures

    url = etcd3.url("/replicas-test")

    def start() -> RegistryServer:
        return RegistryServer(RegistrySettings(addr=f"127.0.0.1:{free_port()}", store=url, replicas=2)).start()

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        servers = list(pool.map(lambda _i: start(), range(2)))
    try:
        with RegistryClient(",".join(s.addr for s in servers)) as reg:
            assert reg.get_replication() == [ReplicationSetting(0, 2, 2)]
        with pytest.raises(errors.FailedPrecondition, match="already serves a cluster with replicas=2 min_acks=2"):
            RegistryServer(RegistrySettings(addr=f"127.0.0.1:{free_port()}", store=url, replicas=3,
                                            min_acks=2)).start()
    finally:
        for s in servers:
            s.stop(grace=0.2)


def test_group_elects_one_leader_and_clients_follow_it(etcd3: EtcdCluster) -> None:
    servers = _group(etcd3.url("/group-test"))
    addrs = [s.addr for s in servers]
    try:
        leader = _leader(servers)
        followers = [s for s in servers if s is not leader]
        # A follower refuses with the leader's address; a client given only the
        # follower is sent on to the leader.
        with RegistryClient(followers[0].addr, timeout_s=2.0) as one:
            assert one.get_ts() > 0
            assert one.leader == leader.addr
        with RegistryClient(",".join(reversed(addrs))) as reg:
            # A follower learns the leader on its next look at the key (every 0.1 s).
            deadline = time.monotonic() + 5
            while True:
                info = {a: reg.member(a) for a in addrs}
                if all(m.leader_addr for m in info.values()) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert [a for a, m in info.items() if m.leader] == [leader.addr]
            assert all(m.leader_addr == leader.addr for m in info.values())
            assert info[leader.addr].tso_limit > 0 and info[leader.addr].lease_left_ms > 0
            assert info[leader.addr].etcd_endpoint in etcd3.endpoints

            before = [reg.get_ts() for _ in range(50)]
            reg.update_consumer("lake", 42, "d")
            # A graceful stop resigns: the next leader takes over well within a lease.
            stopped_at = time.monotonic()
            leader.stop(grace=0.5)
            after = reg.get_ts()
            assert time.monotonic() - stopped_at < 3.0
            assert after > max(before) and before == sorted(before) and len(set(before)) == 50
            new_leader = _leader([s for s in servers if s is not leader])
            assert reg.leader == new_leader.addr
            # State written through the old leader is there through the new one.
            assert [c.checkpoint_ts for c in reg.list_consumers()] == [42]
            # The new leader started above the mark the old one saved.
            assert after >> 18 > info[leader.addr].tso_limit
    finally:
        for s in servers:
            s.stop(grace=0.2)


def test_leader_cut_off_from_etcd_stops_within_lease_and_quorum_loss_is_clear(tmp_path: pathlib.Path) -> None:
    with EtcdCluster(tmp_path / "etcd", 3) as etcd:
        servers = _group(etcd.url(), 2)
        try:
            leader = _leader(servers)
            with RegistryClient(",".join(s.addr for s in servers), failover_s=6.0) as reg:
                first = reg.get_ts()
                # One etcd member lost: the group goes on.
                etcd.members[0].kill9()
                assert reg.get_ts() > first
                # The quorum lost: the leader serves from memory until its lease
                # (counted from its last keepalive's start) runs out, then nothing.
                etcd.members[1].kill9()
                cut = time.monotonic()
                served_until = cut
                with RegistryClient(leader.addr, timeout_s=0.5) as direct:
                    while time.monotonic() - cut < 6.0:
                        asked = time.monotonic()
                        try:
                            direct.get_ts_batch(1)
                            served_until = asked
                        except errors.BinlakeError:
                            pass
                # Its lease began before the cut: nothing asked after cut + lease is served.
                assert served_until - cut < 3.0 + 0.05, "a leader without etcd served past its lease"
                assert not any(s.election is not None and s.election.is_leader() for s in servers)
                # Writers fail with one clear line, not a hang.
                t0 = time.monotonic()
                with pytest.raises(errors.Unavailable, match="no registry leader answered GetTS within 6s") as exc:
                    reg.get_ts()
                assert time.monotonic() - t0 < 8.0 and "\n" not in str(exc.value)
                # The quorum back: a leader again, above every TSO handed out before.
                etcd.start_member(etcd.members[0])
                etcd.start_member(etcd.members[1])
                etcd.wait_ready()
                deadline = time.monotonic() + 20
                while True:
                    try:
                        back = reg.get_ts()
                        break
                    except errors.Unavailable:
                        assert time.monotonic() < deadline
                assert back > first
        finally:
            for s in servers:
                s.stop(grace=0.2)


def _cli(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "binlake.cli", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_bad_input_is_one_line_and_exit_2(etcd3: EtcdCluster) -> None:
    addr = f"127.0.0.1:{free_port()}"
    # Nothing listens on this port: etcd is unreachable.
    res = _cli("registry", "--store", f"etcd://127.0.0.1:{free_port()}", "--addr", addr)
    assert res.returncode == 2 and "etcd is unreachable" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    for store, message in ((f"etcd://{etcd3.endpoints[0]},,x:1", "empty endpoint"),
                           ("etcd://127.0.0.1", "HOST:PORT")):
        res = _cli("registry", "--store", store, "--addr", addr)
        assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    with open_store(etcd3.url("/bad-input")) as s:
        other = s.cluster_id() + 1
    res = _cli("registry", "--store", etcd3.url("/bad-input"), "--cluster-id", str(other), "--addr", addr)
    assert res.returncode == 2 and "holds cluster" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    for bad in ("127.0.0.1:8230,,127.0.0.1:8231", "127.0.0.1:82x0", "127.0.0.1:8230;127.0.0.1:8231"):
        res = _cli("ctl", "registry", "--registry", bad)
        assert res.returncode == 2 and "--registry" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_ctl_registry_lists_members(etcd3: EtcdCluster) -> None:
    servers = _group(etcd3.url("/ctl-test"), 2)
    try:
        leader = _leader(servers)
        dead = f"127.0.0.1:{free_port()}"
        res = _cli("ctl", "registry", "--json", "--registry", ",".join([*(s.addr for s in servers), dead]))
        assert res.returncode == 0, res.stderr
        import json

        rows = {r["addr"]: r for r in map(json.loads, res.stdout.splitlines())}
        assert rows[leader.addr]["role"] == "leader" and rows[leader.addr]["lease_left_s"] > 0
        assert rows[leader.addr]["tso_limit_ms"] > 0 and rows[leader.addr]["etcd_endpoint"] in etcd3.endpoints
        assert [r["role"] for a, r in rows.items() if a not in (leader.addr, dead)] == ["follower"]
        assert rows[dead]["role"] == "unreachable"
    finally:
        for s in servers:
            s.stop(grace=0.2)
