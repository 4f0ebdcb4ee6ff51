"""Helpers shared by the Pump suites (the fixtures around them live in conftest.py).

Everything here is real: registries and Pumps are gRPC servers on loopback
port 0 (in-process) or child processes started through the ``binlake`` CLI on
ports picked by binding a socket first. Nothing mocks gRPC or storage.

This is a module of its own (not conftest.py) so test modules can import it:
pytest loads every conftest.py under the module name ``conftest``, so
``from conftest import ...`` would pick whichever one was loaded last.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
import pytest

from binlake import config, errors, tso
from binlake.client.reader import pull_pump
from binlake.net import free_port
from binlake.proto import binlog_pb2, pump_pb2, pump_pb2_grpc
from binlake.pump.node import PumpNode
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeRecord
from binlake.registry.server import RegistryServer
from binlake.writer.txn_status import MemoryStatusProvider, TxnStatusServer

T = TypeVar("T")

BINLAKE = pathlib.Path(sys.executable).parent / "binlake"
WRITER_ID = "w1"

# Pump settings every test starts from: no disk-space refusal, fast
# heartbeats and fake binlogs, no missing-commit resolution unless a test asks.
PUMP_DEFAULTS: dict[str, Any] = {
    "stop_write_at_free_bytes": 0,
    "heartbeat_interval_s": 0.2,
    "fake_binlog_interval_s": 0.3,
    "txn_timeout_s": 600.0,
    "gc_interval_s": 3600.0,
}


# ---------------------------------------------------------------------------- helpers


class WriterThreads:
    """``count`` writer threads, each running ``txn`` until ``finish``; what a writer
    raises is kept in ``crashes`` for the test to assert on."""

    def __init__(self, count: int, *, daemon: bool = False) -> None:
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.crashes: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, name=f"writer-{i}", daemon=daemon) for i in range(count)]

    def txn(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self.threads), "a writer is stuck"

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.txn()
        except BaseException as exc:
            self.crashes.append(exc)


def wait_until(pred: Callable[[], T], timeout: float = 10.0, interval: float = 0.05, what: str = "") -> T:
    """Poll ``pred`` until it returns something truthy; fail the test on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or pred}")
        time.sleep(interval)



def wait_cluster_safe(registry: str, ts: int, timeout: float = 30.0) -> None:
    """Wait until every Pump a window [0, ts) needs has passed ``ts`` (what an ingest of it checks)."""
    from binlake.lake.pumps import datasource as lake_source
    from binlake.lake.pumps.planner import plan_window

    def passed() -> bool:
        try:
            lake_source.check_pumps(plan_window(registry, 0, ts))
        except errors.FailedPrecondition:
            return False
        return True

    wait_until(passed, timeout, 0.1, f"pumps' safe ts to pass {ts}")

def now_ts(offset_ms: int = 0) -> int:
    """A TSO at the wall clock (plus ``offset_ms``), for windows in the future."""
    return tso.compose(time.time_ns() // 1_000_000 + offset_ms)


def mutation_value(start_ts: int, pad: int = 0) -> binlog_pb2.PrewriteValue:
    """A PrewriteValue with one inserted row carrying ``start_ts`` (and ``pad`` bytes)."""
    row = binlog_pb2.Row(
        columns=[
            binlog_pb2.Column(id=1, value=binlog_pb2.Datum(int_value=start_ts)),
            binlog_pb2.Column(id=2, value=binlog_pb2.Datum(bytes_value=b"x" * pad)),
        ]
    )
    mutation = binlog_pb2.TableMutation(
        table_id=7, inserted_rows=[row.SerializeToString()], sequence=[binlog_pb2.INSERT]
    )
    return binlog_pb2.PrewriteValue(schema_version=1, mutations=[mutation])


def row_start_ts(b: binlog_pb2.Binlog) -> int:
    """The start_ts that ``mutation_value`` put into a served transaction's row."""
    value = binlog_pb2.PrewriteValue.FromString(b.prewrite_value)
    row = binlog_pb2.Row.FromString(value.mutations[0].inserted_rows[0])
    return row.columns[0].value.int_value


def prewrite(start_ts: int, *, writer: bytes = WRITER_ID.encode(), pad: int = 0) -> binlog_pb2.Binlog:
    return binlog_pb2.Binlog(
        tp=binlog_pb2.PREWRITE, start_ts=start_ts, prewrite_key=writer,
        prewrite_value=mutation_value(start_ts, pad).SerializeToString(),
    )


def commit(start_ts: int, commit_ts: int) -> binlog_pb2.Binlog:
    return binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=start_ts, commit_ts=commit_ts)


def rollback(start_ts: int) -> binlog_pb2.Binlog:
    return binlog_pb2.Binlog(tp=binlog_pb2.ROLLBACK, start_ts=start_ts)


