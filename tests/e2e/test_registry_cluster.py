"""A registry group across hosts, with a nemesis: three etcd members and three
registries on three hosts (network namespaces on a bridge), two Pumps on two
more, and writers on the test's own host committing through them. The nemesis
kills -9 the leader registry, then partitions the new leader's host for longer
than the lease, then heals, for two rounds; then freezes the leader's host
(SIGSTOP) beyond the lease and resumes it. Afterwards: no writer failed a
transaction; every TSO any client got is unique, and one requested after
another was returned is larger (real time, across clients and failovers,
including what the partitioned leader handed out); the Pumps serve every
acknowledged transaction once, in commit_ts order, and a real TxnWriter's
workload through it all (stopped once the nemesis is over, so it spans every round)
is rebuilt from them equal to its upstream; the partitioned leader
handed out nothing once its lease ran out, nor the frozen one once resumed.
Last, the whole chain a user runs: the Pumps' binlogs ingested into a Delta lake
(the leader registry killed just before: the ingest is given the registry list
and follows the leader), applied to a fresh SQLite target,
and ``binlake diff`` finds it equal to the upstream; the writers' rows in the
target are exactly the acknowledged transactions.

Skips (saying why) where network namespaces cannot be created."""

from __future__ import annotations

import bisect
import collections
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest
import sqlalchemy as sa
from pumpkit import commit, mutation_value, prewrite, row_start_ts, try_status, wait_safe, wait_until
from pyspark.sql import SparkSession

from binlake import errors
from binlake.client.pump_client import PumpClient
from binlake.client.reader import pull_pump, pull_window
from binlake.config import ClientSettings
from binlake.lake import ingest
from binlake.proto import binlog_pb2
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeRecord
from binlake.replicate import runner, task
from binlake.source.replay import Replay
from binlake.sql import checksum, diff
from binlake.sql.schema import ColumnDef
from binlake.testing.etcdcluster import EtcdCluster
from binlake.testing.netbed import Host, NetBed
from binlake.workload import ops as wops
from binlake.workload import plan as wplan
from binlake.workload import run as wrun
from binlake.writer.txn_status import MemoryStatusProvider, TxnStatusServer
from binlake.writer.txn_writer import TxnWriter

# The nemesis rounds take ~70 s, the ingest, apply and diff at the end ~40-60 s
# with the shared Spark session (minutes on a loaded machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.hosts(5)]

LEASE_S = 3.0
REG_PORT = 8230
PUMP_PORT = 8250
WRITERS = 4
# The writers' rows: pumpkit's mutation (column 1 the start_ts, column 2 bytes).
WRITER_TABLE = "writer_rows"

# Run inside the leader's host during its partition: asks the local registry
# for a TSO in a loop (a raw stub: no leader following) and logs
# "t_request t_return ts" (CLOCK_MONOTONIC ns, shared by every process) per grant.
PROBE = """
import sys, time, grpc
from binlake.proto import registry_pb2, registry_pb2_grpc
stub = registry_pb2_grpc.RegistryStub(grpc.insecure_channel(sys.argv[1]))
out = open(sys.argv[2], "a", buffering=1)
while True:
    t0 = time.monotonic_ns()
    try:
        ts = stub.GetTS(registry_pb2.GetTSReq(count=1), timeout=0.5).first
    except grpc.RpcError:
        time.sleep(0.01)
        continue
    out.write(f"{t0} {time.monotonic_ns()} {ts}\\n")
    time.sleep(0.002)
"""


