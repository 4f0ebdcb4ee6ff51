"""Demo act 7: replicated Pumps. Every binlog is kept on two Pumps
(`binlake ctl replication --replicas 2`), writers run, and one Pump's host is
lost for good: kill -9 and its data directory deleted. The writers go on
without a failure, the window over the whole run is served by the two Pumps
left without waiting for the dead one, and every acknowledged transaction is
in it, once."""

from __future__ import annotations

import pathlib
import shutil
import threading
import time

from binlake import errors
from binlake.client.pump_client import PumpClient
from binlake.client.reader import pull_window
from binlake.config import ClientSettings
from binlake.lake.pump_check import plan_read
from binlake.proto import binlog_pb2 as bp
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeRecord
from binlake.source.txn_status import MemoryStatusProvider, TxnStatusServer
from binlake.testing.devcluster import DevCluster

WRITERS = 4
VICTIM = "pump3"


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def act_replicas(cluster: DevCluster, root: pathlib.Path) -> int:
    provider = MemoryStatusProvider()
    status = TxnStatusServer(provider).start()
    reg = RegistryClient(cluster.registry_addr)
    try:
        reg.register(NodeRecord(node_id="demo-writer-r2", kind="writer", addr=status.addr))
        history = reg.set_replication(2, 2, 500)
        say(f"act 7: replicas=2 min_acks=2 from TSO {history[-1].from_ts} (binlake ctl replication --replicas 2)")
        while reg.get_ts() <= history[-1].from_ts:
            time.sleep(0.05)
        client = PumpClient(settings=ClientSettings(registry=cluster.registry_addr, probe_interval_s=0.5,
                                                    refresh_interval_s=0.3, write_timeout_s=3.0,
                                                    max_failures=1))
        acked: dict[int, int] = {}
        failed: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()

        def writer(w: int) -> None:
            while not stop.is_set():
                start_ts = reg.get_ts()
                value = bp.PrewriteValue(mutations=[bp.TableMutation(
                    table_id=7, inserted_rows=[f"r2-{w}-{start_ts}".encode()], sequence=[bp.INSERT])])
                try:
                    placement = client.write_prewrite(bp.Binlog(
                        tp=bp.PREWRITE, start_ts=start_ts, prewrite_key=b"demo-writer-r2",
                        prewrite_value=value.SerializeToString()))
                except errors.BinlakeError as exc:
                    failed.append(str(exc))
                    provider.set_rolled_back(start_ts)
                    continue
                commit_ts = reg.get_ts()
                provider.set_committed(start_ts, commit_ts)
                try:
                    client.write_commit(bp.Binlog(tp=bp.COMMIT, start_ts=start_ts, commit_ts=commit_ts), placement)
                except errors.BinlakeError as exc:
                    failed.append(str(exc))
                    continue
                with lock:
                    acked[start_ts] = commit_ts

        first = reg.get_ts()
        threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(WRITERS)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        before = len(acked)
        say(f"{before} transactions acknowledged, each on two pumps; kill -9 {VICTIM} and delete its data directory")
        cluster.kill9(VICTIM)
        shutil.rmtree(root / VICTIM, ignore_errors=True)
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join()
        client.close()
        end = max(acked.values()) + 1
        began = time.monotonic()
        plan = None
        while plan is None:
            try:
                plan = plan_read(cluster.registry_addr, first, end, min_acks=2)
            except (errors.FailedPrecondition, errors.Unavailable):
                if time.monotonic() - began > 30:
                    raise
                time.sleep(0.1)
        waited = time.monotonic() - began
        served = {b.start_ts: b.commit_ts for b in pull_window(plan.addrs, first, end)}
        lost = [s for s, c in acked.items() if served.get(s) != c]
        say(f"{len(acked) - before} more acknowledged after the loss; {len(failed)} failed; the window over the "
            f"run was ready in {waited:.2f}s, read from {sorted(plan.addrs)} without {VICTIM}")
        ok = not failed and not lost and VICTIM not in plan.addrs
        print("VERDICT (act 7):", "PASS - a Pump host was lost for good mid-load; no write failed, the window "
              f"was served without it and all {len(acked)} acknowledged transactions are there, once"
              if ok else f"FAIL - {len(failed)} failed writes, {len(lost)} acknowledged transactions missing")
        return 0 if ok else 1
    finally:
        status.stop(0.2)
        reg.close()
