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


def test_the_pump_bench_starts_its_cluster_again_on_other_ports(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """The bench picks its ports free before the processes start, so another
    process may take one meanwhile: the registry's port is taken here before its
    first start; the bench starts a whole cluster again on new ports."""
    import socket
    import sys

    from binlake.cli import benchmarks
    from binlake.testing import devcluster

    monkeypatch.setattr(sys, "path", list(sys.path))  # the bench module puts bench/ on the path
    pump_bench = benchmarks.bench_module("pump")
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    picks = iter([taken])
    real_free_port = devcluster.free_port
    monkeypatch.setattr(devcluster, "free_port", lambda host="127.0.0.1": next(picks, None) or real_free_port(host))
    try:
        cluster, metrics_addr = pump_bench.start_cluster(tmp_path / "new-1024", 1, {})
        try:
            assert cluster.registry_addr != f"127.0.0.1:{taken}"
            assert cluster.pumps["pump1"].alive
            assert cluster.root == tmp_path / "new-1024-2"
        finally:
            cluster.stop()
    finally:
        squatter.close()
    assert "registry did not come up: registry exited" in capsys.readouterr().out
