"""The initial snapshot of ``binlake source mysql --start snapshot``: the chosen
tables' rows as of one binlog position, read in a consistent-snapshot
transaction, and the conversion of those rows into the shape the binlog path
encodes (so a snapshot row and a binlog row of the same value are equal bytes).

Why the position matches the snapshot
-------------------------------------
MariaDB: ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` under REPEATABLE READ
takes the InnoDB read view and, in the same step under the binlog's commit
lock, records the binlog position of the last transaction committed at that
moment; the session's ``binlog_snapshot_file`` / ``binlog_snapshot_position``
status variables return exactly that position while the transaction is open
(MariaDB documents them as consistent with the snapshot, which is how
``mysqldump --single-transaction --master-data`` avoids a global lock there).
So every transaction before the position is in the rows read, and every one
after it is in the binlog from the position on: streaming from it neither
repeats nor misses a change.

MySQL has no such variables: the snapshot is opened while ``FLUSH TABLES WITH
READ LOCK`` holds off every commit, the position read with ``SHOW MASTER
STATUS`` under the same lock, then the lock released (the user needs RELOAD).

The definitions (``SHOW CREATE TABLE``) are read in the same transaction right
after it opens; a DDL on a chosen table in that instant is not covered (the
metadata lock the reads then take keeps later DDL out until the snapshot ends).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pymysql
import pymysql.cursors

from binlake import errors
from binlake.source.mysql.server import Dsn
from binlake.source.tables import SourceColumn, SourceTable

# Rows per snapshot transaction: bounds each part's size (a Pump holds one pending at a time).
BATCH_ROWS = 10_000


def open_snapshot(dsn: Dsn, mariadb: bool) -> tuple[Any, str, int]:
    """A connection inside a consistent-snapshot transaction, and that snapshot's binlog position."""
    try:
        conn = pymysql.connect(host=dsn.host, port=dsn.port, user=dsn.user, password=dsn.password,
                               autocommit=False, charset="utf8mb4", connect_timeout=5)
    except pymysql.err.OperationalError as exc:
        raise errors.Unavailable(f"cannot connect to {dsn.host}:{dsn.port} as {dsn.user}: {exc.args[-1]}") from None
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            # TIMESTAMP values as UTC, as the binlog reader decodes them.
            cur.execute("SET SESSION time_zone = '+00:00'")
            if mariadb:
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                cur.execute("SHOW SESSION STATUS LIKE 'binlog_snapshot_%'")
                got = {str(k).lower(): str(v) for k, v in cur.fetchall()}
                file, pos = got.get("binlog_snapshot_file", ""), int(got.get("binlog_snapshot_position") or 0)
            else:
                cur.execute("FLUSH TABLES WITH READ LOCK")
                try:
                    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                    cur.execute("SHOW MASTER STATUS")
                    row = cur.fetchone()
                finally:
                    cur.execute("UNLOCK TABLES")
                file, pos = (str(row[0]), int(row[1])) if row else ("", 0)
        if not file:
            raise errors.FailedPrecondition("the server reported no binlog position for the snapshot: is log_bin on?")
        return conn, file, pos
    except BaseException:
        conn.close()
        raise


def estimate_rows(conn: Any, tables: list[SourceTable]) -> int:
    """The server's estimate of the tables' rows (``information_schema.TABLES.TABLE_ROWS``:
    InnoDB's sampled count, which needs no scan): what the progress's time left is from."""
    wanted = {(t.db.lower(), t.name.lower()) for t in tables}
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_ROWS FROM information_schema.TABLES "
                    "WHERE TABLE_TYPE = 'BASE TABLE'")
        return sum(int(n or 0) for d, t, n in cur.fetchall() if (str(d).lower(), str(t).lower()) in wanted)


def raw_results(conn: Any) -> None:
    """From now on the server sends column bytes unconverted (decoded per column charset later)."""
    with conn.cursor() as cur:
        cur.execute("SET SESSION character_set_results = binary")


def batches(conn: Any, table: SourceTable, rows: int) -> Iterator[list[dict[str, Any]]]:
    """The table's rows, ``rows`` at a time, as the binlog reader would hand them over."""
    cols = [c.name for c in table.columns]
    select = ", ".join(f"`{c.replace('`', '``')}`" for c in cols)
    with conn.cursor(pymysql.cursors.SSCursor) as cur:  # unbuffered: memory bounded by one batch
        cur.execute(f"SELECT {select} FROM `{table.db}`.`{table.name}`")
        while True:
            got = cur.fetchmany(rows)
            if not got:
                return
            yield [{c.name: as_binlog_value(v, c) for c, v in zip(table.columns, r, strict=True)} for r in got]


def as_binlog_value(v: Any, c: SourceColumn) -> Any:
    """A SELECT value (raw bytes for text) -> what the binlog reader yields for that column."""
    if v is None or not isinstance(v, (bytes, bytearray)):
        return v
    if c.is_enum:
        return bytes(v).decode("utf-8", "surrogateescape")
    if c.is_set:
        text = bytes(v).decode("utf-8", "surrogateescape")
        return set(text.split(",")) if text else set()
    if c.is_bit:
        return int.from_bytes(v, "big")
    return bytes(v)
