"""Replicated Pumps (``replicas`` = 2) with real processes: a Pump killed for good
(its data directory deleted) under a multi-writer load loses nothing and does not
hold windows back; two Pumps down refuse writes with NotEnoughReplicas and make
windows wait naming them, and nothing acknowledged is lost when they return; a
Pump host partitioned (network namespaces) and healed catches up, nothing is
served with two commit_ts, the rows rebuilt equal the upstream, and GC follows
the consumer's checkpoint. And the chain a user runs through a host lost for good:
windows ingested into a Delta lake while the workload runs and after the loss,
through the real readiness path, never waiting for the dead Pump; the lake
applied to a fresh target equals the upstream (``binlake diff``), and restores at
commit_ts captured during the run equal copies of the upstream taken there."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import pathlib
import shutil
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import sqlalchemy as sa
from pumpkit import (
    Processes,
    ServiceProcess,
    WriterThreads,
    commit,
    prewrite,
    register_writer,
    run_cli,
    start_registry,
    three_pumps,
    try_status,
    wait_safe,
    wait_until,
)

from binlake import errors, tso
from binlake.client.pump_client import PumpClient
from binlake.client.reader import pull_window
from binlake.config import ClientSettings
from binlake.lake import ingest
from binlake.lake.pumps.pump_check import STATUS_TIMEOUT_S, plan_read
from binlake.registry.client import RegistryClient
from binlake.replicate import runner, task
from binlake.restore import restore
from binlake.source.replay import Replay
from binlake.sql import checksum, diff
from binlake.testing.netbed import NetBed
from binlake.workload import plan as wplan
from binlake.workload import run as wrun
from binlake.writer.txn_status import MemoryStatusProvider, TxnStatusServer
from binlake.writer.txn_writer import TxnWriter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow

WRITERS = 6
PUMP_PORT = 8250


class Workload(WriterThreads):
    """Writer threads doing what TxnWriter does around an upstream commit, counting
    every transaction that failed (a prewrite refused or a commit not acknowledged)."""

    def __init__(self, client: PumpClient, reg: RegistryClient, provider: MemoryStatusProvider) -> None:
        super().__init__(WRITERS, daemon=True)
        self.client, self.reg, self.provider = client, reg, provider
        self.acked: dict[int, int] = {}  # start -> commit_ts, acknowledged to the writer
        self.placements: collections.Counter[str] = collections.Counter()
        self.failed: list[str] = []

    def txn(self) -> None:
        start = self.reg.get_ts()
        try:
            placement = self.client.write_prewrite(prewrite(start))
        except errors.BinlakeError as exc:
            self.provider.set_rolled_back(start)
            with self.lock:
                self.failed.append(f"prewrite {start}: {exc}")
            return
        commit_ts = self.reg.get_ts()
        self.provider.set_committed(start, commit_ts)
        try:
            self.client.write_commit(commit(start, commit_ts), placement)
        except errors.BinlakeError as exc:
            with self.lock:
                self.failed.append(f"commit {start}: {exc}")
            return
        with self.lock:
            self.acked[start] = commit_ts
            self.placements[placement] += 1


def _settings(reg_addr: str, replicas: int = 2) -> ClientSettings:
    return ClientSettings(registry=reg_addr, replicas=replicas, strategy="range", max_failures=1,
                          probe_interval_s=0.2, refresh_interval_s=0.3, write_timeout_s=3.0, commit_retry_s=5.0)


@dataclasses.dataclass
class Rig:
    """Three Pumps (processes), a writer registered with its status service, and
    the writer threads' PumpClient at R = 2 (not started)."""

    reg_addr: str
    ports: dict[str, int]
    pumps: dict[str, tuple[ServiceProcess, str]]
    addrs: dict[str, str]
    reg: RegistryClient
    provider: MemoryStatusProvider
    client: PumpClient
    load: Workload


