"""The registry over real gRPC: a RegistryServer on a free port, the RegistryClient,
status codes for bad requests, coalesced timestamps, restarts and a kill -9."""

from __future__ import annotations

import itertools
import os
import pathlib
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from binlake import errors
from binlake.config import RegistrySettings
from binlake.net import free_port
from binlake.proto import registry_pb2, registry_pb2_grpc
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeRecord, NodeState
from binlake.registry.server import RegistryServer

REPO = pathlib.Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv" / "bin" / "python"


def start_server(data_dir: pathlib.Path) -> RegistryServer:
    return RegistryServer(RegistrySettings(addr="127.0.0.1:0", data_dir=data_dir, tso_window_ms=3000)).start()


@pytest.fixture
def server(tmp_path: pathlib.Path) -> Iterator[RegistryServer]:
    srv = start_server(tmp_path / "registry")
    yield srv
    srv.stop(grace=0.5)


@pytest.fixture
def client(server: RegistryServer) -> Iterator[RegistryClient]:
    with RegistryClient(server.addr, timeout_s=5.0) as c:
        yield c


@pytest.fixture
def stub(server: RegistryServer) -> Iterator[registry_pb2_grpc.RegistryStub]:
    with grpc.insecure_channel(server.addr) as channel:
        yield registry_pb2_grpc.RegistryStub(channel)


def pump(node_id: str = "pump-1", **fields: object) -> NodeRecord:
    return NodeRecord(node_id=node_id, kind="pump", addr="127.0.0.1:8250", **fields)  # type: ignore[arg-type]


# -- the basics ----------------------------------------------------------------------------


def test_server_binds_a_free_port(server: RegistryServer) -> None:
    host, port = server.addr.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert server.wait(timeout=0.05) is False  # still serving


def test_wait_returns_when_stopped(tmp_path: pathlib.Path) -> None:
    srv = start_server(tmp_path)
    stopper = threading.Timer(0.2, srv.stop, kwargs={"grace": 0})
    stopper.start()
    assert srv.wait(timeout=10) is True
    stopper.join()
    with pytest.raises(errors.FailedPrecondition, match="not started"):
        _ = RegistryServer(RegistrySettings(addr="127.0.0.1:0", data_dir=tmp_path)).addr


def test_node_lifecycle_over_grpc(server: RegistryServer, client: RegistryClient) -> None:
    cluster_id, revision = client.cluster_info()
    assert cluster_id == server.store.cluster_id() and revision == 0

    registered = client.register(pump(metrics_addr="127.0.0.1:9100"))
    assert registered.state is NodeState.ONLINE and registered.online_ts > 0
    assert client.get_node("pump-1") == registered

    reply = client.heartbeat(pump(max_commit_ts=77, safe_ts=70, load=2.5, disk_free_bytes=1 << 40))
    assert reply.state is NodeState.ONLINE
    assert (reply.max_commit_ts, reply.safe_ts, reply.load, reply.disk_free_bytes) == (77, 70, 2.5, 1 << 40)

    client.register(NodeRecord("writer-1", "writer", "127.0.0.1:9000"))
    nodes, revision = client.list_nodes()
    assert [n.node_id for n in nodes] == ["pump-1", "writer-1"]
    assert revision == 3
    assert [n.node_id for n in client.list_nodes("writer")[0]] == ["writer-1"]

    assert client.set_state("pump-1", NodeState.PAUSING).state is NodeState.PAUSING
    # The heartbeat reply carries the operator's request to the node.
    assert client.heartbeat(pump()).state is NodeState.PAUSING
    assert client.heartbeat(pump(state=NodeState.PAUSED)).state is NodeState.PAUSED
    assert client.set_state("pump-1", NodeState.CLOSING).state is NodeState.CLOSING
    offline = client.heartbeat(pump(state=NodeState.OFFLINE))
    assert offline.state is NodeState.OFFLINE and offline.offline_ts > registered.online_ts
    assert client.set_state("writer-1", NodeState.OFFLINE).state is NodeState.OFFLINE
    assert client.cluster_info()[1] > revision


def test_get_ts_batch(client: RegistryClient) -> None:
    first = client.get_ts_batch(1000)
    assert client.get_ts() >= first + 1000
    assert client.get_ts_batch(1 << 18) > first


# -- errors and status codes ------------------------------------------------------------------


def status_of(call: object, request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=5)  # type: ignore[operator]
    return info.value


