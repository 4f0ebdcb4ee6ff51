"""Checks of command-line values that commands run before doing any work.

A command that connects to a database, a registry or Spark first checks every
value it was given with these, so a mistake is reported as itself (one line
naming the flag and what to give instead, ``errors.InvalidArgument``) rather
than hidden behind whatever the first connection happens to fail with.
"""

from __future__ import annotations

import os
import pathlib
import socket
import tempfile

from binlake import errors
from binlake.net import parse_addr, parse_addr_list


def addr(flag: str, value: str) -> tuple[str, int]:
    """A HOST:PORT to connect to."""
    if not value.strip():
        raise errors.InvalidArgument(f"{flag} is empty: give HOST:PORT (e.g. 127.0.0.1:8230)")
    return parse_addr(value, flag)


def addr_list(flag: str, value: str) -> list[str]:
    """One HOST:PORT or a comma-separated group of them (a registry group)."""
    return parse_addr_list(value, flag)


def listen_addr(flag: str, value: str) -> tuple[str, int]:
    """A HOST:PORT to listen on: well formed, and free unless the port is 0 (any)."""
    host, port = addr(flag, value)
    if port:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            try:
                s.bind((host, port))
            except OSError as exc:
                raise errors.InvalidArgument(
                    f"{flag} {value}: cannot listen there ({exc.strerror or exc}); "
                    f"choose a free port, or {host}:0 for any") from None
    return host, port


def writable_dir(flag: str, value: str) -> pathlib.Path:
    """A directory to write in: existing and writable, or creatable."""
    if not value.strip():
        raise errors.InvalidArgument(f"{flag} is empty: give a directory")
    path = pathlib.Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise errors.InvalidArgument(f"{flag} {value} is a file, not a directory: give a directory")
    if not can_create_under(path):
        raise errors.InvalidArgument(f"{flag} {value}: cannot create or write there: give a writable directory")
    return path


def writable_file(flag: str, value: str) -> pathlib.Path:
    """A file to (over)write: not a directory, in a writable directory."""
    if not value.strip():
        raise errors.InvalidArgument(f"{flag} is empty: give a file name")
    path = pathlib.Path(value).expanduser()
    if path.is_dir():
        raise errors.InvalidArgument(f"{flag} {value} is a directory: give a file name")
    parent = path.parent if str(path.parent) else pathlib.Path(".")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise errors.InvalidArgument(f"{flag} {value}: {parent} is not a writable directory: give another path")
    return path


def lake(flag: str, value: str) -> str:
    """A lake: an existing local directory, or an ``s3://BUCKET/PREFIX`` whose bucket
    answers the configured credentials (another URI is checked by whoever opens it)."""
    from binlake.lake.store import location
    from binlake.lake.store import s3 as lake_s3

    if not value.strip():
        raise errors.InvalidArgument(f"{flag} is empty: give the lake directory or URI")
    where = location.parse(value, flag)
    if where.is_s3:
        lake_s3.probe(value)
    if "://" not in value:
        path = pathlib.Path(value).expanduser()
        if path.exists() and not path.is_dir():
            raise errors.InvalidArgument(f"{flag} {value} is a file, not a lake directory")
        if not path.exists():
            raise errors.InvalidArgument(f"{flag} {value}: no such lake directory (the ingest's --lake)")
    return value


def db_url(flag: str, value: str) -> str:
    """A SQLAlchemy URL (the driver and the server are checked when it is opened)."""
    if not value.strip():
        raise errors.InvalidArgument(f"{flag} is empty: give a database URL such as sqlite:///data/db.sqlite")
    if "://" not in value:
        raise errors.InvalidArgument(f"{flag} {value!r} is not a database URL: give one such as sqlite:///data/db.sqlite")
    from binlake.sql.url import normalize_url

    # The dialect and the URL's shape, before any slow start (Spark) that would only
    # find them wrong later; no connection is made here.
    try:
        normalize_url(value)
    except errors.BinlakeError as exc:
        raise type(exc)(f"{flag}: {exc}") from None
    return value


def reachable_db(flag: str, value: str) -> None:
    """A database URL binlake can write to or read from, answering now (one round trip)."""
    from binlake.sql.url import open_engine

    db_url(flag, value)
    try:
        engine = open_engine(value)
    except errors.BinlakeError as exc:
        raise type(exc)(f"{flag}: {exc}") from None
    engine.dispose()


def names(flag: str, value: str | None, example: str) -> list[str] | None:
    """Comma-separated names; None when the option was not given."""
    if value is None:
        return None
    out = [n.strip() for n in value.split(",") if n.strip()]
    if not out:
        raise errors.InvalidArgument(f"{flag} {value!r} names nothing: give comma-separated names such as {example}")
    return out


def can_create_under(path: pathlib.Path) -> bool:
    """Whether a directory could be made at ``path``: its nearest existing ancestor
    takes a new entry (tried, then removed: permission bits alone do not tell, e.g. /proc)."""
    nearest = path
    while not nearest.exists():
        nearest = nearest.parent
    if not nearest.is_dir():
        return False
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".binlake-probe-", dir=nearest))
    except OSError:
        return False
    return True