@contextlib.contextmanager
def _rig(procs: Processes, tmp_path: pathlib.Path, replicas: int = 2) -> Iterator[Rig]:
    reg_addr, ports, pumps = three_pumps(procs, tmp_path)
    reg = RegistryClient(reg_addr)
    provider = MemoryStatusProvider()
    status_server = TxnStatusServer(provider).start()
    client = PumpClient(reg_addr, settings=_settings(reg_addr, replicas))
    try:
        register_writer(reg, status_server.addr, "w1")
        yield Rig(reg_addr, ports, pumps, {n: addr for n, (_svc, addr) in pumps.items()}, reg, provider, client,
                  Workload(client, reg, provider))
    finally:
        client.close()
        status_server.stop(0.2)
        reg.close()


def _check_served(addrs: dict[str, str], acked: dict[int, int], first: int, end: int) -> None:
    served = list(pull_window(addrs, first, end))
    keys = [(b.commit_ts, b.start_ts) for b in served]
    assert keys == sorted(keys)
    counts = collections.Counter(b.start_ts for b in served)
    assert [s for s, n in counts.items() if n > 1] == [], "a transaction was served twice"
    got = {b.start_ts: b.commit_ts for b in served}
    missing = {s: c for s, c in acked.items() if got.get(s) != c}
    assert missing == {}, f"{len(missing)} acknowledged transactions lost or with another commit_ts"


def test_pump_host_lost_for_good_loses_nothing(procs: Processes, tmp_path: pathlib.Path) -> None:
    with _rig(procs, tmp_path) as rig:
        reg_addr, pumps, addrs, reg, load = rig.reg_addr, rig.pumps, rig.addrs, rig.reg, rig.load
        try:
            first = reg.get_ts()
            load.start()
            time.sleep(1.5)
            victim = "p2"
            pumps[victim][0].kill()  # kill -9 ...
            shutil.rmtree(tmp_path / victim)  # ... and the disk is gone for good
            acked_at_kill = len(load.acked)
            killed_ts = reg.get_ts()
            # Windows above the kill keep being served by the two others, without the victim:
            # measure how long each window waited after its end was allocated.
            waits = []
            for _ in range(4):
                end = reg.get_ts()
                began = time.monotonic()
                plan = wait_until(lambda end=end: _try_plan(reg_addr, killed_ts, end), timeout=20, interval=0.05,
                                  what="a window served without the dead pump")
                waits.append(time.monotonic() - began)
                assert victim not in {p.node_id for p in plan.pumps}
            time.sleep(1.0)
            load.finish()
        finally:
            load.stop.set()
        assert load.crashes == []
        assert load.failed == [], f"{len(load.failed)} failed transactions, first: {load.failed[:1]}"
        assert acked_at_kill > 20 and len(load.acked) > acked_at_kill + 20
        # Every prewrite was on two Pumps; after the kill, never on the victim.
        assert all(len(p.split(",")) == 2 for p in load.placements)
        print(f"longest wait of a window after the kill: {max(waits):.3f}s; "
              f"{len(load.acked)} transactions, {acked_at_kill} before the kill")
        assert max(waits) < 5.0, waits
        end = max(load.acked.values()) + 1
        live = {n: a for n, a in addrs.items() if n != victim}
        plan = wait_until(lambda: _try_plan(reg_addr, first, end), timeout=20, what="the whole run's window")
        assert sorted(p.node_id for p in plan.pumps) == sorted(live)
        _check_served(plan.addrs, load.acked, first, end)
        # Without replication (W = 1) the same window waits for the dead Pump, naming it.
        with pytest.raises(errors.Unavailable, match=victim):
            plan_read(reg_addr, first, end, min_acks=1)


