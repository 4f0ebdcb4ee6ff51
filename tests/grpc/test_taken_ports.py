"""Servers on a taken port: binlake's gRPC servers refuse to bind beside
another listener (gRPC's default SO_REUSEPORT is off), so two Pumps started at
once on one address cannot both come up; and the dev cluster (registry and
Pumps as processes, used by benchmarks and tests) says at once which process
exited, and leaves none behind."""

from __future__ import annotations

import pathlib
import time

import pytest

from binlake import errors, rpc
from binlake.testing.devcluster import DevCluster


def test_a_server_does_not_bind_beside_a_listener() -> None:
    first = rpc.create_server(1, "first")
    port = first.add_insecure_port("127.0.0.1:0")
    first.start()
    try:
        second = rpc.create_server(1, "second")
        # Past add_port's own check (both started at once pass it): the bind must refuse.
        with pytest.raises(RuntimeError):
            second.add_insecure_port(f"127.0.0.1:{port}")
    finally:
        first.stop(None).wait()


def test_two_pumps_started_at_once_on_one_address(tmp_path: pathlib.Path) -> None:
    """pump2 is given pump1's address and both start together: one of them takes
    the port, the other exits (address in use); the start fails naming it, at
    once, and stops the registry and the Pump that came up."""
    cluster = DevCluster(tmp_path, pumps=2)
    cluster.pumps["pump2"].args[cluster.pumps["pump2"].args.index("--addr") + 1] = cluster.pump_addrs["pump1"]
    cluster.pump_addrs["pump2"] = cluster.pump_addrs["pump1"]
    began = time.monotonic()
    with pytest.raises(errors.Unavailable, match=r"pump[12] exited \(code 2\)"):
        cluster.start(timeout=120)
    # Not the start timeout: a process that exited is not waited for.
    assert time.monotonic() - began < 60
    assert not cluster.registry.alive
    assert not any(svc.alive for svc in cluster.pumps.values())
