"""``binlake workload`` against a real cluster (registry and two Pumps as
processes) and a SQLite upstream: every committed transaction (DDL included)
is readable from the Pumps, the bank total never moves, with one client the
same seed gives the same data, and a run in another thread stops when told."""

from __future__ import annotations

import json
import pathlib
import threading
from collections.abc import Iterator

import pytest

from binlake import cli
from binlake.client.reader import pull_window
from binlake.sql import checksum
from binlake.testing.devcluster import DevCluster
from binlake.workload import ops as wops
from binlake.workload import plan as wplan
from binlake.workload import run as wrun
from binlake.writer.txn_writer import TxnWriter

ARGS = ["--profile", "mixed", "--txns", "300", "--tables", "2", "--seed", "7", "--large-txn-rows", "300",
        "--large-txn-every", "100", "--table-rows", "200", "--accounts", "50"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    root = tmp_path_factory.mktemp("cluster")
    with DevCluster(root, pumps=2,
                    pump_args=["--stop-write-at-free-bytes", "0", "--fake-binlog-interval-s", "0.5"]) as c:
        yield c


def test_workload_cli_every_commit_reaches_the_pumps(
    cluster: DevCluster, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'upstream.db'}"
    rc = cli.main(["--log-level", "WARNING", "workload", "--registry", cluster.registry_addr, "--upstream", url,
                   "--clients", "4", "--quiet", "--json", *ARGS])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    planned = len(wplan.plan("mixed", 2, 300, 7, large_txn_rows=300, large_txn_every=100, table_rows=200,
                             accounts=50))
    assert summary["planned"] == summary["done"] == planned
    assert summary["errors"] == 0, summary["error_messages"]
    assert summary["ddls"] >= 3 + 4  # three CREATE TABLEs, then a DDL every ~50
    assert summary["committed"] + summary["empty"] + summary["ddls"] == planned
    assert summary["inserts"] > 1000 and summary["updates"] > 100 and summary["deletes"] > 100
    assert wrun.bank_total(url) == 50 * wops.BANK_INITIAL_BALANCE

    binlogs = list(pull_window(cluster.pump_addrs, summary["start_ts"], summary["end_ts"], wait=True))
    assert len(binlogs) == summary["transactions"]
    assert sum(1 for b in binlogs if b.ddl_query) == summary["ddls"]
    assert [b.commit_ts for b in binlogs] == sorted(b.commit_ts for b in binlogs)

    # The same upstream again: the workload refuses (its tables exist) with a clear message.
    rc = cli.main(["--log-level", "WARNING", "workload", "--registry", cluster.registry_addr, "--upstream", url,
                   "--clients", "1", "--quiet", *ARGS])
    assert rc == 2
    assert "already has table" in capsys.readouterr().err


def test_same_seed_one_client_same_data(cluster: DevCluster, tmp_path: pathlib.Path) -> None:
    plan = wplan.plan("mixed", 2, 300, 7, large_txn_rows=300, large_txn_every=100, table_rows=200, accounts=50)
    sums = []
    for name in ("a.db", "b.db"):
        url = f"sqlite:///{tmp_path / name}"
        with TxnWriter(url, registry=cluster.registry_addr) as writer:
            summary = wrun.run(writer, plan, clients=1, progress=False)
        assert summary.errors == 0, summary.error_messages
        assert summary.empty == 0  # in plan order every operation finds its row
        sums.append(checksum.checksum(url))
        assert wrun.bank_total(url) == 50 * wops.BANK_INITIAL_BALANCE
    assert sums[0] == sums[1]
    assert set(sums[0]) >= {"accounts"} and len(sums[0]) >= 3
    assert all(rows > 0 for rows, _ in sums[0].values())


def test_a_stop_event_ends_a_run_after_the_transactions_in_flight(cluster: DevCluster, tmp_path: pathlib.Path) -> None:
    """A run in another thread (which Ctrl-C never reaches) stops once its stop event is
    set: no transaction starts after it, each one that ran is whole (the bank total holds,
    every one that wrote a binlog is in the Pumps), and the summary says interrupted."""
    plan = wplan.plan("mixed", 2, 300, 7, large_txn_rows=300, large_txn_every=100, table_rows=200, accounts=50)
    url = f"sqlite:///{tmp_path / 'stopped.db'}"
    stop = threading.Event()
    with TxnWriter(url, registry=cluster.registry_addr) as writer:
        # 20 transactions/s: the plan would take 15 s; stopped after one.
        timer = threading.Timer(1.0, stop.set)
        timer.start()
        try:
            summary = wrun.run(writer, plan, clients=2, rate=20, progress=False, stop=stop)
        finally:
            timer.cancel()
        with pytest.raises(TypeError, match="threading.Event"):
            wrun.run(writer, plan, progress=False, stop=True)  # type: ignore[arg-type]
    assert summary.interrupted and 0 < summary.done < len(plan) // 2, summary
    assert summary.errors == 0 and summary.done == summary.committed + summary.empty + summary.ddls
    assert wrun.bank_total(url) == 50 * wops.BANK_INITIAL_BALANCE
    binlogs = list(pull_window(cluster.pump_addrs, summary.start_ts, summary.end_ts, wait=True))
    assert len(binlogs) == summary.transactions
