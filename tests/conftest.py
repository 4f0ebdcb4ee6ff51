"""Shared fixtures: a registry, Pumps, the writer's status server, child processes.

The helpers behind them (binlog builders, free ports, waiting, process
control) live in ``pumpkit.py`` so test modules can import them directly.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
from pumpkit import Processes, PumpFactory, Upstream, register_writer, start_registry

from binlake.registry.client import RegistryClient
from binlake.registry.server import RegistryServer
from binlake.source.txn_status import MemoryStatusProvider, TxnStatusServer


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
