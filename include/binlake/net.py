"""Network addresses and TLS file paths: the leaf that ``binlake.config`` and
``binlake.rpc`` (and every command-line check) import, so neither imports the other
for them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket

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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` nothing listens on right now (bound to port 0, then released:
    another process may take it before the caller binds it)."""
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