class Writers:
    """Writer threads doing what TxnWriter does, recording every TSO with the
    monotonic time it was requested and returned."""

    def __init__(self, client: PumpClient, reg: RegistryClient, provider: MemoryStatusProvider,
                 table_id: int) -> None:
        self.client, self.reg, self.provider, self.table_id = client, reg, provider, table_id
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.tsos: list[tuple[int, int, int]] = []
        self.acked: list[tuple[int, int]] = []
        self.committed: dict[int, int] = {}
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._run, name=f"writer-{i}") for i in range(WRITERS)]

    def _ts(self) -> int:
        t0 = time.monotonic_ns()
        ts = self.reg.get_ts()
        with self.lock:
            self.tsos.append((t0, time.monotonic_ns(), ts))
        return ts

    def _prewrite(self, start: int) -> binlog_pb2.Binlog:
        # pumpkit's one-row insert, into the upstream's table WRITER_TABLE (whose
        # DDL is in the Pumps), so the lake can decode it.
        binlog = prewrite(start)
        value = mutation_value(start)
        value.mutations[0].table_id = self.table_id
        binlog.prewrite_value = value.SerializeToString()
        return binlog

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self._txn()
            except BaseException as exc:  # a failed transaction, whatever failed
                with self.lock:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                return

    def _txn(self) -> None:
        while True:
            start = self._ts()
            try:
                node_id = self.client.write_prewrite(self._prewrite(start))
                break
            except errors.BinlakeError:
                # No Pump took it: the upstream rolls back and retries the transaction.
                self.provider.set_rolled_back(start)
        commit_ts = self._ts()
        self.provider.set_committed(start, commit_ts)
        with self.lock:
            self.committed[start] = commit_ts
        self.client.write_commit(commit(start, commit_ts), node_id)
        with self.lock:
            self.acked.append((start, commit_ts))


def _spawn_registry(h: Host, store: str, logs: pathlib.Path) -> subprocess.Popen[bytes]:
    return h.spawn([sys.executable, "-m", "binlake.cli", "registry", "--store", store,
                    "--addr", f"{h.addr}:{REG_PORT}"], logs / f"registry-{h.name}.log")


def _leader(addrs: list[str], timeout: float = 20.0) -> str:
    def find() -> str:
        with RegistryClient(",".join(addrs), timeout_s=0.5) as reg:
            for a in addrs:
                try:
                    if reg.member(a, timeout_s=0.5).leader:
                        return a
                except errors.BinlakeError:
                    continue
        return ""

    return wait_until(find, timeout, interval=0.1, what="a registry leader")


def _check_real_time_order(tsos: list[tuple[int, int, int]]) -> None:
    values = [ts for _, _, ts in tsos]
    assert len(set(values)) == len(values), "a TSO was handed out twice"
    by_return = sorted(tsos, key=lambda r: r[1])
    returns = [r[1] for r in by_return]
    prefix_max: list[int] = []
    for _, _, ts in by_return:
        prefix_max.append(max(ts, prefix_max[-1]) if prefix_max else ts)
    for t_req, _, ts in tsos:
        # Every TSO returned before this one was requested is smaller.
        i = bisect.bisect_left(returns, t_req)
        if i:
            assert prefix_max[i - 1] < ts, "a TSO is below one returned before it was requested"


