"""Network addresses and TLS file paths: the leaf that ``binlake.config`` and
``binlake.rpc`` (and every command-line check) import, so neither imports the other
for them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import socket
import threading

from binlake import errors

# Where the registry listens unless told otherwise (``binlake registry``, every
# command's --registry, the Airflow settings, ``binlake up``).
DEFAULT_REGISTRY_ADDR = "127.0.0.1:8230"


def parse_addr(addr: str, what: str = "address") -> tuple[str, int]:
    """Check a HOST:PORT string; raise InvalidArgument naming what is wrong."""
    if not isinstance(addr, str) or ":" not in addr:
        raise errors.InvalidArgument(f"{what} must be HOST:PORT (e.g. 127.0.0.1:8250), got {addr!r}")
    host, _, port_text = addr.rpartition(":")
    host = host.strip("[]")
    if not host:
        raise errors.InvalidArgument(f"{what} {addr!r} has no host; use e.g. 127.0.0.1:{port_text}")
    try:
        port = int(port_text)
    except ValueError:
        raise errors.InvalidArgument(f"{what} {addr!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise errors.InvalidArgument(f"{what} {addr!r}: port must be in 0..65535")
    return host, port


def parse_addr_list(text: str, what: str = "address list") -> list[str]:
    """``a:8230,b:8230,c:8230`` (a registry group) -> its HOST:PORTs, in order, without
    repeats; one InvalidArgument naming the bad entry otherwise. A single
    HOST:PORT is a list of one."""
    if not isinstance(text, str) or not text.strip():
        raise errors.InvalidArgument(f"{what} is empty: give HOST:PORT[,HOST:PORT...] (e.g. 127.0.0.1:8230)")
    out: list[str] = []
    for i, part in enumerate(text.split(",")):
        item = part.strip()
        if not item:
            raise errors.InvalidArgument(
                f"{what} {text!r}: entry {i + 1} is empty; separate HOST:PORTs with single commas")
        if any(c.isspace() for c in item) or ";" in item:
            raise errors.InvalidArgument(
                f"{what} {text!r}: {item!r} is not one HOST:PORT; separate HOST:PORTs with commas")
        _, port = parse_addr(item, f"{what} entry")
        if port == 0:
            raise errors.InvalidArgument(f"{what} {text!r}: {item!r} needs a port > 0 (the registry's is 8230)")
        if item not in out:
            out.append(item)
    return out


# free_port's picks lie below the kernel's ephemeral range (ports it hands to
# outgoing connections and to binds of port 0), down to this port.
PICK_LOW = 10000
_pick_lock = threading.Lock()
# The next port free_port tries: a random start per process, then upwards, so
# picks of one process never repeat until the range wraps, and two processes
# begin far apart.
_pick_next: int | None = None


def _forget_pick_after_fork() -> None:
    # A forked child would go on from the parent's next port, and pick the very
    # ports its parent is about to pick.
    global _pick_next
    _pick_next = None


os.register_at_fork(after_in_child=_forget_pick_after_fork)


def _ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 where unknown)."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` nothing is bound to right now, for a process the
    caller starts next. Released again at once: another process may take it
    before that one binds it.

    Picked below the kernel's ephemeral range, not by binding port 0: an
    ephemeral port is also what every outgoing connection of the machine takes,
    so one picked there could be taken by a connection in the second a process
    needs to start (it happened to a benchmark's registry). Below that range
    only another explicit bind can take it. Where the range leaves no room
    below it, the kernel picks (port 0)."""
    global _pick_next
    high = _ephemeral_low()
    if high - PICK_LOW >= 1000:
        with _pick_lock:
            if _pick_next is None or not PICK_LOW <= _pick_next < high:
                _pick_next = random.randrange(PICK_LOW, high)
            for _ in range(high - PICK_LOW):
                port = _pick_next
                _pick_next = PICK_LOW + (port + 1 - PICK_LOW) % (high - PICK_LOW)
                if _bindable(host, port):
                    return port
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass(frozen=True)
class TLSFiles:
    """Paths of the PEM files (None = not configured)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.ca or self.cert)

    def describe(self) -> str:
        """For logs: which files, never their contents."""
        if not self.enabled:
            return "plaintext (no [security] configured)"
        mutual = "mutual TLS (client certificates signed by the CA required)" if self.ca else "TLS"
        return f"{mutual}: ca={self.ca or '-'} cert={self.cert or '-'}"
