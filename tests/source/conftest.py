"""Fixtures of the source tests: a MariaDB with its row binlog on and a PostgreSQL
with logical decoding on (one per test module), and a registry with one Pump
(one per test)."""

from __future__ import annotations

import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from srckit import Cluster, start_cluster

from binlake.stack.localdb import LocalMariaDB, LocalPostgres


@pytest.fixture(scope="module")
def mdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMariaDB]:
    server = LocalMariaDB(tmp_path_factory.mktemp("mdb-binlog"), binlog=True, server_id=1).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pg() -> Iterator[LocalPostgres]:
    """A PostgreSQL with wal_level=logical (the run's shared server has it off)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="binlake-test-pglogical-"))
    root.chmod(0o755)  # the server runs as user postgres when we are root
    server = LocalPostgres(root, logical=True).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[Cluster]:
    reg, pump = start_cluster(tmp_path)
    try:
        yield Cluster(reg, pump)
    finally:
        pump.stop(grace=0.5)
        reg.stop(grace=0.5)