def test_registry_group_survives_kill_and_partition(bed: NetBed, tmp_path: pathlib.Path,
                                                    spark: SparkSession) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    reg_hosts, pump_hosts = bed.hosts[:3], bed.hosts[3:]
    etcd = EtcdCluster(tmp_path / "etcd", 3, hosts=[h.addr for h in reg_hosts],
                       wraps=[h.wrap for h in reg_hosts]).start()
    regs = {h.name: _spawn_registry(h, etcd.url(), logs) for h in reg_hosts}
    addrs = [f"{h.addr}:{REG_PORT}" for h in reg_hosts]
    reg_list = ",".join(addrs)
    host_of = {f"{h.addr}:{REG_PORT}": h for h in reg_hosts}
    _leader(addrs, timeout=30)
    pump_addrs = {f"p{i}": f"{h.addr}:{PUMP_PORT}" for i, h in enumerate(pump_hosts, 1)}
    for (node_id, addr), h in zip(pump_addrs.items(), pump_hosts, strict=True):
        h.spawn([sys.executable, "-m", "binlake.cli", "pump", "--registry", reg_list, "--data-dir",
                 str(tmp_path / node_id), "--addr", addr, "--node-id", node_id, "--stop-write-at-free-bytes", "0",
                 "--txn-timeout-s", "2", "--fake-binlog-interval-s", "0.5"], logs / f"{node_id}.log",
                env={**os.environ, "BINLAKE_PUMP_HEARTBEAT_INTERVAL_S": "0.3"})
    for addr in pump_addrs.values():
        wait_until(lambda a=addr: (st := try_status(a)) is not None and st.accepting_writes, 40,
                   what=f"pump at {addr}")

    provider = MemoryStatusProvider()
    status_server = TxnStatusServer(provider, f"{bed.gateway}:0").start()
    reg = RegistryClient(reg_list)
    reg.register(NodeRecord(node_id="w1", kind="writer", addr=status_server.addr))
    settings = ClientSettings(registry=reg_list, strategy="range", max_failures=1, probe_interval_s=0.2,
                              refresh_interval_s=0.3, write_timeout_s=3.0, commit_retry_s=30.0)
    client = PumpClient(reg_list, settings=settings)
    # And a real TxnWriter on a SQLite upstream (binlake workload's bank + OLTP +
    # DDL mix), throttled, planned longer than any nemesis takes, and stopped when
    # the nemesis is over: it runs through every round, and not a minute past them.
    # The writers' table is created there first: its DDL goes through the Pumps.
    upstream = f"sqlite:///{tmp_path / 'upstream.db'}"
    lake_start = reg.get_ts()
    with TxnWriter(upstream, registry=reg_list, status_addr=f"{bed.gateway}:0") as tw:
        writer_table = tw.create_table(WRITER_TABLE, [ColumnDef("id", "int", nullable=False),
                                                      ColumnDef("pad", "bytes")], ["id"])
    writers = Writers(client, reg, provider, writer_table.table_id)
    workload: dict[str, object] = {}
    workload_stop = threading.Event()

    def run_workload() -> None:
        try:
            with TxnWriter(upstream, registry=reg_list, status_addr=f"{bed.gateway}:0") as tw:
                plan = wplan.plan("mixed", 2, 2000, 11, large_txn_rows=50, large_txn_every=200, table_rows=50,
                                  accounts=20)
                workload["summary"] = wrun.run(tw, plan, clients=2, rate=14, progress=False, stop=workload_stop)
        except BaseException as exc:  # reported by the assertions below
            workload["error"] = exc

    workload_thread = threading.Thread(target=run_workload, name="workload")
    # Per round: (partitioned at, healed at, the probe's log).
    partitions: list[tuple[float, float, pathlib.Path]] = []
    try:
        for t in writers.threads:
            t.start()
        workload_thread.start()
        time.sleep(1.5)
        for round_no in range(2):
            # 1. kill -9 the leader registry; the writers go on through the failover.
            leader = _leader(addrs)
            victim = host_of[leader]
            os.killpg(regs[victim.name].pid, signal.SIGKILL)
            regs[victim.name].wait()
            acked_at_kill = len(writers.acked)
            new_leader = _leader([a for a in addrs if a != leader])
            wait_until(lambda n=acked_at_kill: len(writers.acked) > n + 20, 20, what="writes after the failover")
            regs[victim.name] = _spawn_registry(victim, etcd.url(), logs)
            # 2. partition the new leader's host for longer than the lease, with a
            #    probe inside it asking its registry for TSOs all along.
            cut = host_of[new_leader]
            probe_log = tmp_path / f"probe{round_no}.log"
            probe = cut.spawn([sys.executable, "-c", PROBE, new_leader, str(probe_log)], logs / "probe.out")
            wait_until(lambda p=probe_log: p.exists() and p.stat().st_size > 0, 20, what="the probe's first TSO")
            bed.partition(cut.name)
            cut_at = time.monotonic()
            time.sleep(LEASE_S + 2.5)
            acked_in_partition = len(writers.acked)
            partitions.append((cut_at, time.monotonic(), probe_log))
            bed.heal(cut.name)
            probe.kill()
            probe.wait()
            wait_until(lambda n=acked_in_partition: len(writers.acked) > n + 20, 20, what="writes after healing")
        # 3. SIGSTOP the leader's host (a frozen VM) until another member leads
        #    (its lease ran out in etcd: at least the lease, more when etcd's own
        #    leader was frozen too, as etcd renews leases when its leader changes),
        #    with a probe started after the stop; resumed, the old leader must
        #    hand out nothing.
        leader = _leader(addrs)
        frozen = host_of[leader]
        bed.pause(frozen.name)
        frozen_log = tmp_path / "probe-frozen.log"
        frozen_log.touch()
        probe = frozen.spawn([sys.executable, "-c", PROBE, leader, str(frozen_log)], logs / "probe.out")
        _leader([a for a in addrs if a != leader], timeout=30)
        elected_acked = len(writers.acked)
        wait_until(lambda n=elected_acked: len(writers.acked) > n + 20, 20, what="writes while the leader is frozen")
        acked_while_frozen = len(writers.acked) - elected_acked
        bed.resume(frozen.name)
        time.sleep(2.0)
        probe.kill()
        probe.wait()
        time.sleep(1.0)
    finally:
        writers.stop.set()
        workload_stop.set()
        for t in writers.threads:
            t.join(timeout=60)
        client.close()
        workload_thread.join(timeout=120)

    try:
        assert writers.failures == [], writers.failures[:3]
        assert not any(t.is_alive() for t in writers.threads), "a writer is stuck"
        assert len(writers.acked) > 100, "the writers made too little progress"

        # The partitioned leader served from memory at most until its lease ran out.
        probe_tsos: list[tuple[int, int, int]] = []
        for cut_at, healed_at, log in partitions:
            got = [(int(a), int(b), int(c)) for a, b, c in (line.split() for line in log.read_text().splitlines())]
            assert any(t_ret / 1e9 < cut_at for _, t_ret, _ in got), "the probe got no TSO before the partition"
            # Its lease began before the cut; after it ran out, nothing until the heal.
            late = [r for r in got if cut_at + LEASE_S + 0.25 < r[0] / 1e9 < healed_at]
            assert late == [], f"the partitioned leader handed out {len(late)} TSOs after its lease"
            probe_tsos += got
        assert acked_while_frozen > 0, "no writes while the leader was frozen"
        frozen_tsos = frozen_log.read_text().splitlines()
        assert frozen_tsos == [], "the resumed ex-leader handed out TSOs after its lease"
        _check_real_time_order(writers.tsos + probe_tsos)

        # Every acknowledged transaction, once, in commit_ts order, from the Pumps.
        last = max(writers.committed.values())
        first = min(writers.committed)
        for addr in pump_addrs.values():
            wait_safe(addr, last + 1, timeout=40)
        served = []
        for node_id, addr in pump_addrs.items():
            got = [b for b in pull_pump(addr, first, last + 1, node_id=node_id) if b.start_ts in writers.committed]
            keys = [(b.commit_ts, b.start_ts) for b in got]
            assert keys == sorted(keys), f"pump {node_id} served out of commit_ts order"
            served += got
        counts = collections.Counter(b.start_ts for b in served)
        assert [s for s, n in counts.items() if n > 1] == [], "a transaction was served twice"
        got_map = {b.start_ts: b.commit_ts for b in served}
        missing = [(s, c) for s, c in writers.acked if got_map.get(s) != c]
        assert missing == [], f"{len(missing)} acknowledged transactions lost or wrong"
        assert all(row_start_ts(b) == b.start_ts for b in served)

        # The TxnWriter's workload went through every failover without an error,
        # and every transaction it committed is in the Pumps, in order.
        assert "error" not in workload, workload.get("error")
        summary = workload["summary"]
        assert isinstance(summary, wrun.Summary)
        assert summary.errors == 0 and not summary.gave_up, summary.error_messages[:3]
        # Still running when the nemesis was over (stopped then, after the transactions in flight).
        assert summary.interrupted and 0 < summary.done < summary.planned, summary
        assert summary.done == summary.committed + summary.empty + summary.ddls
        assert wrun.bank_total(upstream) == 20 * wops.BANK_INITIAL_BALANCE
        binlogs = [b for b in pull_window(pump_addrs, summary.start_ts, summary.end_ts, wait=True)
                   if b.start_ts not in writers.committed]
        assert len(binlogs) == summary.committed + summary.ddls
        assert [b.commit_ts for b in binlogs] == sorted(b.commit_ts for b in binlogs)
        # Rows rebuilt from the Pumps' binlogs alone equal the upstream's (the
        # replay raises on a transaction served twice or out of order).
        replay = Replay().apply(binlogs)
        upstream_sums = dict(checksum.checksum(upstream, schema=replay.schema()))
        # The writers' table is empty upstream (they write binlogs only) and
        # created before this window.
        assert upstream_sums.pop(WRITER_TABLE)[0] == 0
        assert replay.checksums() == upstream_sums

        _ingest_apply_diff(spark, tmp_path, reg_list, addrs, regs, host_of, logs, etcd,
                           upstream, (lake_start, max(last + 1, summary.end_ts)), pump_addrs,
                           {s for s, _ in writers.acked})
    finally:
        status_server.stop(0.2)
        reg.close()
        etcd.stop()


