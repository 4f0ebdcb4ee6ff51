"""Demo act 7: replicated Pumps. Every binlog is kept on two Pumps
(`binlake ctl replication --replicas 2`), a TxnWriter workload runs against a
SQLite upstream, and one Pump's host is lost for good mid-load: kill -9 and
its data directory deleted. The workload finishes without a failed
transaction, the window over the whole run is served by the two Pumps left
without waiting for the dead one, every transaction is in it once, and the
lake goes on: that window is ingested into a Delta lake (``ingest_window``,
what ``binlake ingest`` runs, in a child process with one Spark session) while
the Pump is still dead, and holds exactly the workload's row changes. The demo
says how long the window waited to be ready and how long its ingest took.

The lake's first window is ingested before the loss, while every Pump is up:
a lake that starts later reads the DDLs of everything before its first window
from the Pumps, and those written with one copy (acts 1 to 6) may have lived
only on the lost host. From its first window on, the lake needs no lost Pump.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

from binlake import errors
from binlake.client.reader import pull_window
from binlake.lake.pumps.pump_check import plan_read
from binlake.registry.client import RegistryClient
from binlake.registry.replicas import min_acks_for_window
from binlake.testing.devcluster import DevCluster

VICTIM = "pump3"
# The longest a transaction runs (``[client] txn_lookback_s``): the demo's Pumps
# resolve a prewrite after 3 s (``--txn-timeout-s 3``), so a window starting this
# long after ``replicas=2 min_acks=2`` took effect is read with W = 2.
LOOKBACK_S = 3


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Ingester:
    """A child process with one Spark session that ingests windows on request (what
    ``binlake ingest`` runs, ``lake.ingest.ingest_window``), so Spark starts once, while
    the act sets up, not once per window. Spark's own output goes to ``log``."""

    def __init__(self, registry: str, lake: pathlib.Path, log: pathlib.Path) -> None:
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--ingest", registry, str(lake)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, text=True,
            env={**os.environ, "BINLAKE_CLIENT_TXN_LOOKBACK_S": str(LOOKBACK_S)})

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(_MARK):
                answer: dict[str, Any] = json.loads(line[len(_MARK):])
                return answer
        return {"error": f"the ingest process ended (exit {self.proc.wait()}); see {self._log.name}"}

    def ingest(self, start: int, end: int) -> tuple[dict[str, Any] | None, float]:
        """Ingest ``[start, end)``: (the IngestResult as a dict, or None, seconds)."""
        assert self.proc.stdin is not None
        began = time.monotonic()
        self.proc.stdin.write(f"{start} {end}\n")
        self.proc.stdin.flush()
        answer = self._answer()
        took = time.monotonic() - began
        if "error" in answer:
            say(f"FAILED: the ingest of [{start}, {end}): {answer['error']}")
            return None, took
        return answer, took

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


_MARK = "ACT7 "


def _ingest_child(registry: str, lake: str) -> int:
    """The Ingester's process: one line ``START END`` in, one marked JSON line out."""
    from binlake.lake import ingest
    from binlake.lake.sparkenv.session import LAKE_CONF, build_spark

    spark = build_spark("binlake-demo-act7", "local[2]", shuffle_partitions=2, extra_conf=LAKE_CONF)
    for line in sys.stdin:
        start, end = (int(v) for v in line.split())
        try:
            out = ingest.ingest_window(spark, lake, registry, start, end).to_dict()
        except Exception as exc:  # reported by the parent
            out = {"error": f"{type(exc).__name__}: {exc}"}
        print(_MARK + json.dumps(out), flush=True)
    spark.stop()
    return 0


