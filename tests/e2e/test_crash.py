"""Crash tests with real processes: a registry and Pumps started through the
``binlake`` CLI, writers playing the upstream, ``kill -9`` of a Pump under
load, and a torn value-log tail left behind by a crash."""

from __future__ import annotations

import collections
import contextlib
import pathlib
import threading
import time

import pytest
from pumpkit import (
    Processes,
    WriterThreads,
    commit,
    free_port,
    prewrite,
    pull,
    register_writer,
    row_start_ts,
    run_cli,
    status,
    wait_safe,
    wait_until,
    write_one,
)

from binlake import errors
from binlake.client.pump_client import PumpClient
from binlake.client.reader import pull_window
from binlake.config import ClientSettings
from binlake.pump.vlog import HEADER, MAGIC, encode_record
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeState
from binlake.registry.server import RegistryServer
from binlake.writer.txn_status import MemoryStatusProvider, TxnStatusServer

pytestmark = pytest.mark.slow

WRITERS = 8


class Upstream(WriterThreads):
    """Eight writer threads doing what TxnWriter does around an upstream commit."""

    def __init__(self, client: PumpClient, reg: RegistryClient, provider: MemoryStatusProvider) -> None:
        self.client = client
        self.reg = reg
        self.provider = provider
        super().__init__(WRITERS)
        self.acked: list[tuple[int, int, str, float]] = []  # start, commit, pump, when
        self.committed: dict[int, int] = {}  # what the upstream committed: start -> commit
        self.rolled_back: set[int] = set()
        self.commit_failures: list[str] = []

    def txn(self) -> None:
        start = self.reg.get_ts()
        try:
            node_id = self.client.write_prewrite(prewrite(start))
        except errors.BinlakeError:
            # No pump took the prewrite: the upstream aborts the transaction.
            self.provider.set_rolled_back(start)
            with self.lock:
                self.rolled_back.add(start)
            return
        commit_ts = self.reg.get_ts()
        # The upstream commit; from here on the transaction exists, acknowledged or not.
        self.provider.set_committed(start, commit_ts)
        with self.lock:
            self.committed[start] = commit_ts
        try:
            self.client.write_commit(commit(start, commit_ts), node_id)
        except errors.BinlakeError as exc:
            with self.lock:
                self.commit_failures.append(str(exc))
            return
        with self.lock:
            self.acked.append((start, commit_ts, node_id, time.monotonic()))


def _one_pump_rig(procs: Processes, tmp_path: pathlib.Path) -> tuple[
        str, int, pathlib.Path, RegistryClient, TxnStatusServer, PumpClient, Upstream]:
    """A registry process, the writers' status service and eight writer threads
    (not started) for one Pump the test starts itself on ``port`` over ``data_dir``:
    (registry address, port, data dir, registry client, status server, Pump client, upstream)."""
    _reg_proc, reg_addr = procs.registry(tmp_path / "registry")
    reg = RegistryClient(reg_addr)
    provider = MemoryStatusProvider()
    status_server = TxnStatusServer(provider).start()
    register_writer(reg, status_server.addr, "w1")
    settings = ClientSettings(
        registry=reg_addr, max_failures=1, probe_interval_s=0.1, refresh_interval_s=0.3,
        write_timeout_s=3.0, commit_retry_s=1.0,
    )
    client = PumpClient(reg_addr, settings=settings)
    return reg_addr, free_port(), tmp_path / "c1", reg, status_server, client, Upstream(client, reg, provider)


def _assert_served_once_as_committed(addr: str, upstream: Upstream, first: int, until: int) -> None:
    """The Pump at ``addr`` serves [first, until) in (commit_ts, start_ts) order, each
    transaction once: every acknowledged one with its commit_ts, nothing the upstream
    did not commit."""
    served = pull(addr, first, until)
    keys = [(b.commit_ts, b.start_ts) for b in served]
    assert keys == sorted(keys), "not in (commit_ts, start_ts) order"
    counts = collections.Counter(b.start_ts for b in served)
    assert [s for s, n in counts.items() if n > 1] == [], "a transaction was served twice"
    got = {b.start_ts: b.commit_ts for b in served}
    missing = [(s, c) for s, c, _, _ in upstream.acked if got.get(s) != c]
    assert missing == [], f"{len(missing)} acknowledged transactions lost or with another commit_ts"
    assert [(s, c) for s, c in got.items() if upstream.committed.get(s) != c] == []
    assert all(row_start_ts(b) == b.start_ts for b in served)