def test_a_cluster_replicated_from_its_start_ingests_its_first_window_with_a_pump_lost(
        procs: Processes, tmp_path: pathlib.Path) -> None:
    """``binlake registry --replicas 2`` on an empty store: R = W = 2 from ts 0. A DDL
    and rows are written, then a Pump is lost for good. The lake's first ingest reads
    the DDL history from ts 0 and plans its first window (the real readiness path,
    ``ingest._history_from_pumps`` and ``plan_read``): both succeed from the Pump
    left, where a cluster replicated from a later ts failed within 10 s. A Pump that
    joined after the writes and is lost too is not asked for windows before it
    joined (the registry knows it held nothing below its first safe ts)."""
    from binlake.proto import binlog_pb2
    from binlake.registry.model import ReplicationSetting

    _svc, reg_addr = procs.registry(tmp_path / "registry", extra=("--replicas", "2"))
    pumps = {n: procs.pump(reg_addr, tmp_path / n, n, wait=False) for n in ("p1", "p2")}
    for svc, addr in pumps.values():
        procs.wait_pump(svc, addr)
    provider = MemoryStatusProvider()
    status_server = TxnStatusServer(provider).start()
    reg = RegistryClient(reg_addr)
    client = PumpClient(reg_addr, settings=_settings(reg_addr, replicas=1))  # the registry's setting wins
    try:
        assert reg.get_replication() == [ReplicationSetting(0, 2, 2)]
        register_writer(reg, status_server.addr, "w1")

        def write(b: binlog_pb2.Binlog) -> tuple[int, int, str]:
            placement = client.write_prewrite(b)
            commit_ts = reg.get_ts()
            provider.set_committed(b.start_ts, commit_ts)
            client.write_commit(commit(b.start_ts, commit_ts), placement)
            return b.start_ts, commit_ts, placement

        ddl = prewrite(reg.get_ts())
        ddl.ddl_query = b"CREATE TABLE t (id BIGINT PRIMARY KEY)"
        ddl_start, _ddl_commit, where = write(ddl)
        assert where.count(",") == 1  # on both Pumps
        first_window = reg.get_ts()
        rows = {s: c for s, c, _ in (write(prewrite(reg.get_ts())) for _ in range(5))}
        end = reg.get_ts()
        for _svc, addr in pumps.values():
            wait_safe(addr, end)
        # A third Pump joins after the writes (it holds nothing of them)...
        late_svc, late_addr = procs.pump(reg_addr, tmp_path / "p3", "p3")
        wait_until(lambda: reg.get_node("p3").empty_below_ts >= end, timeout=10, what="p3's first heartbeats")
        # ...and it and p2 are lost for good: more than W - 1 = 1 Pump unreachable.
        for svc in (pumps["p2"][0], late_svc):
            svc.kill()
        shutil.rmtree(tmp_path / "p2")
        began = time.monotonic()
        ddls, lost = ingest._history_from_pumps(reg_addr, [(0, first_window)])
        plan = plan_read(reg_addr, first_window, end)
        assert [b.start_ts for b in ddls] == [ddl_start] and lost == []
        assert list(plan.addrs) == ["p1"]
        served = {b.start_ts: b.commit_ts for b in pull_window(plan.addrs, first_window, end)}
        assert served == rows
        assert time.monotonic() - began < STATUS_TIMEOUT_S + 2
        # Read as if W = 1 were in force from ts 0 (a later setting), the DDL history waits for p2.
        with pytest.raises(errors.Unavailable, match="which cannot be read without it"):
            plan_read(reg_addr, 0, first_window, min_acks=1)
        assert late_addr
    finally:
        client.close()
        status_server.stop(0.2)
        reg.close()


def _try_plan(reg_addr: str, start: int, end: int):  # type: ignore[no-untyped-def]
    try:
        return plan_read(reg_addr, start, end, min_acks=2)
    except (errors.FailedPrecondition, errors.Unavailable):
        return None


