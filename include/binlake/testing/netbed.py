"""A multi-host test bed on one machine, and a nemesis that breaks it.

Each host is a Linux network namespace with its own address on a bridge (a
veth pair per host; the bridge also has an address, so the test process in the
root namespace is one more host that reaches all of them). Processes are
started inside a host with ``ip netns exec``. The nemesis can, per host:
kill -9 its processes, SIGSTOP/SIGCONT them, cut its link (a partition: the
host keeps running but reaches nobody), add latency or loss with ``tc netem``,
and heal.

Needs root and ``ip``/``tc`` (iproute2). Where a namespace cannot be created
(no root, a container without CAP_NET_ADMIN) ``NetBed.probe()`` says why, and
``NetBed(loopback=True)`` gives hosts on 127.0.0.x instead: processes, kill -9
and SIGSTOP work, partitions and netem raise (tests that need them skip).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import random
import shutil
import signal
import subprocess
from collections.abc import Sequence
from typing import Self

from binlake import errors


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


@dataclasses.dataclass
class Host:
    """One host of the bed: a name, an address, and the processes started on it."""

    name: str
    addr: str
    netns: str  # "" on loopback
    veth: str  # the root-side end of its link ("" on loopback)
    procs: list[subprocess.Popen[bytes]] = dataclasses.field(default_factory=list)

    @property
    def wrap(self) -> list[str]:
        """The command prefix that runs a program on this host."""
        return ["ip", "netns", "exec", self.netns] if self.netns else []

    def spawn(self, args: Sequence[str], log_path: pathlib.Path, env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        """Start ``args`` on this host (its own process group), output to ``log_path``."""
        log = log_path.open("ab")
        try:
            proc = subprocess.Popen([*self.wrap, *args], stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env)
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def signal_all(self, sig: signal.Signals) -> None:
        for p in self.alive():
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass


class NetBed:
    """``hosts`` hosts named h1..hN; use as a context manager (teardown removes
    every namespace, link and process it made)."""

    def __init__(self, hosts: int, *, loopback: bool = False) -> None:
        if hosts < 1 or hosts > 200:
            raise ValueError(f"a test bed has 1..200 hosts, got {hosts}")
        self.loopback = loopback
        # A random tag and /24 keep two beds (or a leftover one) apart.
        tag = f"{os.getpid() % 10000:04d}{random.randrange(100):02d}"
        self._tag = tag
        self._bridge = f"blbr{tag}"
        net = random.randrange(16, 250)
        self.gateway = "127.0.0.1" if loopback else f"10.{net}.77.254"
        self.hosts = [
            Host(f"h{i}", f"127.0.{net}.{i}" if loopback else f"10.{net}.77.{i}",
                 "" if loopback else f"bl{tag}h{i}", "" if loopback else f"blv{tag}{i}")
            for i in range(1, hosts + 1)
        ]
        self._up = False

    @staticmethod
    def probe() -> str:
        """'' when namespaces work here; else why not (the skip message)."""
        if os.geteuid() != 0:
            return "network namespaces need root (the test bed falls back to loopback)"
        if shutil.which("ip") is None or shutil.which("tc") is None:
            return "iproute2 (ip, tc) is not installed"
        name = f"blprobe{os.getpid()}"
        made = _ip("netns", "add", name, check=False)
        if made.returncode != 0:
            return f"cannot create a network namespace: {made.stderr.strip()}"
        _ip("netns", "del", name, check=False)
        return ""

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})")

    # -- setup / teardown -------------------------------------------------------------

    def start(self) -> Self:
        if self.loopback:
            self._up = True
            return self
        why = self.probe()
        if why:
            raise errors.FailedPrecondition(why)
        try:
            _ip("link", "add", self._bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self._bridge)
            _ip("link", "set", self._bridge, "up")
            self._up = True
            for h in self.hosts:
                _ip("netns", "add", h.netns)
                _ip("link", "add", h.veth, "type", "veth", "peer", "name", f"{h.veth}p")
                _ip("link", "set", f"{h.veth}p", "netns", h.netns)
                _ip("-n", h.netns, "link", "set", f"{h.veth}p", "name", "eth0")
                _ip("-n", h.netns, "addr", "add", f"{h.addr}/24", "dev", "eth0")
                _ip("-n", h.netns, "link", "set", "eth0", "up")
                _ip("-n", h.netns, "link", "set", "lo", "up")
                _ip("link", "set", h.veth, "master", self._bridge)
                _ip("link", "set", h.veth, "up")
        except subprocess.CalledProcessError as exc:
            self.stop()
            raise errors.FailedPrecondition(f"test bed setup failed: {' '.join(exc.cmd)}: {exc.stderr}") from None
        return self

    def stop(self) -> None:
        for h in self.hosts:
            h.signal_all(signal.SIGCONT)
            h.signal_all(signal.SIGKILL)
            for p in h.procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        if self.loopback or not self._up:
            return
        for h in self.hosts:
            _ip("link", "del", h.veth, check=False)
            _ip("netns", "del", h.netns, check=False)
        _ip("link", "del", self._bridge, check=False)
        self._up = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the nemesis ----------------------------------------------------------------------

    def kill9(self, name: str) -> None:
        """kill -9 every process on the host (a crash)."""
        h = self.host(name)
        h.signal_all(signal.SIGKILL)
        for p in h.procs:
            p.wait(10)
        h.procs = []

    def pause(self, name: str) -> None:
        """SIGSTOP the host's processes (a long GC pause, a frozen VM)."""
        self.host(name).signal_all(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.host(name).signal_all(signal.SIGCONT)

    def partition(self, name: str) -> None:
        """Cut the host's link: it runs on but reaches nobody, and nobody it."""
        h = self._netns_host(name, "partition")
        _ip("link", "set", h.veth, "down")

    def netem(self, name: str, *, delay_ms: int = 0, loss_pct: float = 0.0) -> None:
        """Latency and/or loss on everything the host sends (``tc netem``)."""
        h = self._netns_host(name, "netem")
        if delay_ms < 0 or not 0 <= loss_pct <= 100:
            raise ValueError("delay_ms must be >= 0 and loss_pct in [0, 100]")
        args = ["ip", "netns", "exec", h.netns, "tc", "qdisc", "replace", "dev", "eth0", "root", "netem"]
        if delay_ms:
            args += ["delay", f"{delay_ms}ms"]
        if loss_pct:
            args += ["loss", f"{loss_pct}%"]
        done = subprocess.run(args, capture_output=True, text=True, timeout=20)
        if done.returncode != 0:
            raise errors.FailedPrecondition(
                f"tc netem failed on {name}: {done.stderr.strip()} (the kernel may lack the sch_netem module)")

    @staticmethod
    def netem_available() -> str:
        """'' when ``tc netem`` works here; else why not (the skip message)."""
        if NetBed.probe():
            return NetBed.probe()
        name = f"blnetem{os.getpid()}"
        _ip("netns", "add", name, check=False)
        try:
            done = subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "replace", "dev", "lo", "root",
                                   "netem", "delay", "1ms"], capture_output=True, text=True, timeout=20)
        finally:
            _ip("netns", "del", name, check=False)
        return "" if done.returncode == 0 else f"tc netem is unavailable here: {done.stderr.strip()}"

    def heal(self, name: str) -> None:
        """Undo partition and netem (and SIGSTOP) on the host."""
        h = self.host(name)
        h.signal_all(signal.SIGCONT)
        if h.netns:
            _ip("link", "set", h.veth, "up")
            subprocess.run(["ip", "netns", "exec", h.netns, "tc", "qdisc", "del", "dev", "eth0", "root"],
                           capture_output=True, timeout=20)

    def _netns_host(self, name: str, what: str) -> Host:
        h = self.host(name)
        if not h.netns:
            raise errors.FailedPrecondition(f"{what} needs network namespaces; this bed runs on loopback")
        return h
