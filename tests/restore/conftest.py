"""Fixtures for point-in-time tests: an upstream whose real state was captured at
known commit_ts values while a workload ran (the Spark session is the test run's
one, from tests/conftest.py).

The truth is the upstream itself: the workload runs in slices; between two
slices every writer is idle (quiesced), a TSO is taken (``ctl ts``'s call) and
the upstream's checksums and a copy of its file are kept. Every transaction of
the earlier slices committed below that TSO and every later one above it.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from pumpkit import wait_cluster_safe
from pyspark.sql import SparkSession

from binlake.lake import ingest
from binlake.sql import checksum
from binlake.testing.devcluster import DevCluster
from binlake.workload import ops as wops
from binlake.workload import run as wrun
from binlake.writer.txn_writer import TxnWriter

PUMP_ARGS = ["--stop-write-at-free-bytes", "0", "--fake-binlog-interval-s", "0.3"]


@dataclasses.dataclass
class Capture:
    """The upstream's state once every transaction with commit_ts <= ts had committed."""

    ts: int
    checksums: dict[str, tuple[int, str]]
    copy: pathlib.Path | None
    bank_total: Any = None
    accounts: int = 0


@dataclasses.dataclass
class Upstream:
    url: str
    registry: str
    start_ts: int
    end_ts: int
    captures: list[Capture]
    commit_ts: list[int]  # every commit_ts the workload made


def bank_state(url: str) -> tuple[Any, int]:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(wops.BANK_TABLE):
                return None, 0
            # Balances are decimals stored as text in SQLite: sum them exactly in Python.
            from decimal import Decimal

            rows = conn.execute(sa.text(f"SELECT balance FROM {wops.BANK_TABLE}")).all()
            return sum((Decimal(str(r[0])) for r in rows), Decimal(0)), len(rows)
    finally:
        engine.dispose()


def run_captured(url: str, registry: str, plan: list[wops.LogicalTxn], cuts: int, copies: pathlib.Path | None,
                 clients: int = 2, at: list[int] | None = None) -> Upstream:
    """Run ``plan`` in ``cuts`` slices, capturing the upstream after each (``at``: the
    indexes where the slices end instead, before the last)."""
    from binlake.registry.client import RegistryClient

    captures: list[Capture] = []
    n = len(plan)
    bounds = [0, *at, n] if at else [round(i * n / cuts) for i in range(cuts + 1)]
    start_ts = end_ts = 0
    with TxnWriter(url, registry=registry) as writer, RegistryClient(registry) as reg:
        for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
            summary = wrun.run(writer, plan[a:b], clients=clients, progress=False)
            assert summary.errors == 0, summary.error_messages
            start_ts = start_ts or summary.start_ts
            ts = reg.get_ts()  # every writer is idle: all committed so far are below ts
            copy = None
            if copies is not None and url.startswith("sqlite:///"):
                copy = copies / f"cut{i}.db"
                # SQLite's online backup, not a file copy: the upstream runs in WAL mode,
                # and its newest commits may still be in the -wal file.
                src = sqlite3.connect(url.removeprefix("sqlite:///"))
                dst = sqlite3.connect(copy)
                src.backup(dst)
                src.close()
                dst.close()
            total, accounts = bank_state(url)
            captures.append(Capture(ts, checksum.checksum(url), copy, total, accounts))
        end_ts = reg.get_ts()
    wait_cluster_safe(registry, end_ts)
    return Upstream(url, registry, start_ts, end_ts, captures, [])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    with DevCluster(tmp_path_factory.mktemp("cluster"), pumps=2, pump_args=PUMP_ARGS) as c:
        yield c


def ingest_all(spark: SparkSession, lake: str, registry: str, bounds: list[int]) -> list[ingest.IngestResult]:
    return [ingest.ingest_window(spark, lake, registry, a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