def test_windows_are_read_with_the_w_in_force_across_a_raise_of_r(
        procs: Processes, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R = W = 1 at first; ``ctl replication`` raises them to 2 mid-run (recorded in
    the registry from a TSO 1 s ahead); transactions here last milliseconds, so the
    readers' look-back (``txn_lookback_s``) is 5 s. With a Pump then down for good, a
    window before the change waits for it (W = 1 was in force: it may hold the only
    copy), a window reaching back over the change too, and a window a look-back
    after the change is served from the two others, nothing missing."""
    monkeypatch.setenv("BINLAKE_CLIENT_TXN_LOOKBACK_S", "5")
    with _rig(procs, tmp_path, replicas=1) as rig:
        reg, load = rig.reg, rig.load
        try:
            first = reg.get_ts()
            load.start()
            time.sleep(1.0)
            res = run_cli("ctl", "replication", "--replicas", "2", "--grace-s", "1", "--registry", rig.reg_addr)
            assert res.returncode == 0, res.stderr
            (change,) = reg.get_replication()
            assert (change.replicas, change.min_acks) == (2, 2)
            wait_until(lambda: tso.physical_ms(reg.get_ts()) > tso.physical_ms(change.from_ts) + 7500, timeout=30,
                       what="writes past the change and a look-back")
            load.finish()
        finally:
            load.stop.set()
        assert load.crashes == [] and load.failed == [], load.failed[:1]
        # The look-back's premise: no transaction ran longer.
        assert max(tso.physical_ms(c) - tso.physical_ms(s) for s, c in load.acked.items()) < 5000
        singles = {p for p in load.placements if "," not in p}
        assert singles and any(len(p.split(",")) == 2 for p in load.placements), load.placements
        end = max(load.acked.values()) + 1
        for addr in rig.addrs.values():
            wait_safe(addr, end)
        victim = "p2"
        rig.pumps[victim][0].kill()
        shutil.rmtree(tmp_path / victim)
        after = tso.compose(tso.physical_ms(change.from_ts) + 5000)
        # Before the change (W = 1 in force): waits for the dead Pump, naming it.
        with pytest.raises(errors.Unavailable, match=rf"pump {victim} at \S+ is unreachable"):
            plan_read(rig.reg_addr, first, change.from_ts)
        # Within a look-back after the change, transactions written at W = 1 may still commit: W = 1.
        with pytest.raises(errors.Unavailable, match=rf"pump {victim} at \S+ is unreachable"):
            plan_read(rig.reg_addr, change.from_ts, after)
        # A look-back after it: W = 2, served without the dead Pump, every acknowledged transaction there.
        plan = plan_read(rig.reg_addr, after, end)
        assert sorted(plan.addrs) == ["p1", "p3"]
        in_window = {s: c for s, c in load.acked.items() if after <= c < end}
        assert len(in_window) > 20
        _check_served(plan.addrs, in_window, after, end)


def test_two_of_three_down_refuses_writes_and_windows_wait(procs: Processes, tmp_path: pathlib.Path) -> None:
    with _rig(procs, tmp_path) as rig:
        reg_addr, ports, pumps, addrs, reg, provider, client, load = (
            rig.reg_addr, rig.ports, rig.pumps, rig.addrs, rig.reg, rig.provider, rig.client, rig.load)
        first = reg.get_ts()
        for _ in range(30):
            load.txn()
        assert load.failed == [] and len(load.acked) == 30
        for n in ("p2", "p3"):
            pumps[n][0].kill()
        # Writes fail fast and say why; none is kept on a single copy.
        began = time.monotonic()
        for _ in range(4):
            load.txn()
        assert len(load.acked) == 30
        assert len(load.failed) == 4
        assert all("fewer than min_acks=2" in f for f in load.failed), load.failed[-1]
        assert time.monotonic() - began < 15
        refused = reg.get_ts()
        provider.set_rolled_back(refused)  # what the upstream does with a refused prewrite
        with pytest.raises(errors.NotEnoughReplicas, match="fewer than min_acks=2"):
            client.write_prewrite(prewrite(refused))
        # A client acknowledging at W = 1 leaves a transaction on p1 alone (under-replicated).
        with PumpClient(reg_addr, settings=_settings(reg_addr).model_copy(update={"min_acks": 1})) as lax:
            lone = reg.get_ts()
            assert lax.write_prewrite(prewrite(lone)) == "p1"
            lone_commit = reg.get_ts()
            provider.set_committed(lone, lone_commit)
            lax.write_commit(commit(lone, lone_commit), "p1")
        load.acked[lone] = lone_commit
        # Windows wait, naming the Pumps they wait for.
        end = reg.get_ts()
        wait_safe(addrs["p1"], end)
        with pytest.raises(errors.Unavailable, match=r"unreachable pump\(s\) p2, p3"):
            plan_read(reg_addr, first, end, min_acks=2)
        # They come back (same disks): nothing acknowledged was lost.
        for n in ("p2", "p3"):
            svc, _ = procs.pump(reg_addr, tmp_path / n, n, ports[n], wait=False)
            procs.wait_pump(svc, addrs[n])
        wait_until(lambda: client.available() == ["p1", "p2", "p3"], timeout=15, what="pumps writable again")
        for _ in range(10):
            load.txn()
        assert len(load.acked) == 41
        end = max(load.acked.values()) + 1
        plan = wait_until(lambda: _try_plan(reg_addr, first, end), timeout=20, what="the window")
        assert sorted(p.node_id for p in plan.pumps) == ["p1", "p2", "p3"]
        _check_served(plan.addrs, load.acked, first, end)
        # The operator sees what only p1 holds, and cannot retire p1 without --force.
        env = {"BINLAKE_CLIENT_REPLICAS": "2"}
        res = run_cli("ctl", "pumps", "--registry", reg_addr, env=env)
        assert res.returncode == 0, res.stderr
        assert "pump p1: 1 under-replicated transaction(s)" in res.stdout, res.stdout
        assert "pump p2: 0 under-replicated" in res.stdout and "pump p3: 0 under-replicated" in res.stdout
        res = run_cli("ctl", "offline-pump", "p1", "--registry", reg_addr, env=env)
        assert res.returncode != 0
        assert "holds the only copy of 1 transaction(s)" in res.stderr and "--force" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
        res = run_cli("ctl", "offline-pump", "p3", "--registry", reg_addr, env=env)
        assert res.returncode == 0, res.stderr


@pytest.mark.hosts(3)
def test_partitioned_host_catches_up_and_a_lost_host_loses_nothing(bed: NetBed, tmp_path: pathlib.Path) -> None:
    """Three Pump hosts (network namespaces), R = W = 2 set in the registry, writer
    threads and a real TxnWriter workload on the test's host. One Pump host is cut
    off, then healed; then another is lost for good (kill -9, disk deleted). No
    transaction fails; windows are served without the missing one meanwhile; the
    healed one catches up (its safe ts passes the end, nothing pending) and every
    copy of a transaction has one commit_ts; the rows rebuilt from the two Pumps
    left equal the upstream; GC stays at the consumer's checkpoint, then follows it."""
    logs = tmp_path / "logs"
    logs.mkdir()
    registry = start_registry(tmp_path / "registry", f"{bed.gateway}:0")
    reg = RegistryClient(registry.addr)
    provider = MemoryStatusProvider()
    status_server = TxnStatusServer(provider, f"{bed.gateway}:0").start()
    load: Workload | None = None
    try:
        reg.set_replication(2, 2, 0)
        first = reg.get_ts()
        # The lake's consumer holds GC at the start of the run (retention alone would pass it).
        reg.update_consumer("lake:test", first, "the test's reader")
        addrs = {f"p{i}": f"{h.addr}:{PUMP_PORT}" for i, h in enumerate(bed.hosts, 1)}
        env = {**os.environ, "BINLAKE_PUMP_HEARTBEAT_INTERVAL_S": "0.3", "BINLAKE_PUMP_GC_INTERVAL_S": "0.5",
               "BINLAKE_PUMP_GC_RETENTION_DAYS": "0.00001"}
        for (node_id, addr), h in zip(addrs.items(), bed.hosts, strict=True):
            h.spawn([sys.executable, "-m", "binlake.cli", "pump", "--registry", registry.addr, "--data-dir",
                     str(tmp_path / node_id), "--addr", addr, "--node-id", node_id,
                     "--stop-write-at-free-bytes", "0", "--txn-timeout-s", "2", "--fake-binlog-interval-s",
                     "0.5"], logs / f"{node_id}.log", env=env)
        for addr in addrs.values():
            wait_until(lambda a=addr: (st := try_status(a)) is not None and st.accepting_writes, 40,
                       what=f"pump at {addr}")
        register_writer(reg, status_server.addr, "w1")
        client = PumpClient(registry.addr, settings=_settings(registry.addr))
        load = Workload(client, reg, provider)
        upstream = f"sqlite:///{tmp_path / 'upstream.db'}"
        workload: dict[str, object] = {}

        def run_workload() -> None:
            try:
                with TxnWriter(upstream, registry=registry.addr, status_addr=f"{bed.gateway}:0") as tw:
                    workload["writer"] = tw
                    plan = wplan.plan("mixed", 2, 150, 7, large_txn_rows=20, large_txn_every=60, table_rows=30,
                                      accounts=10)
                    workload["summary"] = wrun.run(tw, plan, clients=2, rate=15, progress=False)
            except BaseException as exc:  # reported by the assertions below
                workload["error"] = exc

        workload_thread = threading.Thread(target=run_workload, name="workload", daemon=True)
        load.start()
        workload_thread.start()
        time.sleep(1.5)
        bed.partition("h2")
        cut_ts = reg.get_ts()
        waits = []
        for _ in range(3):
            end = reg.get_ts()
            began = time.monotonic()
            plan = wait_until(lambda end=end: _try_plan(registry.addr, cut_ts, end), timeout=30, interval=0.05,
                              what="a window served without the partitioned pump")
            waits.append(time.monotonic() - began)
            assert "p2" not in {p.node_id for p in plan.pumps}
        acked_in_partition = len(load.acked)
        time.sleep(1.0)
        bed.heal("h2")
        wait_until(lambda: client.available() == ["p1", "p2", "p3"], timeout=20, what="p2 writable again")
        wait_until(lambda n=acked_in_partition: len(load.acked) > n + 30, timeout=20, what="writes after heal")
        took = sum(n for p, n in load.placements.items() if "p2" in p)
        wait_until(lambda: sum(n for p, n in load.placements.items() if "p2" in p) > took + 10, timeout=30,
                   what="p2 taking writes again")
        # The TxnWriter's own client probes p2 back too before the next loss (else, with
        # p2 still unavailable to it and p3 gone, it rightly refuses with NotEnoughReplicas).
        tw = workload.get("writer")
        if isinstance(tw, TxnWriter):
            wait_until(lambda: "p2" in tw.pump_client.available(), timeout=30, what="p2 back for the TxnWriter")
        # Then the third host is lost for good (kill -9, its disk deleted) while the writes go on.
        acked_before_loss = len(load.acked)
        bed.kill9("h3")
        shutil.rmtree(tmp_path / "p3")
        wait_until(lambda n=acked_before_loss: len(load.acked) > n + 30, timeout=20, what="writes after the loss")
        live = {n: a for n, a in addrs.items() if n != "p3"}
        load.finish()
        workload_thread.join(timeout=120)
        client.close()

        assert load.crashes == [] and load.failed == [], load.failed[:2]
        print(f"longest wait of a window during the partition: {max(waits):.3f}s; {len(load.acked)} txns")
        # A partition is noticed, not refused: the first window waits for the writers' 3 s write
        # timeout (their prewrites hold the others' safe ts meanwhile) and one 5 s Status timeout;
        # the next ones are served at once.
        assert max(waits) < 3.0 + STATUS_TIMEOUT_S + 7.0 and min(waits) < 3.0, waits
        assert "error" not in workload, workload.get("error")
        summary = workload["summary"]
        assert isinstance(summary, wrun.Summary)
        assert summary.errors == 0 and not summary.gave_up, summary.error_messages[:3]
        # p2 caught up: its safe ts passes the end and nothing is pending on it.
        end = max([*load.acked.values(), summary.end_ts]) + 1
        for addr in live.values():
            wait_safe(addr, end, timeout=40)
        assert all(try_status(a).pending_txns == 0 for a in live.values())  # type: ignore[union-attr]
        # GC held at the consumer's checkpoint all along.
        assert all(try_status(a).gc_ts <= first for a in live.values())  # type: ignore[union-attr]
        # The window over the whole run is read without the lost Pump.
        plan = wait_until(lambda: _try_plan(registry.addr, first, end), timeout=20, what="the run's window")
        assert sorted(plan.addrs) == ["p1", "p2"]
        # Every copy of a transaction has one commit_ts (never two), on every Pump.
        copies: dict[int, set[int]] = collections.defaultdict(set)
        for node_id, addr in live.items():
            for b in pull_window({node_id: addr}, first, end):
                copies[b.start_ts].add(b.commit_ts)
        assert [s for s, c in copies.items() if len(c) > 1] == []
        _check_served(live, load.acked, first, end)
        # The rows rebuilt from the Pumps equal the upstream's.
        binlogs = [b for b in pull_window(live, summary.start_ts, summary.end_ts) if b.start_ts not in load.acked]
        assert len(binlogs) == summary.committed + summary.ddls
        replay = Replay().apply(binlogs)
        assert replay.checksums() == checksum.checksum(upstream, schema=replay.schema())
        # The consumer moves on: GC follows it on every Pump, never past it.
        reg.update_consumer("lake:test", end)
        wait_until(lambda: all(first < try_status(a).gc_ts <= end for a in live.values()),  # type: ignore[union-attr]
                   timeout=20, what="GC to follow the checkpoint")
    finally:
        if load is not None:
            load.stop.set()
        status_server.stop(0.2)
        reg.close()
        registry.stop()


def _ready_plan(reg_addr: str, start: int, end: int, why: list[str]):  # type: ignore[no-untyped-def]
    """The ingest's own readiness check (W from the registry), None while the window
    waits (the reason kept in ``why``, for the failure message)."""
    try:
        return plan_read(reg_addr, start, end)
    except (errors.FailedPrecondition, errors.Unavailable) as exc:
        why[:] = [str(exc)]
        return None


def _snapshot(url: str, copy: pathlib.Path) -> None:
    """SQLite's online backup (the upstream runs in WAL mode: a file copy could miss commits)."""
    src = sqlite3.connect(url.removeprefix("sqlite:///"))
    dst = sqlite3.connect(copy)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


# ~95 s with a warm Spark session on two loaded cores; minutes when Spark competes.
@pytest.mark.timeout(600)
def test_lake_goes_on_through_a_lost_pump_host_then_apply_and_restore_equal_the_upstream(
        procs: Processes, tmp_path: pathlib.Path, spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """R = W = 2 configured from the start, three Pumps, a real TxnWriter workload in
    three slices (the upstream quiesced after each: a TSO taken and the upstream
    copied there). A Pump is killed -9 and its data directory deleted during the
    second slice. Meanwhile windows keep coming ready through the readiness rule
    the ingest uses (``plan_read``, W in force), never waiting for the dead Pump
    (the longest wait measured), and are ingested into the lake, from the two
    Pumps left; the lake applied to a fresh SQLite target equals the upstream, and
    restores to the ts captured before and after the loss equal the copies taken there."""
    # The cluster's R and W from the configuration (the registry's history would
    # read windows within TXN_LOOKBACK_MS of a change with the older W = 1).
    monkeypatch.setenv("BINLAKE_CLIENT_REPLICAS", "2")
    monkeypatch.setenv("BINLAKE_CLIENT_MIN_ACKS", "2")
    reg_addr, _ports, pumps = three_pumps(procs, tmp_path)
    reg = RegistryClient(reg_addr)
    victim = "p2"
    try:
        lake_start = reg.get_ts()
        upstream = f"sqlite:///{tmp_path / 'upstream.db'}"
        plan = wplan.plan("mixed", 2, 180, 21, large_txn_rows=20, large_txn_every=60, table_rows=30, accounts=10)
        slices = [plan[0:60], plan[60:120], plan[120:180]]
        captures: list[tuple[int, pathlib.Path, dict[str, tuple[int, str]]]] = []
        summaries: list[wrun.Summary] = []
        workload: dict[str, BaseException] = {}

        def run_workload() -> None:
            try:
                with TxnWriter(upstream, registry=reg_addr) as tw, RegistryClient(reg_addr) as wreg:
                    for i, part in enumerate(slices):
                        summaries.append(wrun.run(tw, part, clients=2, rate=10, progress=False))
                        # Every writer is idle: all committed so far are below ts, all later above.
                        ts = wreg.get_ts()
                        copy = tmp_path / f"cut{i}.db"
                        _snapshot(upstream, copy)
                        captures.append((ts, copy, checksum.checksum(upstream)))
            except BaseException as exc:  # reported by the assertions below
                workload["error"] = exc

        # The windows' readiness, probed as the ingest's trigger does, all through the run:
        # (window end, seconds from its end being allocated to the window being ready, Pumps to read).
        probes: list[tuple[int, float, tuple[str, ...]]] = []
        killed = threading.Event()
        done = threading.Event()

        def probe_windows() -> None:
            start = lake_start
            why: list[str] = []
            while not done.is_set():
                end = reg.get_ts()
                began = time.monotonic()
                while (ready := _ready_plan(reg_addr, start, end, why)) is None:
                    if time.monotonic() - began > 30:
                        workload["probe"] = AssertionError(f"window [{start}, {end}) not ready in 30 s: {why}")
                        return
                    time.sleep(0.05)
                if killed.is_set():
                    probes.append((end, time.monotonic() - began, tuple(sorted(ready.addrs))))
                start = end
                time.sleep(0.3)

        thread = threading.Thread(target=run_workload, name="workload", daemon=True)
        prober = threading.Thread(target=probe_windows, name="readiness", daemon=True)
        lake = str(tmp_path / "lake")
        results: list[ingest.IngestResult] = []

        def ingest_when_ready(a: int, b: int) -> None:
            # As the DAG does: its wait step passes once the window is ready (a fresh TSO is
            # above the Pumps' safe ts until their next tick), then the ingest runs.
            why: list[str] = []
            wait_until(lambda: _ready_plan(reg_addr, a, b, why) is not None, timeout=30,
                       what=f"window [{a}, {b}) ready")
            results.append(ingest.ingest_window(spark, lake, reg_addr, a, b))
        began_run = time.monotonic()
        thread.start()
        prober.start()
        wait_until(lambda: len(captures) >= 1, timeout=60, what="the first slice")
        time.sleep(1.0)
        pumps[victim][0].kill()  # kill -9 mid-slice ...
        shutil.rmtree(tmp_path / victim)  # ... and the disk is gone for good
        killed.set()
        # A window ingested while the workload goes on, after the loss: from the two left.
        bound = reg.get_ts()
        ingest_when_ready(lake_start, bound)
        thread.join(timeout=180)
        done.set()
        prober.join(timeout=60)
        assert "error" not in workload and "probe" not in workload, workload
        assert len(summaries) == 3 and len(captures) == 3
        for s in summaries:
            assert s.errors == 0 and not s.gave_up, s.error_messages[:3]
        # The rest of the run in two more windows.
        end = reg.get_ts()
        mid = captures[1][0] if captures[1][0] > bound else (bound + end) // 2
        for a, b in ((bound, mid), (mid, end)):
            ingest_when_ready(a, b)
        ingest_secs = time.monotonic() - began_run
        longest = max(w for _e, w, _p in probes)
        print(f"{len(probes)} windows probed after the loss, longest wait for readiness {longest:.3f}s; "
              f"{len(results)} windows ingested, run + ingest {ingest_secs:.1f}s")
        # No window after the loss waited for the dead Pump, nor was read from it.
        assert len(probes) >= 5 and longest < 5.0, probes
        assert all(victim not in p for _e, _w, p in probes)
        assert all(r.pumps == ("p1", "p3") for r in results), [r.pumps for r in results]
        assert sum(r.txns for r in results) >= sum(s.committed for s in summaries)
        assert sum(r.duplicates for r in results) > 0  # two copies read, each transaction written once

        # The lake applied to a fresh target equals the upstream.
        target = f"sqlite:///{tmp_path / 'target.db'}"
        summary = runner.Applier(spark, task.Task(name="replicas", lake=lake, target=target,
                                                  mode="consistent")).run()
        assert summary.windows == len(results)
        engine = sa.create_engine(upstream)
        try:
            tables = [t for t in sa.inspect(engine).get_table_names() if not t.startswith("_binlake")]
        finally:
            engine.dispose()
        assert len(tables) >= 3
        report = diff.diff_databases(upstream, target, tables=tables)
        assert report.ok, report.summary()

        # Restores at a ts before the loss and one after it equal the upstream's copies there.
        for ts, copy, sums in captures[:2]:
            restored = f"sqlite:///{tmp_path / f'restored-{ts}.db'}"
            res = restore.run(spark, lake, ts, target=restored, verify_url=f"sqlite:///{copy}")
            assert res.verified is not None and res.verified.startswith("clean"), res.verified
            got = checksum.checksum(restored, list(sums), schema=checksum.load_schema(f"sqlite:///{copy}"))
            assert got == sums, f"restore at {ts}"
        print(f"whole chain (workload, ingest, apply, diff, 2 restores): {time.monotonic() - began_run:.1f}s")
    finally:
        reg.close()