def test_status_codes_for_bad_requests(stub: registry_pb2_grpc.RegistryStub) -> None:
    err = status_of(stub.GetNode, registry_pb2.GetNodeReq(node_id="ghost"))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "node ghost is not registered" in err.details()

    err = status_of(stub.GetTS, registry_pb2.GetTSReq(count=0))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "count must be in [1, 262144], got 0" in err.details()

    err = status_of(stub.GetTS, registry_pb2.GetTSReq(count=(1 << 18) + 1))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT

    bad_addr = registry_pb2.NodeInfo(node_id="pump-1", kind="pump", addr="no-port")
    err = status_of(stub.RegisterNode, registry_pb2.RegisterNodeReq(node=bad_addr))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "node pump-1 addr must be HOST:PORT" in err.details()

    err = status_of(stub.Heartbeat, registry_pb2.HeartbeatReq(node=pump("ghost").to_proto()))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "node ghost is not registered" in err.details()

    stub.RegisterNode(registry_pb2.RegisterNodeReq(node=pump().to_proto()), timeout=5)
    err = status_of(
        stub.SetNodeState, registry_pb2.SetNodeStateReq(node_id="pump-1", state=registry_pb2.ONLINE)
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "restart the node" in err.details()
    err = status_of(
        stub.SetNodeState, registry_pb2.SetNodeStateReq(node_id="pump-1", state=registry_pb2.OFFLINE)
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "from online to offline" in err.details()

    err = status_of(stub.ListNodes, registry_pb2.ListNodesReq(kind="drainer"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_client_raises_domain_errors(client: RegistryClient) -> None:
    with pytest.raises(errors.NotFound, match="node ghost is not registered") as info:
        client.get_node("ghost")
    assert info.value.grpc_code == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    with pytest.raises(errors.NotFound, match="no nodes are registered"):
        client.set_state("ghost", NodeState.PAUSING)
    with pytest.raises(errors.InvalidArgument, match="count must be in"):
        client.get_ts_batch(0)
    with pytest.raises(errors.InvalidArgument):
        client.get_ts_batch(-1)
    with pytest.raises(errors.InvalidArgument, match="port must be > 0"):
        client.register(NodeRecord("pump-1", "pump", "127.0.0.1:0"))


def test_unreachable_registry() -> None:
    addr = f"127.0.0.1:{free_port()}"
    with RegistryClient(addr, timeout_s=0.5) as c:
        started = time.monotonic()
        with pytest.raises(errors.Unavailable, match=f"registry {addr} is unreachable"):
            c.get_ts()
        # Retries stay within the client's timeout (plus scheduling slack).
        assert time.monotonic() - started < 2.0
        with pytest.raises(errors.Unavailable, match="is unreachable"):
            c.register(pump())
    with pytest.raises(errors.Unavailable, match="is closed"):
        c.get_ts()
    with pytest.raises(errors.Unavailable, match="is closed"):
        c.list_nodes()
    with pytest.raises(errors.InvalidArgument, match="registry addr"):
        RegistryClient("no-port")


def test_second_server_on_same_data_dir_is_refused(server: RegistryServer, tmp_path: pathlib.Path) -> None:
    with pytest.raises(errors.FailedPrecondition, match="in use by another registry"):
        start_server(tmp_path / "registry")


def test_second_server_on_same_port_is_refused(server: RegistryServer, tmp_path: pathlib.Path) -> None:
    settings = RegistrySettings(addr=server.addr, data_dir=tmp_path / "other")
    with pytest.raises(errors.Unavailable, match=f"cannot listen on {server.addr}"):
        RegistryServer(settings).start()
    # The failed start released its store.
    start_server(tmp_path / "other").stop(grace=0)


# -- coalescing --------------------------------------------------------------------------------


def test_get_ts_coalesces_concurrent_callers(server: RegistryServer, client: RegistryClient) -> None:
    threads_n, calls_n = 16, 500
    results: list[list[int]] = [[] for _ in range(threads_n)]
    barrier = threading.Barrier(threads_n)
    failures: list[BaseException] = []

    def worker(out: list[int]) -> None:
        try:
            barrier.wait()
            for _ in range(calls_n):
                out.append(client.get_ts())
        except BaseException as exc:  # surfaced below
            failures.append(exc)

    rpcs_before = server.servicer.calls().get("GetTS", 0)
    workers = [threading.Thread(target=worker, args=(out,)) for out in results]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=60)
    assert not failures, failures
    everything = [ts for out in results for ts in out]
    assert len(everything) == threads_n * calls_n
    assert len(set(everything)) == len(everything)
    for out in results:
        assert all(a < b for a, b in itertools.pairwise(out))
    rpcs = server.servicer.calls()["GetTS"] - rpcs_before
    # One RPC serves every caller waiting at that moment (several per RPC here,
    # with client and server sharing one interpreter; more with more threads).
    assert rpcs <= len(everything) // 3, f"{rpcs} GetTS RPCs for {len(everything)} timestamps"


def test_get_ts_async_batches_and_orders(server: RegistryServer, client: RegistryClient) -> None:
    """Async requests queued together share rounds with each other and with
    blocking callers; a timestamp read later is still unique and taken after
    the request (above everything handed out before it)."""
    before = client.get_ts()
    rpcs_before = server.servicer.calls().get("GetTS", 0)
    futures = [client.get_ts_async() for _ in range(300)]
    blocking = [client.get_ts() for _ in range(5)]
    got = [f.result(timeout=10) for f in futures]
    assert len(set(got + blocking)) == len(got) + len(blocking)
    assert min(got) > before
    rpcs = server.servicer.calls()["GetTS"] - rpcs_before
    assert rpcs <= 100, f"{rpcs} GetTS RPCs for {len(got) + 5} timestamps"
    after = client.get_ts_async().result(timeout=10)
    assert after > max(got + blocking)


def test_get_ts_async_fails_on_close(tmp_path: pathlib.Path) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        c = RegistryClient(f"127.0.0.1:{silent.getsockname()[1]}", timeout_s=30.0)
        future = c.get_ts_async()
        time.sleep(0.2)
        c.close()
        with pytest.raises(errors.Unavailable, match="closed"):
            future.result(timeout=5)
        with pytest.raises(errors.Unavailable, match="closed"):
            c.get_ts_async()


def test_close_fails_waiting_callers_promptly(tmp_path: pathlib.Path) -> None:
    # A listening socket that never answers HTTP/2: GetTS hangs until close().
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        addr = f"127.0.0.1:{silent.getsockname()[1]}"
        c = RegistryClient(addr, timeout_s=30.0)
        outcome: list[BaseException] = []

        def call() -> None:
            try:
                c.get_ts()
            except BaseException as exc:
                outcome.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        time.sleep(0.3)
        started = time.monotonic()
        c.close()
        caller.join(timeout=10)
        assert not caller.is_alive()
        assert time.monotonic() - started < 5
        assert len(outcome) == 1 and isinstance(outcome[0], errors.Unavailable)
        assert "is closed" in str(outcome[0])


# -- restarts ---------------------------------------------------------------------------------


def test_restart_on_same_data_dir(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / "registry"
    first = start_server(data_dir)
    try:
        with RegistryClient(first.addr) as c:
            seen = [c.get_ts() for _ in range(50)] + [c.get_ts_batch(5000)]
            cluster_id, _ = c.cluster_info()
            c.register(pump())
    finally:
        first.stop(grace=0.5)
    second = start_server(data_dir)
    try:
        with RegistryClient(second.addr) as c:
            assert c.get_ts() > max(seen) + 4999
            assert c.cluster_info()[0] == cluster_id
            assert [n.node_id for n in c.list_nodes()[0]] == ["pump-1"]
    finally:
        second.stop(grace=0.5)


class RegistryProcess:
    """A registry in its own process, as an operator would run it."""

    def __init__(self, data_dir: pathlib.Path, addr: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [str(VENV_PYTHON), "-m", "binlake.registry.server", "--data-dir", str(data_dir), "--addr", addr],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.addr = self._wait_listening()

    def _wait_listening(self, timeout_s: float = 20.0) -> str:
        found: list[str] = []
        lines: list[str] = []

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                lines.append(line)
                match = re.search(r"registry listening on (\S+) \(store ", line)
                if match and not found:
                    found.append(match.group(1))

        # Keep draining stderr for the process's lifetime so it never blocks on a full pipe.
        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not found:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"registry did not start:\n{''.join(lines)}")
            time.sleep(0.02)
        return found[0]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.mark.skipif(not VENV_PYTHON.exists(), reason="needs the project's .venv")
def test_kill_9_and_restart(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / "registry"
    first = RegistryProcess(data_dir, "127.0.0.1:0")
    try:
        with RegistryClient(first.addr, timeout_s=5.0) as c:
            seen = [c.get_ts() for _ in range(200)]
            seen.append(c.get_ts_batch(1000) + 999)
            c.register(pump())
    finally:
        first.kill()
    assert first.proc.returncode == -signal.SIGKILL

    # Same address: the client that talked to the dead registry keeps working
    # once it is back, retrying UNAVAILABLE within its timeout.
    with RegistryClient(first.addr, timeout_s=10.0) as c:
        with RegistryClient(first.addr, timeout_s=0.3) as impatient, pytest.raises(errors.Unavailable):
            impatient.get_ts_batch(1)
        second = RegistryProcess(data_dir, first.addr)
        try:
            after = [c.get_ts() for _ in range(100)]
            assert min(after) > max(seen)
            assert all(a < b for a, b in itertools.pairwise(after))
            assert c.get_node("pump-1").state is NodeState.ONLINE
            # A graceful stop (SIGTERM) exits cleanly.
            second.proc.send_signal(signal.SIGTERM)
            assert second.proc.wait(timeout=15) == 0
        finally:
            second.kill()


def test_server_main_reports_bad_config(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [str(VENV_PYTHON), "-m", "binlake.registry.server", "--data-dir", str(tmp_path), "--addr", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "registry addr" in result.stderr and "HOST:PORT" in result.stderr
    assert "Traceback" not in result.stderr


def test_server_main_refuses_a_bad_log_level(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [str(VENV_PYTHON), "-m", "binlake.registry.server", "--data-dir", str(tmp_path), "--log-level", "loud"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "'loud' is not a log level" in result.stderr and "Traceback" not in result.stderr