def test_kill_pump_under_load(procs: Processes, tmp_path: pathlib.Path) -> None:
    _reg_proc, reg_addr = procs.registry(tmp_path / "registry")
    ports = {f"p{i}": free_port() for i in (1, 2, 3)}
    pumps = {name: procs.pump(reg_addr, tmp_path / name, name, port, wait=False) for name, port in ports.items()}
    for svc, addr in pumps.values():
        procs.wait_pump(svc, addr)
    addrs = {name: addr for name, (_svc, addr) in pumps.items()}

    reg = RegistryClient(reg_addr)
    provider = MemoryStatusProvider()
    status_server = TxnStatusServer(provider).start()
    register_writer(reg, status_server.addr, "w1")
    settings = ClientSettings(
        registry=reg_addr, strategy="range", max_failures=1, probe_interval_s=0.2, refresh_interval_s=0.3,
        write_timeout_s=3.0, commit_retry_s=20.0,
    )
    client = PumpClient(reg_addr, settings=settings)
    upstream = Upstream(client, reg, provider)
    try:
        upstream.start()
        time.sleep(1.0)
        victim, victim_svc = "p2", pumps["p2"][0]
        # Writers that crash with the victim: their prewrites are on it, the upstream
        # decided (three committed, one rolled back), and no commit binlog will ever come.
        abandoned: dict[int, int] = {}
        for i in range(4):
            start = reg.get_ts()
            write_one(addrs[victim], prewrite(start))
            if i < 3:
                abandoned[start] = reg.get_ts()
                provider.set_committed(start, abandoned[start])
            else:
                provider.set_rolled_back(start)
                abandoned_rollback = start
        with upstream.lock:
            upstream.committed.update(abandoned)
            upstream.rolled_back.add(abandoned_rollback)
        victim_svc.kill()
        killed_at = time.monotonic()
        acked_at_kill = len(upstream.acked)
        time.sleep(0.5)  # the writers fail over meanwhile
        restarted, _ = procs.pump(reg_addr, tmp_path / victim, victim, ports[victim], wait=False)
        procs.wait_pump(restarted, addrs[victim])
        restarted_at = time.monotonic()
        time.sleep(3.0)
        upstream.finish()
    finally:
        upstream.stop.set()
        client.close()

    try:
        assert upstream.crashes == []
        acked = upstream.acked
        assert acked_at_kill > 20, "the writers made too little progress before the kill"
        # Writes went on while the victim was down, and it took writes again after its restart.
        assert any(killed_at < t < restarted_at for *_, t in acked)
        assert any(n == victim and t > restarted_at for _, _, n, t in acked)

        # Wait until every pump's safe ts passes the last commit: the victim's
        # unfinished prewrites resolve through the status server after the txn timeout.
        last = max(upstream.committed.values())
        first = min([*upstream.committed, *upstream.rolled_back])
        for addr in addrs.values():
            wait_safe(addr, last + 1, timeout=30)
        assert all(status(addr).pending_txns == 0 for addr in addrs.values())

        served = list(pull_window(addrs, first, last + 1))
        keys = [(b.commit_ts, b.start_ts) for b in served]
        assert keys == sorted(keys), "not in (commit_ts, start_ts) order"
        counts = collections.Counter(b.start_ts for b in served)
        assert [s for s, n in counts.items() if n > 1] == [], "a transaction was served twice"
        got = {b.start_ts: b.commit_ts for b in served}
        # Every acknowledged transaction, exactly once, with its commit_ts.
        missing = [(s, c) for s, c, _, _ in acked if got.get(s) != c]
        assert missing == [], f"{len(missing)} acknowledged transactions lost or wrong"
        # Nothing the upstream did not commit (and each with the upstream's commit_ts).
        phantoms = [(s, c) for s, c in got.items() if upstream.committed.get(s) != c]
        assert phantoms == []
        assert not set(got) & upstream.rolled_back
        assert all(row_start_ts(b) == b.start_ts for b in served)
        # The abandoned transactions were resolved by asking the writer, never dropped.
        assert {s: got.get(s) for s in abandoned} == abandoned
        assert abandoned_rollback not in got
        assert restarted.log_text().count("resolved missing commit") >= 4

        res = run_cli("ctl", "pumps", "--json", "--registry", reg_addr)
        assert res.returncode == 0, res.stderr
        assert res.stdout.count('"state": "online"') == 3
    finally:
        status_server.stop(0.2)
        reg.close()


