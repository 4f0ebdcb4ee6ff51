"""Shared fixtures: a registry, Pumps, the writer's status server, child processes,
and the test run's one SparkSession.

The helpers behind them (binlog builders, free ports, waiting, process
control) live in ``pumpkit.py`` so test modules can import them directly.
"""

from __future__ import annotations

import atexit
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from dbfixtures import shared_mariadb_server, shared_postgres_server  # noqa: F401  (one server each per run)
from pumpkit import Processes, PumpFactory, Upstream, register_writer, start_registry

from binlake.registry.client import RegistryClient
from binlake.registry.server import RegistryServer
from binlake.testing.netbed import NetBed
from binlake.writer.txn_status import MemoryStatusProvider, TxnStatusServer

if TYPE_CHECKING:
    # pyspark is imported when a test first asks for ``spark``: suites without
    # Spark (unit, grpc) do not pay for it.
    from pyspark.sql import SparkSession

# Spark applications the tests start as child processes (spark-submit from the
# ingest DAG, ``binlake apply``/``ingest`` subprocesses, jobs/ingest.py) read
# spark-defaults.conf from SPARK_CONF_DIR: sized like the in-process session
# below, since Spark's defaults (200 shuffle partitions, 50 Delta snapshot
# partitions) and the full JIT of a JVM that lives for one tiny job make each
# such run take minutes on two cores (C1 only and the serial GC halve its start).
# Confs an application sets itself (binlake's LAKE_CONF) still win. Set at import,
# before any test starts a child, and pinned: a developer's own Spark
# configuration never reaches the tests.
CHILD_SPARK_CONF_DIR = pathlib.Path(tempfile.mkdtemp(prefix="binlake-test-spark-conf-"))
atexit.register(shutil.rmtree, CHILD_SPARK_CONF_DIR, ignore_errors=True)
(CHILD_SPARK_CONF_DIR / "spark-defaults.conf").write_text(
    "spark.sql.shuffle.partitions 2\n"
    "spark.databricks.delta.snapshotPartitions 2\n"
    "spark.ui.enabled false\n"
    "spark.driver.extraJavaOptions -XX:+UseSerialGC -XX:TieredStopAtLevel=1\n")
os.environ["SPARK_CONF_DIR"] = str(CHILD_SPARK_CONF_DIR)

# The settings of every test Spark session. Two cores and two shuffle partitions
# keep small jobs fast while still running more than one task per stage; Delta
# rebuilds a table's snapshot with 50 tasks by default, which dominates the run
# time of tiny test tables (about 9 s vs 1.5 s a read).
SPARK_TEST_CONF = {"spark.databricks.delta.snapshotPartitions": "2"}


@pytest.fixture(autouse=True)
def _settings_of_one_test() -> Iterator[None]:
    """What a test made this process's configuration (a command's --config, the DAGs'
    S3 Connection as a source, settings exported to children) ends with it."""
    yield
    from binlake import config

    config.reset()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Delta-enabled session for the whole pytest process, whatever the
    directories run: a JVM start and a Delta session build cost 15-30 s on two
    loaded cores, so every suite (spark, dags, replicate, restore) reuses this one.
    Code under test that calls ``build_spark`` (Airflow tasks run in-process by
    ``dag.test``, the CLI's handlers) gets it too, through ``getOrCreate``."""
    from binlake.lake.sparkenv.session import build_spark

    # This JVM lives for the whole run: it keeps the full JIT, so it is started
    # without the children's spark-defaults.conf (pyspark launches it through
    # spark-submit, which would read it).
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SPARK_CONF_DIR", raising=False)
        session = build_spark("binlake-tests", "local[2]", ui=False, shuffle_partitions=2,
                              extra_conf=SPARK_TEST_CONF)
    yield session
    session.stop()


@pytest.fixture
def bed(request: pytest.FixtureRequest) -> Iterator[NetBed]:
    """The multi-host test bed: as many hosts (network namespaces) as the test's
    ``hosts(n)`` mark asks for; the test is skipped where namespaces cannot be made."""
    mark = request.node.get_closest_marker("hosts")
    if mark is None or not mark.args or not isinstance(mark.args[0], int):
        raise pytest.UsageError(f"{request.node.nodeid} uses `bed` without a pytest.mark.hosts(n) mark")
    why = NetBed.probe()
    if why:
        pytest.skip(f"multi-host test bed unavailable: {why}")
    with NetBed(mark.args[0]) as b:
        yield b


@pytest.fixture
def registry(tmp_path: pathlib.Path) -> Iterator[RegistryServer]:
    """An in-process registry on a loopback port (``.addr``)."""
    server = start_registry(tmp_path / "registry")
    yield server
    server.stop(grace=0.5)


@pytest.fixture
def reg(registry: RegistryServer) -> Iterator[RegistryClient]:
    with RegistryClient(registry.addr) as client:
        yield client


@pytest.fixture
def upstream(reg: RegistryClient) -> Iterator[Upstream]:
    """A TxnStatus server over a MemoryStatusProvider, registered as writer ``w1``."""
    provider = MemoryStatusProvider()
    server = TxnStatusServer(provider).start()
    register_writer(reg, server.addr)
    yield Upstream(provider, server)
    server.stop(grace=0.2)


@pytest.fixture
def pump_factory(registry: RegistryServer, tmp_path: pathlib.Path) -> Iterator[PumpFactory]:
    """Starts in-process Pumps (``.start(node_id, **settings)``); stops them before the registry."""
    factory = PumpFactory(registry.addr, tmp_path / "pumps")
    yield factory
    factory.stop_all()


@pytest.fixture
def procs(tmp_path: pathlib.Path) -> Iterator[Processes]:
    """Registry and Pump child processes; whatever is still running is stopped at teardown."""
    p = Processes(tmp_path / "procs")
    yield p
    p.cleanup()