def fake(ts: int) -> binlog_pb2.Binlog:
    return binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=ts, commit_ts=ts)


@contextlib.contextmanager
def pump_stub(addr: str) -> Iterator[pump_pb2_grpc.PumpStub]:
    with grpc.insecure_channel(addr) as channel:
        yield pump_pb2_grpc.PumpStub(channel)


def write_one(addr: str, binlog: binlog_pb2.Binlog | bytes, cluster_id: int = 0, timeout: float = 10.0) -> None:
    """Unary WriteBinlog; raises grpc.RpcError on a refusal."""
    payload = binlog if isinstance(binlog, bytes) else binlog.SerializeToString()
    with pump_stub(addr) as stub:
        stub.WriteBinlog(pump_pb2.WriteBinlogReq(cluster_id=cluster_id, payload=payload), timeout=timeout)


def status(addr: str, timeout: float = 2.0) -> pump_pb2.StatusResp:
    with pump_stub(addr) as stub:
        return stub.Status(pump_pb2.StatusReq(), timeout=timeout)


def try_status(addr: str) -> pump_pb2.StatusResp | None:
    try:
        return status(addr, timeout=1.0)
    except grpc.RpcError:
        return None


def pull(addr: str, start_ts: int, end_ts: int, **kwargs: Any) -> list[binlog_pb2.Binlog]:
    return list(pull_pump(addr, start_ts, end_ts, **kwargs))


def wait_safe(addr: str, ts: int, timeout: float = 15.0) -> int:
    """Wait until the Pump at ``addr`` has a safe ts >= ``ts``; return it."""

    def reached() -> int:
        st = try_status(addr)
        return st.safe_ts if st is not None and st.safe_ts >= ts else 0

    return wait_until(reached, timeout, what=f"safe ts of {addr} to reach {ts}")


def refusal(fn: Callable[[], object]) -> tuple[grpc.StatusCode | None, str]:
    """Run ``fn``, which must fail; return its status code and message. Takes a raw
    grpc.RpcError or the domain error binlake's clients turn one into."""
    try:
        fn()
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    except errors.BinlakeError as exc:
        return getattr(exc, "grpc_code", None), str(exc)
    raise AssertionError(f"{fn} did not fail")


def register_writer(reg: RegistryClient, addr: str, writer_id: str = WRITER_ID) -> NodeRecord:
    return reg.register(NodeRecord(node_id=writer_id, kind="writer", addr=addr))


# ---------------------------------------------------------------------------- in-process services


def start_registry(data_dir: pathlib.Path, addr: str = "127.0.0.1:0") -> RegistryServer:
    return RegistryServer(config.load(config.RegistrySettings, data_dir=data_dir, addr=addr)).start()


@dataclasses.dataclass
class Upstream:
    """The writer's side of missing-commit resolution: outcomes and their server."""

    provider: MemoryStatusProvider
    server: TxnStatusServer
    writer_id: str = WRITER_ID

    @property
    def addr(self) -> str:
        return self.server.addr


class PumpFactory:
    """Starts in-process Pumps against one registry and stops them all at teardown."""

    def __init__(self, registry_addr: str, base: pathlib.Path) -> None:
        self.registry_addr = registry_addr
        self.base = base
        self.nodes: list[PumpNode] = []
        self._n = 0

    def settings(self, name: str | None = None, **overrides: Any) -> config.PumpSettings:
        """Settings of Pump ``name``: data dir ``base/name``, node id ``name`` (override
        ``node_id=None`` to let the data dir choose), loopback port 0."""
        self._n += 1
        name = name or f"pump{self._n}"
        values = {
            **PUMP_DEFAULTS,
            "registry": self.registry_addr,
            "data_dir": self.base / name,
            "addr": "127.0.0.1:0",
            "node_id": name,
            **overrides,
        }
        return config.load(config.PumpSettings, **values)

    def create(self, name: str | None = None, **overrides: Any) -> PumpNode:
        """A PumpNode that is built (storage open, port bound) but not started."""
        node = PumpNode(self.settings(name, **overrides))
        self.nodes.append(node)
        return node

    def start(self, name: str | None = None, **overrides: Any) -> PumpNode:
        return self.create(name, **overrides).start(register_timeout_s=10)

    def stop_all(self) -> None:
        for node in reversed(self.nodes):
            with contextlib.suppress(Exception):
                node.stop(grace=0.5)
        self.nodes.clear()


# ---------------------------------------------------------------------------- child processes


