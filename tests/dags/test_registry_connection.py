"""The Airflow Connection ``binlake_registry``: where the DAGs' tasks find a
registry group, looked up when a task runs.

- the forms a user writes (a list in the host; bare hosts with the port in the
  Connection's port; the URI ``generic://h1,h2,h3:8230``) and one clear error
  naming the Connection for a malformed list;
- precedence: Connection > Variable > environment > default;
- the ingest DAG's ``plan`` step and its ``SafeTsTrigger`` against a real
  registry group (two members on a real etcd) named only by the Connection:
  the trigger keeps waiting through the leader's loss and fires once the
  Pump's safe ts, reported through the new leader, passes the window.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from airflow.exceptions import AirflowFailException
from binlake_airflow import config, ingest_tasks
from binlake_airflow.triggers import SafeTsTrigger

from binlake import errors, tso
from binlake.config import RegistrySettings
from binlake.net import free_port
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeRecord
from binlake.registry.server import RegistryServer
from binlake.testing.etcdcluster import EtcdCluster

CONN_ENV = "AIRFLOW_CONN_BINLAKE_REGISTRY"


def _connection(mp: pytest.MonkeyPatch, host: str, port: int | None = None) -> None:
    """The Connection as Airflow reads it from the environment (JSON form)."""
    conn: dict[str, object] = {"conn_type": "generic", "host": host}
    if port is not None:
        conn["port"] = port
    mp.setenv(CONN_ENV, json.dumps(conn))


@pytest.mark.parametrize("host, port, want", [
    ("h1:8230,h2:8230,h3:8230", None, "h1:8230,h2:8230,h3:8230"),
    ("h1, h2 ,h3", 8231, "h1:8231,h2:8231,h3:8231"),
    ("h1:9000,h2", 8230, "h1:9000,h2:8230"),
    ("10.0.0.1,[::1]", 8230, "10.0.0.1:8230,[::1]:8230"),
    ("h1:8230", None, "h1:8230"),
])
def test_connection_forms(host: str, port: int | None, want: str) -> None:
    assert config.registry_from_connection(host, port) == want


@pytest.mark.parametrize("host, port, error", [
    ("", None, "has no host"),
    ("h1,h2", None, "h1"),
    ("h1:8230;h2:8230", None, "separate HOST:PORTs with commas"),
    ("h1:8230,,h2:8230", None, "entry 2 is empty"),
    ("h1", 70000, "not a TCP port"),
])
def test_malformed_connection_names_it(host: str, port: int | None, error: str) -> None:
    with pytest.raises(errors.ConfigError) as info:
        config.registry_from_connection(host, port)
    message = str(info.value)
    assert message.startswith("Airflow Connection binlake_registry") and error in message
    assert "\n" not in message


def test_precedence_connection_variable_env_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (CONN_ENV, "AIRFLOW_VAR_BINLAKE_REGISTRY", "BINLAKE_REGISTRY", "BINLAKE_CLIENT_REGISTRY"):
        monkeypatch.delenv(name, raising=False)
    assert config.registry_addr() == "127.0.0.1:8230"
    monkeypatch.setenv("BINLAKE_REGISTRY", "env1:8230,env2:8230")
    assert config.registry_addr() == "env1:8230,env2:8230"
    monkeypatch.setenv("AIRFLOW_VAR_BINLAKE_REGISTRY", "var1:8230")
    assert config.registry_addr() == "var1:8230"
    # The URI form: hosts in the host part, one port for all.
    monkeypatch.setenv(CONN_ENV, "generic://c1,c2,c3:8230")
    assert config.registry_addr() == "c1:8230,c2:8230,c3:8230"
    # Read on every call (no caching across runs): removing it falls back.
    monkeypatch.delenv(CONN_ENV)
    assert config.registry_addr() == "var1:8230"
    # A malformed Connection is an error, not a silent fall back to the Variable.
    _connection(monkeypatch, "c1:8230;c2:8230")
    with pytest.raises(errors.ConfigError, match="^Airflow Connection binlake_registry: "):
        config.registry_addr()
    # ... and fails the plan step at once (no retry can fix it), naming the Connection.
    end = dt.datetime.now(dt.UTC)
    with pytest.raises(AirflowFailException, match="Airflow Connection binlake_registry"):
        ingest_tasks.plan(end - dt.timedelta(minutes=5), end)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RegistryServer]]:
    if not EtcdCluster.available():
        pytest.skip("etcd is not installed (apt-get install etcd-server)")
    etcd = EtcdCluster(tmp_path_factory.mktemp("etcd"), 1).start()
    servers = [RegistryServer(RegistrySettings(addr=f"127.0.0.1:{free_port()}", store=etcd.url("/conn-test")))
               .start() for _ in range(2)]
    try:
        yield servers
    finally:
        for s in servers:
            s.stop(grace=0.2)
        etcd.stop()


def run_trigger(trigger: SafeTsTrigger, after: float, then: Callable[[], None],
                timeout: float) -> tuple[dict[str, Any], float]:
    """The trigger's first event and how long it took; ``then`` runs in a thread ``after`` seconds in."""

    async def main() -> tuple[dict[str, Any], float]:
        started = time.monotonic()

        async def later() -> None:
            await asyncio.sleep(after)
            await asyncio.to_thread(then)

        side = asyncio.create_task(later())
        events = trigger.run()
        try:
            event = await asyncio.wait_for(events.__anext__(), timeout)
        finally:
            await events.aclose()
            await side
        return event.payload, time.monotonic() - started

    return asyncio.run(main())


def _leader(servers: list[RegistryServer], timeout: float = 15.0) -> RegistryServer:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leaders = [s for s in servers if s.election is not None and s.election.is_leader()]
        if leaders:
            return leaders[0]
        time.sleep(0.05)
    raise AssertionError("no registry leader elected")


def test_plan_and_trigger_follow_the_group_named_by_the_connection(
    group: list[RegistryServer], monkeypatch: pytest.MonkeyPatch,
) -> None:
    leader = _leader(group)
    follower = next(s for s in group if s is not leader)
    # The follower first: the tasks must find the leader themselves.
    _connection(monkeypatch, f"{follower.addr},{leader.addr}")
    monkeypatch.setenv("BINLAKE_REGISTRY", "127.0.0.1:1")  # loses to the Connection
    monkeypatch.setenv("BINLAKE_INGEST_MODE", "inprocess")

    end = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=30)
    start = end - dt.timedelta(minutes=5)
    end_ts = tso.from_datetime(end)
    with RegistryClient(f"{follower.addr},{leader.addr}") as reg:
        stored = reg.register(NodeRecord(node_id="pump1", kind="pump", addr="127.0.0.1:9"))
        reg.heartbeat(dataclasses.replace(stored, safe_ts=tso.from_datetime(start) + 1))

        window = ingest_tasks.plan(start, end)
        assert window["registry"] == f"{follower.addr},{leader.addr}"
        assert window["pumps"] == ["pump1"]

        def failover_then_close() -> None:
            # The leader goes while the trigger waits; the Pump's next report,
            # through the new leader, closes the window.
            leader.stop(grace=0.2)
            _leader([follower])
            reg.heartbeat(dataclasses.replace(reg.get_node("pump1"), safe_ts=end_ts))

        trigger = SafeTsTrigger(window["registry"], window["start_ts"], window["end_ts"], window["pumps"],
                                poll_interval=0.1)
        event, took = run_trigger(trigger, after=0.5, then=failover_then_close, timeout=30)
    assert event["status"] == "ready" and event["safe_ts"] == {"pump1": end_ts}
    assert took >= 0.5
