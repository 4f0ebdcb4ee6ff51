"""Checks and look-ups on the MySQL/MariaDB server a row-binlog source reads:
binlog settings, the binlog files, the current position, the server's identity."""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import Any

import pymysql

from binlake import errors


@dataclasses.dataclass(frozen=True)
class Dsn:
    host: str
    port: int
    user: str
    password: str

    def settings(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "user": self.user, "passwd": self.password}

    def connect(self) -> pymysql.connections.Connection:
        try:
            return pymysql.connect(host=self.host, port=self.port, user=self.user, password=self.password,
                                   autocommit=True, charset="utf8mb4", connect_timeout=5)
        except pymysql.err.OperationalError as exc:
            raise errors.Unavailable(f"cannot connect to {self.host}:{self.port} as {self.user}: {exc.args[-1]}") from None

    def __str__(self) -> str:
        return f"mysql://{self.user}@{self.host}:{self.port}"


def parse_dsn(dsn: str) -> Dsn:
    """``mysql://USER[:PW]@HOST[:PORT]`` (``mysql+pymysql://`` accepted too)."""
    if not isinstance(dsn, str):
        raise errors.InvalidArgument("--dsn must be a string such as mysql://root@127.0.0.1:3306")
    u = urllib.parse.urlsplit(dsn)
    if u.scheme not in ("mysql", "mysql+pymysql", "mariadb") or not u.hostname:
        raise errors.InvalidArgument(f"--dsn {dsn!r} is not a MySQL URL; expected mysql://USER[:PASSWORD]@HOST[:PORT]")
    try:
        port = u.port or 3306
    except ValueError:
        raise errors.InvalidArgument(f"--dsn {dsn!r}: the port is not a number") from None
    return Dsn(u.hostname, port, urllib.parse.unquote(u.username or "root"), urllib.parse.unquote(u.password or ""))


def _var(cur: Any, name: str) -> str | None:
    cur.execute("SHOW GLOBAL VARIABLES LIKE %s", (name,))
    row = cur.fetchone()
    return None if row is None else str(row[1])


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    mariadb: bool
    version: str
    server_id: int
    identity: str  # server_uuid (MySQL) or "server_id=N" (MariaDB has no uuid)


def check_server(conn: Any, our_server_id: int) -> ServerInfo:
    """Refuse a server whose binlog cannot back up rows exactly, saying which setting to change."""
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        version = str(cur.fetchone()[0])
        mariadb = "mariadb" in version.lower()
        log_bin = (_var(cur, "log_bin") or "OFF").upper()
        fmt = (_var(cur, "binlog_format") or "").upper()
        image = (_var(cur, "binlog_row_image") or "FULL").upper()
        server_id = int(_var(cur, "server_id") or "0")
        uuid = _var(cur, "server_uuid")
    cnf = "in the server's my.cnf under [mysqld] and restart it (or SET GLOBAL for new sessions)"
    if log_bin not in ("ON", "1"):
        raise errors.FailedPrecondition(
            f"the server's binary log is off (log_bin={log_bin}); set log_bin and binlog_format=ROW {cnf}"
        )
    if fmt != "ROW":
        raise errors.FailedPrecondition(
            f"binlog_format is {fmt}; binlake reads row images only: set binlog_format=ROW {cnf}"
        )
    if image != "FULL":
        raise errors.FailedPrecondition(
            f"binlog_row_image is {image}; binlake needs whole before/after images: set binlog_row_image=FULL {cnf}"
        )
    if server_id == 0:
        raise errors.FailedPrecondition(f"the server's server_id is 0, which accepts no replicas; set server_id {cnf}")
    if server_id == our_server_id:
        raise errors.InvalidArgument(
            f"--server-id {our_server_id} is the server's own id; pick one no server or replica uses"
        )
    return ServerInfo(mariadb, version, server_id, uuid or f"server_id={server_id}")


def binlog_files(conn: Any) -> list[tuple[str, int]]:
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        return [(str(r[0]), int(r[1])) for r in cur.fetchall()]


def current_position(conn: Any) -> tuple[str, int]:
    with conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        row = cur.fetchone()
    if row is None:
        raise errors.FailedPrecondition("SHOW MASTER STATUS is empty: binary logging is off on the server")
    return str(row[0]), int(row[1])


def check_position(conn: Any, file: str, pos: int) -> None:
    """Refuse a start position the server no longer (or never) had."""
    files = binlog_files(conn)
    names = [f for f, _ in files]
    if file not in names:
        if names and file < names[0]:
            raise errors.FailedPrecondition(
                f"start position {file}:{pos} was purged from the server (its oldest binlog is now {names[0]}); "
                "the changes in between are gone: start again with --start snapshot, or --start now to accept "
                "the gap"
            )
        raise errors.FailedPrecondition(
            f"the server has no binlog {file} (it has {names[0] if names else 'none'}..{names[-1] if names else ''}); "
            "is --dsn the server this checkpoint belongs to?"
        )
    size = dict(files)[file]
    if pos > size:
        raise errors.FailedPrecondition(f"position {file}:{pos} is past the end of that binlog ({size} bytes)")


def lag_seconds(conn: Any, event_time: int) -> float:
    with conn.cursor() as cur:
        cur.execute("SELECT UNIX_TIMESTAMP()")
        now = float(cur.fetchone()[0])
    return max(0.0, now - event_time)