def test_torn_tail_after_stop_is_cut_on_restart(
    registry: RegistryServer, reg: RegistryClient, procs: Processes, tmp_path: pathlib.Path
) -> None:
    # (procs after registry: its processes stop first, while the registry still hears them)
    data_dir = tmp_path / "t1"
    port = free_port()
    svc, addr = procs.pump(registry.addr, data_dir, "t1", port)

    def txns(n: int) -> list[tuple[int, int]]:
        out = []
        for _ in range(n):
            start = reg.get_ts()
            write_one(addr, prewrite(start, pad=200))
            commit_ts = reg.get_ts()
            write_one(addr, commit(start, commit_ts))
            out.append((start, commit_ts))
        return out

    def read_all(until: int) -> list[tuple[int, int]]:
        wait_safe(addr, until)
        got = pull(addr, before[0][0], until)
        assert all(row_start_ts(b) == b.start_ts for b in got)
        return [(b.start_ts, b.commit_ts) for b in got]

    before = txns(20)
    assert read_all(before[-1][1] + 1) == before
    assert svc.terminate() == 0
    assert reg.get_node("t1").state is NodeState.PAUSED

    # The crash left half a record (and some garbage) at the end of the last segment.
    segment = sorted((data_dir / "vlog").glob("*.vlog"))[-1]
    good_size = segment.stat().st_size
    record = encode_record(prewrite(reg.get_ts(), pad=300).SerializeToString())
    with segment.open("ab") as fh:
        fh.write(record[: len(record) // 2] + b"\x00\xffgarbage")

    svc, _ = procs.pump(registry.addr, data_dir, "t1", port)
    assert "cutting torn tail" in svc.log_text()
    # The tail was cut at the last good record: what follows it now is a fresh, whole record.
    with segment.open("rb") as fh:
        fh.seek(good_size)
        header = fh.read(HEADER.size)
    assert len(header) < HEADER.size or HEADER.unpack(header)[0] == MAGIC
    assert reg.get_node("t1").state is NodeState.ONLINE
    after = txns(5)
    assert read_all(after[-1][1] + 1) == before + after

    # And once more, cleanly: the records written after the cut are intact.
    assert svc.terminate() == 0
    svc, _ = procs.pump(registry.addr, data_dir, "t1", port)
    assert svc.log_text().count("cutting torn tail") == 1
    assert read_all(after[-1][1] + 1) == before + after
    wait_until(lambda: status(addr).accepting_writes, timeout=5)


def test_crash_between_value_log_fsync_and_index_batch(procs: Processes, tmp_path: pathlib.Path) -> None:
    """The Pump acknowledges a write on the value-log fsync and indexes it later.
    Crash it there (the indexer's failpoint, at a random batch under load from
    eight writers), restart, three times over: every acknowledged transaction is
    served exactly once, in order, and the safe ts never moves back."""
    import os
    import random

    from binlake import failpoint
    from binlake.pump.storage import FAILPOINT_BEFORE_INDEX

    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    reg_addr, port, data_dir, reg, status_server, client, upstream = _one_pump_rig(procs, tmp_path)
    safe_seen: list[int] = []
    watching = threading.Event()
    addr = f"127.0.0.1:{port}"

    def watch_safe_ts() -> None:
        while not watching.wait(0.02):
            st = None
            with contextlib.suppress(Exception):
                st = status(addr, timeout=0.5)
            if st is not None:
                safe_seen.append(st.safe_ts)

    watcher = threading.Thread(target=watch_safe_ts)
    rounds = 3
    crashed_logs: list[str] = []
    try:
        for r in range(rounds + 1):
            last = r == rounds
            nth = rng.randint(20, 150)
            # The indexer stalls 300 ms at the failpoint, so the writer acknowledges
            # more groups it will never index, then the process dies.
            env = {} if last else {failpoint.ENV: f"{FAILPOINT_BEFORE_INDEX}:exit:{nth}:300"}
            svc, _ = procs.pump(reg_addr, data_dir, "c1", port, env=env)
            if r == 0:
                upstream.start()
                watcher.start()
            if last:
                time.sleep(1.0)
                break
            wait_until(lambda svc=svc: not svc.alive, timeout=60, interval=0.02,
                       what=f"the failpoint at index batch {nth} to crash the pump")
            assert svc.proc is not None and svc.proc.returncode == 137, svc.log_text()[-2000:]
            crashed_logs.append(svc.name)
            # The writers' stalled prewrites fail over to nothing: the upstream aborts them.
        upstream.finish()
    finally:
        upstream.stop.set()
        watching.set()
        client.close()

    try:
        assert upstream.crashes == []
        log_text = (tmp_path / "procs" / "c1.log").read_text(errors="replace")
        # Each restart found acknowledged records the index had not caught up with.
        replays = [int(line.split("recovered ")[1].split()[0]) for line in log_text.splitlines()
                   if "value-log records past the index head" in line]
        assert len(replays) == rounds and all(n > 0 for n in replays), replays
        assert len(upstream.acked) > 50, "the writers made too little progress"

        last_commit = max(upstream.committed.values())
        first = min([*upstream.committed, *upstream.rolled_back])
        wait_safe(addr, last_commit + 1, timeout=30)
        assert status(addr).pending_txns == 0
        watching.clear()
        safe_seen.append(status(addr).safe_ts)
        assert all(a <= b for a, b in zip(safe_seen, safe_seen[1:], strict=False)), "the safe ts moved back"

        _assert_served_once_as_committed(addr, upstream, first, last_commit + 1)
    finally:
        status_server.stop(0.2)
        reg.close()


def test_power_loss_takes_acknowledged_commits_and_txn_status_restores_them(
    procs: Processes, tmp_path: pathlib.Path
) -> None:
    """A Pump acknowledges commits before their fsync (prewrites after theirs). A
    power loss there (the ``pump-power-loss`` failpoint: the value log is cut back
    to its last fsync, then the process dies) takes commits the writers were
    told are stored. Restarted, the Pump finds their prewrites pending and
    resolves them through the writers' status service: every acknowledged
    transaction is served once with the commit_ts its writer committed, and
    everything read before the crash (only fsynced records are ever served)
    reads the same afterwards."""
    import os
    import random

    from binlake import failpoint
    from binlake.pump.storage import FAILPOINT_POWER_LOSS

    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    reg_addr, port, data_dir, reg, status_server, client, upstream = _one_pump_rig(procs, tmp_path)
    addr = f"127.0.0.1:{port}"
    first = reg.get_ts()
    # What readers were served before the crash: windows [first, read_to) pulled as the safe ts moved.
    before: list[tuple[int, int]] = []
    read_to = [first]
    safe_seen: list[int] = []
    watching = threading.Event()

    def read_as_served() -> None:
        while not watching.wait(0.02):
            with contextlib.suppress(Exception):
                safe = status(addr, timeout=0.5).safe_ts
                safe_seen.append(safe)
                if safe > read_to[0]:
                    before.extend((b.commit_ts, b.start_ts) for b in pull(addr, read_to[0], safe))
                    read_to[0] = safe

    watcher = threading.Thread(target=read_as_served)
    # Late enough for windows to be read before the crash, even on a quiet machine.
    nth = rng.randint(200, 500)
    # The leader stalls 200 ms at the failpoint: the cut group's acknowledgements reach
    # the writers, then the unsynced tail is cut and the process dies.
    svc, _ = procs.pump(reg_addr, data_dir, "c1", port, env={failpoint.ENV: f"{FAILPOINT_POWER_LOSS}:exit:{nth}:200"})
    try:
        upstream.start()
        watcher.start()
        wait_until(lambda: not svc.alive, timeout=60, interval=0.02,
                   what=f"the failpoint at unsynced commit group {nth} to crash the pump")
        assert svc.proc is not None and svc.proc.returncode == 137, svc.log_text()[-2000:]
        watching.set()
        watcher.join()
        with upstream.lock:
            acked_before_crash = len(upstream.acked)
        svc, _ = procs.pump(reg_addr, data_dir, "c1", port)
        watching.clear()
        time.sleep(0.5)
        upstream.finish()
    finally:
        upstream.stop.set()
        watching.set()
        client.close()

    try:
        assert upstream.crashes == []
        assert acked_before_crash > 20, "the writers made too little progress"
        last_commit = max(upstream.committed.values())
        wait_safe(addr, last_commit + 1, timeout=30)
        assert status(addr).pending_txns == 0
        # The power loss took acknowledged commits; TxnStatus gave them back.
        resolved = svc.log_text().count("resolved missing commit")
        assert resolved >= 1, svc.log_text()[-2000:]
        # Only fsynced records move the safe ts: the restart never finds it lower.
        safe_seen.append(status(addr).safe_ts)
        assert all(a <= b for a, b in zip(safe_seen, safe_seen[1:], strict=False)), "the safe ts moved back"
        _assert_served_once_as_committed(addr, upstream, first, last_commit + 1)
        # Nothing served before the crash rested on a record the power loss took.
        assert len(before) > 0
        assert [(b.commit_ts, b.start_ts) for b in pull(addr, first, read_to[0])] == before
    finally:
        status_server.stop(0.2)
        reg.close()
