"""A cluster on one machine as real processes: a registry and N Pumps.

Used by ``make demo``, the benchmarks and end-to-end tests; ``make up``
(later) builds on it. Each service is a ``binlake`` subprocess with its own
data dir and a fixed loopback port, so a killed Pump restarts at the same
address with the same data.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from binlake import errors, rpc
from binlake.net import free_port
from binlake.registry.client import RegistryClient


class ServiceExited(errors.Unavailable):
    """A service process ended while it was awaited: it will not come up."""


def _binlake() -> list[str]:
    return [sys.executable, "-m", "binlake.cli"]


@dataclasses.dataclass
class Service:
    name: str
    args: list[str]
    log_path: pathlib.Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class DevCluster:
    """Registry + Pumps as subprocesses under ``root``."""

    def __init__(self, root: str | os.PathLike[str], pumps: int = 3, *, pump_args: list[str] | None = None,
                 host: str = "127.0.0.1") -> None:
        """``host``: the address the registry and Pumps listen on and advertise (another
        than loopback when processes on other hosts of a test bed must reach them)."""
        self.root = pathlib.Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.registry_addr = f"{host}:{free_port(host)}"
        self.registry = Service(
            "registry",
            [*_binlake(), "registry", "--data-dir", str(self.root / "registry"), "--addr", self.registry_addr],
            self.root / "registry.log",
        )
        self.pumps: dict[str, Service] = {}
        self.pump_addrs: dict[str, str] = {}
        for i in range(1, pumps + 1):
            node_id = f"pump{i}"
            addr = f"{host}:{free_port(host)}"
            self.pump_addrs[node_id] = addr
            self.pumps[node_id] = Service(
                node_id,
                [*_binlake(), "pump", "--registry", self.registry_addr, "--data-dir", str(self.root / node_id),
                 "--addr", addr, "--node-id", node_id, *(pump_args or [])],
                self.root / f"{node_id}.log",
            )

    def start(self, timeout: float = 60.0) -> DevCluster:
        """Start the registry, then the Pumps, and wait until every Pump takes
        writes. If one does not, what was started is stopped before the error
        is raised (a caller that never got the cluster cannot stop it)."""
        try:
            self.registry.start()
            with RegistryClient(self.registry_addr, timeout_s=2.0) as reg:
                self._wait(lambda: self._registry_up(reg), timeout, "registry")
                for svc in self.pumps.values():
                    svc.start()
                for node_id in self.pumps:
                    self.wait_pump_online(node_id, timeout, reg)
        except BaseException:
            self.stop()
            raise
        return self

    def _registry_up(self, reg: RegistryClient) -> bool:
        if not self.registry.alive:
            proc = self.registry.proc
            raise ServiceExited(f"registry exited (code {proc.returncode if proc else '?'})")
        return reg.cluster_info() is not None

    def _wait(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except ServiceExited as exc:
                raise errors.Unavailable(f"{what} did not come up: {exc}; see logs in {self.root}") from None
            except errors.BinlakeError as exc:
                last = exc
            time.sleep(0.1)
        raise errors.Unavailable(f"{what} did not come up within {timeout:g}s ({last}); see logs in {self.root}")

    def wait_pump_online(self, node_id: str, timeout: float = 60.0, reg: RegistryClient | None = None) -> None:
        import grpc

        from binlake.proto import pump_pb2, pump_pb2_grpc

        def ready() -> bool:
            svc = self.pumps[node_id]
            if not svc.alive:
                raise ServiceExited(f"{node_id} exited (code {svc.proc.returncode if svc.proc else '?'})")
            with rpc.channel(self.pump_addrs[node_id]) as ch:
                try:
                    st = pump_pb2_grpc.PumpStub(ch).Status(pump_pb2.StatusReq(), timeout=1.0)
                except grpc.RpcError:
                    return False
            # The node id too: another process listening on the address is not this Pump.
            return bool(st.node_id == node_id and st.accepting_writes and st.safe_ts > 0)

        self._wait(ready, timeout, f"pump {node_id}")

    def kill9(self, node_id: str) -> None:
        self.pumps[node_id].kill9()

    def restart(self, node_id: str, timeout: float = 60.0) -> None:
        self.pumps[node_id].start()
        self.wait_pump_online(node_id, timeout)

    def stop(self) -> None:
        for svc in self.pumps.values():
            svc.stop()
        self.registry.stop()

    def __enter__(self) -> DevCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