def act_replicas(cluster: DevCluster, root: pathlib.Path) -> int:
    from binlake.workload import plan as wplan
    from binlake.workload import run as wrun
    from binlake.writer.txn_writer import TxnWriter

    reg = RegistryClient(cluster.registry_addr)
    ingester: Ingester | None = None
    try:
        history = reg.set_replication(2, 2, 500)
        from_ts = history[-1].from_ts
        say(f"act 7: replicas=2 min_acks=2 from TSO {from_ts} (binlake ctl replication --replicas 2)")
        while reg.get_ts() <= from_ts:
            time.sleep(0.05)
        lake = root / "lake7"
        ingester = Ingester(cluster.registry_addr, lake, root / "act7-spark.log")
        first = reg.get_ts()
        time.sleep(LOOKBACK_S)
        start = reg.get_ts()
        say(f"the lake's first window [{first}, {start}), ingested while every Pump is up: {lake}")
        result, took = ingester.ingest(first, start)
        if result is None:
            return 1
        say(f"  ingested in {took:.0f}s (Spark's start included)")

        upstream = f"sqlite:///{root}/upstream7.db"
        txns = wplan.plan("mixed", tables=2, txns=200, seed=7, large_txn_rows=50, large_txn_every=100,
                          table_rows=40, accounts=10)
        say(f"workload 'mixed', {len(txns)} transactions at 40/s, 2 clients, through TxnWriter -> {upstream}")
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                with TxnWriter(upstream, registry=cluster.registry_addr) as writer:
                    outcome["summary"] = wrun.run(writer, txns, clients=2, rate=40, progress=False)
                    writer.flush()
            except BaseException as exc:  # reported below
                outcome["error"] = exc

        thread = threading.Thread(target=run, name="act7-workload", daemon=True)
        thread.start()
        time.sleep(2.0)
        say(f"mid-load: kill -9 {VICTIM} and delete its data directory")
        cluster.kill9(VICTIM)
        shutil.rmtree(root / VICTIM, ignore_errors=True)
        thread.join(timeout=120)
        end = reg.get_ts()
        summary = outcome.get("summary")
        if summary is None:
            say(f"FAILED: the workload did not finish: {outcome.get('error', 'still running after 120 s')}")
            return 1
        # The readiness rule the ingest DAG's wait step uses (window.py): W = 2, so one
        # unreachable Pump is left out; timed from the window's end.
        acks = min_acks_for_window(reg.get_replication(), start, end, lookback_ms=LOOKBACK_S * 1000)
        began = time.monotonic()
        plan = None
        while plan is None:
            try:
                plan = plan_read(cluster.registry_addr, start, end, min_acks=acks)
            except (errors.FailedPrecondition, errors.Unavailable):
                if time.monotonic() - began > 60:
                    say("FAILED: the window was not ready within 60 s")
                    return 1
                time.sleep(0.05)
        waited = time.monotonic() - began
        served = [b.start_ts for b in pull_window(plan.addrs, start, end)]
        once = len(served) == len(set(served)) == summary.transactions
        say(f"workload done: {summary.transactions} transactions, {summary.errors} failed; the window over the "
            f"run (W = {acks}) was ready {waited:.2f}s after it closed, from {', '.join(sorted(plan.addrs))}: "
            f"{len(served)} transactions served")
        result, took = ingester.ingest(start, end)
        if result is None:
            return 1
        made = summary.inserts + summary.updates + summary.deletes
        say(f"  ingested with {VICTIM} dead in {took:.1f}s, from "
            f"{', '.join(result['pumps'])}: {result['txns']} transactions, {result['rows']} row changes "
            f"({made} made by the workload), {result['ddls']} DDLs ({summary.ddls}), {result['duplicates']} "
            "second copies dropped")
        lake_ok = (VICTIM not in result["pumps"] and result["rows"] == made and result["ddls"] == summary.ddls
                   and result["txns"] == summary.transactions)
        ok = summary.errors == 0 and acks == 2 and once and VICTIM not in plan.addrs and lake_ok
        print("VERDICT (act 7):", "PASS - a Pump host was lost for good mid-load; no transaction failed, the "
              f"window was ready in {waited:.2f}s without it, all {summary.transactions} transactions are in it "
              "once, and the lake ingested it with exactly the workload's row changes" if ok else
              f"FAIL - {summary.errors} failed transactions, {len(served)} served of {summary.transactions}, "
              f"lake rows {result['rows']} of {made}")
        return 0 if ok else 1
    finally:
        if ingester is not None:
            ingester.close()
        reg.close()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--ingest":
        sys.exit(_ingest_child(sys.argv[2], sys.argv[3]))
    sys.exit(f"usage: {sys.argv[0]} --ingest REGISTRY LAKE (run by act 7 of scripts/demo.py)")
