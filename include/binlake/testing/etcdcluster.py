"""Throwaway etcd clusters for tests, benchmarks and demos: one or three real
``etcd`` processes (Debian's etcd-server) with their data under a temporary
directory, as ``devdb`` does for PostgreSQL.

Each member may run inside a network namespace (``wrap`` prefixes its command,
e.g. ``["ip", "netns", "exec", "h1"]``) on that host's address; by default all
members listen on loopback ports.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Self

from binlake import errors
from binlake.net import free_port

ETCD_BIN_NAMES = ("etcd",)
START_TIMEOUT_S = 30.0


def etcd_binary() -> str | None:
    """The etcd server binary, or None when it is not installed."""
    for name in ETCD_BIN_NAMES:
        found = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
        if found:
            return found
    return None


@dataclasses.dataclass
class EtcdMember:
    """One etcd process: its name, address and ports, and the command prefix
    that places it on its host."""

    name: str
    host: str
    client_port: int
    peer_port: int
    data_dir: pathlib.Path
    log_path: pathlib.Path
    wrap: list[str] = dataclasses.field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def client_addr(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    def command(self, initial_cluster: str, state: str) -> list[str]:
        binary = etcd_binary()
        if binary is None:
            raise errors.FailedPrecondition("etcd is not installed (apt-get install etcd-server)")
        return [
            *self.wrap, binary, "--name", self.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", f"http://{self.client_addr}",
            "--advertise-client-urls", f"http://{self.client_addr}",
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", initial_cluster, "--initial-cluster-state", state,
            "--initial-cluster-token", "binlake-test",
            # etcd's defaults (100 ms heartbeat, 1 s election timeout), written out
            # because the failover figures depend on them.
            "--heartbeat-interval", "100", "--election-timeout", "1000",
            "--logger", "zap", "--log-outputs", "stderr",
        ]

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive:
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill9()


class EtcdCluster:
    """``members`` etcd processes forming one cluster under ``root``.

    ``hosts`` gives each member's address (default 127.0.0.1 for all) and
    ``wraps`` each member's command prefix (default none)."""

    def __init__(self, root: str | os.PathLike[str], members: int = 1, *,
                 hosts: Sequence[str] | None = None, wraps: Sequence[list[str]] | None = None) -> None:
        if members < 1:
            raise ValueError(f"an etcd cluster has at least one member, got {members}")
        hosts = list(hosts or ["127.0.0.1"] * members)
        wraps = list(wraps or [[] for _ in range(members)])
        if len(hosts) != members or len(wraps) != members:
            raise ValueError("give one host and one wrap per member")
        self.root = pathlib.Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.members = [
            EtcdMember(f"etcd{i + 1}", hosts[i], free_port() if hosts[i] == "127.0.0.1" else 2379,
                       free_port() if hosts[i] == "127.0.0.1" else 2380,
                       self.root / f"etcd{i + 1}", self.root / f"etcd{i + 1}.log", list(wraps[i]))
            for i in range(members)
        ]

    @staticmethod
    def available() -> bool:
        return etcd_binary() is not None

    @property
    def endpoints(self) -> list[str]:
        return [m.client_addr for m in self.members]

    def url(self, prefix: str = "/binlake") -> str:
        """The registry's --store for this cluster."""
        return "etcd://" + ",".join(self.endpoints) + prefix

    def _initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    def start_member(self, member: EtcdMember) -> None:
        """(Re)start one member on its data directory."""
        state = "existing" if (member.data_dir / "member").exists() else "new"
        log = member.log_path.open("ab")
        try:
            member.proc = subprocess.Popen(member.command(self._initial_cluster(), state), stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Self:
        if etcd_binary() is None:
            raise errors.FailedPrecondition("etcd is not installed (apt-get install etcd-server)")
        for m in self.members:
            self.start_member(m)
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the cluster commits a write (it has a leader and a quorum)."""
        from binlake.registry.etcd import EtcdClient, op_put

        deadline = time.monotonic() + timeout_s
        client = EtcdClient(self.endpoints, timeout_s=2.0)
        try:
            while True:
                for m in self.members:
                    if m.proc is not None and m.proc.poll() is not None:
                        raise errors.Unavailable(f"etcd member {m.name} exited: {_tail(m.log_path)}")
                try:
                    client.txn([], [op_put(b"/binlake-test/ready", b"1")])
                    return
                except errors.BinlakeError:
                    if time.monotonic() > deadline:
                        raise errors.Unavailable(
                            f"etcd cluster not ready within {timeout_s}s: {_tail(self.members[0].log_path)}"
                        ) from None
                    time.sleep(0.2)
        finally:
            client.close()

    def stop(self) -> None:
        for m in self.members:
            m.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tail(path: pathlib.Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