class ServiceProcess:
    """A ``binlake`` service run as a child process, its output kept in a log file."""

    def __init__(self, name: str, args: list[str], log_path: pathlib.Path, env: dict[str, str] | None = None):
        self.name = name
        self.args = args
        self.log_path = log_path
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(BINLAKE), *self.args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = "\n".join(self.log_text().splitlines()[-30:])
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    def kill(self) -> None:
        """SIGKILL: the crash."""
        if self.alive:
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM (graceful shutdown), then SIGKILL if it does not exit in time."""
        assert self.proc is not None
        if self.alive:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


class Processes:
    """Starts registry and Pump processes and waits until they serve; kills leftovers."""

    def __init__(self, base: pathlib.Path) -> None:
        self.base = base
        self.started: list[ServiceProcess] = []

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> ServiceProcess:
        self.base.mkdir(parents=True, exist_ok=True)
        svc = ServiceProcess(name, args, self.base / f"{name}.log", env).start()
        self.started.append(svc)
        return svc

    def registry(self, data_dir: pathlib.Path, port: int | None = None, wait: bool = True,
                 extra: tuple[str, ...] = ()) -> tuple[ServiceProcess, str]:
        addr = f"127.0.0.1:{port or free_port()}"
        svc = self._spawn("registry", ["registry", "--data-dir", str(data_dir), "--addr", addr, *extra])
        if wait:
            self.wait_registry(svc, addr)
        return svc, addr

    def wait_registry(self, svc: ServiceProcess, addr: str, timeout: float = 20.0) -> None:
        def up() -> bool:
            svc.check_alive()
            try:
                with RegistryClient(addr, timeout_s=0.5) as client:
                    client.cluster_info()
            except errors.BinlakeError:
                return False
            return True

        wait_until(up, timeout, interval=0.1, what=f"registry at {addr}")

    def pump(
        self, registry_addr: str, data_dir: pathlib.Path, node_id: str, port: int | None = None, *,
        txn_timeout_s: float = 2.0, fake_binlog_interval_s: float = 0.5, wait: bool = True,
        extra: tuple[str, ...] = (), env: dict[str, str] | None = None,
    ) -> tuple[ServiceProcess, str]:
        addr = f"127.0.0.1:{port or free_port()}"
        args = [
            "pump", "--registry", registry_addr, "--data-dir", str(data_dir), "--addr", addr,
            "--node-id", node_id, "--stop-write-at-free-bytes", "0", "--txn-timeout-s", str(txn_timeout_s),
            "--fake-binlog-interval-s", str(fake_binlog_interval_s), *extra,
        ]
        svc = self._spawn(node_id, args, env={"BINLAKE_PUMP_HEARTBEAT_INTERVAL_S": "0.3", **(env or {})})
        if wait:
            self.wait_pump(svc, addr)
        return svc, addr

    def wait_pump(self, svc: ServiceProcess, addr: str, timeout: float = 20.0) -> pump_pb2.StatusResp:
        """Up = registered and accepting writes (the Status RPC says so)."""

        def up() -> pump_pb2.StatusResp | None:
            svc.check_alive()
            st = try_status(addr)
            return st if st is not None and st.accepting_writes else None

        return wait_until(up, timeout, interval=0.1, what=f"pump {svc.name} at {addr}")

    def cleanup(self) -> None:
        for svc in reversed(self.started):
            with contextlib.suppress(Exception):
                if svc.name == "registry":
                    continue
                svc.terminate(timeout=5)
        for svc in self.started:
            with contextlib.suppress(Exception):
                svc.terminate(timeout=5)


def three_pumps(procs: Processes, tmp_path: pathlib.Path) -> tuple[str, dict[str, int], dict[str, tuple[ServiceProcess, str]]]:
    """A registry and Pumps p1, p2, p3 as processes, each on a port of its own (so one
    killed can be started again on the same address): (registry address, ports,
    node id -> (process, address))."""
    _reg, reg_addr = procs.registry(tmp_path / "registry")
    ports = {f"p{i}": free_port() for i in (1, 2, 3)}
    pumps = {n: procs.pump(reg_addr, tmp_path / n, n, port, wait=False) for n, port in ports.items()}
    for svc, addr in pumps.values():
        procs.wait_pump(svc, addr)
    return reg_addr, ports, pumps


def run_cli(*args: str, timeout: float = 30.0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``binlake ARGS`` and capture its output (``env``: added to this process's environment)."""
    return subprocess.run(
        [str(BINLAKE), *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        env={**os.environ, **env} if env else None,
    )


def dag_cluster(root: pathlib.Path, pumps: int) -> Iterator[Any]:
    """A registry and ``pumps`` Pump processes for the DAG tests (a generator for a
    fixture): Pumps report their safe ts every 0.3 s (the wait step sees it through
    the registry) and write a fake binlog as often, so an idle window closes."""
    from binlake.testing.devcluster import DevCluster

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BINLAKE_PUMP_HEARTBEAT_INTERVAL_S", "0.3")
        cluster = DevCluster(root, pumps=pumps,
                             pump_args=["--stop-write-at-free-bytes", "0", "--fake-binlog-interval-s", "0.3"])
        cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