def _ingest_apply_diff(spark: SparkSession, tmp_path: pathlib.Path, reg_list: str, addrs: list[str],
                       regs: dict[str, subprocess.Popen[bytes]], host_of: dict[str, Host], logs: pathlib.Path,
                       etcd: EtcdCluster, upstream: str, span: tuple[int, int], pump_addrs: dict[str, str],
                       acked: set[int]) -> None:
    """The Pumps' binlogs ingested (the leader killed just before), applied to
    a fresh SQLite target, diffed against the upstream."""
    start, end = span
    for addr in pump_addrs.values():
        wait_safe(addr, end, timeout=40)
    # kill -9 the leader just before the ingest: it plans through the registry
    # and moves the lake's consumer checkpoint there, so it must ride the
    # failover given only the list.
    victim = host_of[_leader(addrs)]
    os.killpg(regs[victim.name].pid, signal.SIGKILL)
    regs[victim.name].wait()
    lake = str(tmp_path / "lake")
    result = ingest.ingest_window(spark, lake, reg_list, start, end)
    assert result.rows > len(acked) and result.ddls > 0
    regs[victim.name] = _spawn_registry(victim, etcd.url(), logs)
    with RegistryClient(reg_list) as reg:
        assert any(c.checkpoint_ts == end for c in reg.list_consumers()), "the lake's checkpoint was not moved"

    target = f"sqlite:///{tmp_path / 'target.db'}"
    summary = runner.Applier(spark, task.Task(name="cluster", lake=lake, target=target, mode="consistent")).run()
    assert summary.windows == 1
    engine = sa.create_engine(upstream)
    try:
        tables = [t for t in sa.inspect(engine).get_table_names()
                  if t != WRITER_TABLE and not t.startswith("_binlake")]
    finally:
        engine.dispose()
    assert len(tables) >= 3
    report = diff.diff_databases(upstream, target, tables=tables)
    assert report.ok, report.summary()
    # The writers wrote no upstream rows, only binlogs: the target holds one row
    # per acknowledged transaction, none more.
    engine = sa.create_engine(target)
    try:
        with engine.connect() as conn:
            ids = [r[0] for r in conn.execute(sa.text(f"SELECT id FROM {WRITER_TABLE}"))]
    finally:
        engine.dispose()
    assert sorted(ids) == sorted(acked)


def test_registry_group_under_latency_and_loss(bed: NetBed, tmp_path: pathlib.Path) -> None:
    """tc netem on the leader's host (100 ms each way out, 5 % loss): the group
    keeps one leader and clients keep getting increasing TSOs."""
    why = NetBed.netem_available()
    if why:
        pytest.skip(why)
    hosts = bed.hosts[:3]
    etcd = EtcdCluster(tmp_path / "etcd", 3, hosts=[h.addr for h in hosts], wraps=[h.wrap for h in hosts]).start()
    try:
        for h in hosts:
            _spawn_registry(h, etcd.url(), tmp_path)
        addrs = [f"{h.addr}:{REG_PORT}" for h in hosts]
        leader = _leader(addrs, timeout=30)
        bed.netem(next(h for h in hosts if f"{h.addr}:{REG_PORT}" == leader).name, delay_ms=100, loss_pct=5)
        with RegistryClient(",".join(addrs)) as reg:
            got = [reg.get_ts() for _ in range(30)]
        assert got == sorted(got) and len(set(got)) == len(got)
    finally:
        etcd.stop()
