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

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pymysql
import pymysql.cursors
import pymysql.err
import pymysql.protocol

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.source import readahead
from binlake.source.mysql.server import Dsn
from binlake.source.mysql.values import RowEncoder
from binlake.source.tables import SourceColumn, SourceTable

# The native encoder of the rows read (``_snaprowc``, typed by its .pyi), or None where
# it was not built; then every row takes the Python path (``batches``).
_snaprowc: ModuleType | None
try:
    from binlake.source.mysql import _snaprowc
    _IMPORT_ERROR = ""
except ImportError as _exc:
    _snaprowc = None
    _IMPORT_ERROR = str(_exc)

# Rows per snapshot transaction: bounds each part's size (a Pump holds one pending at a time).
BATCH_ROWS = 10_000
# The encoder's ops (the T_* of _snaprowc.c).
T_INT, T_UINT, T_FLOAT, T_DECIMAL, T_STRING, T_BYTES, T_DATE, T_DATETIME = 1, 2, 3, 4, 5, 6, 7, 8
_UTF8 = frozenset({"utf8mb4", "utf8mb3", "utf8"})


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


# ------------------------------------------------------------------ the native path

def native_available() -> bool:
    """Whether ``_snaprowc`` was built and imports (``native_import_error()`` says why not)."""
    return _snaprowc is not None


def native_import_error() -> str:
    return _IMPORT_ERROR


def text_plan(table: SourceTable, enc: RowEncoder) -> Any | None:
    """The native encoder's plan for ``table``'s snapshot rows (its columns in the order
    ``batches`` selects them, encoded as ``enc`` does), or None when a column needs the
    Python path (SET, BIT, TIME, JSON, a charset other than UTF-8 and ASCII)."""
    if _snaprowc is None:
        return None
    cols: list[tuple[int, int, bool, int]] = []
    for c, cid, ctype, nullable in enc.plan:
        kind, a = c.kind, 0
        if kind == "int" and ctype == binlog_pb2.INT:
            op = T_INT
        elif kind == "uint" and ctype == binlog_pb2.UINT:
            op = T_UINT
        elif kind == "float" and ctype == binlog_pb2.FLOAT:
            op, a = T_FLOAT, int(c.is_float32)
        elif kind == "decimal" and ctype == binlog_pb2.DECIMAL:
            op = T_DECIMAL
        elif kind == "string" and ctype == binlog_pb2.STRING and c.is_enum:
            op = T_STRING  # an ENUM's member text is UTF-8 as the server sends it (as_binlog_value)
        elif kind == "string" and ctype == binlog_pb2.STRING and not c.is_set and (c.charset or "utf8mb4") in _UTF8:
            op = T_STRING
        elif kind == "string" and ctype == binlog_pb2.STRING and not c.is_set and c.charset == "ascii":
            op, a = T_STRING, 1
        elif kind == "bytes" and ctype == binlog_pb2.BYTES and not c.is_bit:
            op, a = T_BYTES, int(c.length) if c.is_fixed_binary and c.length else 0
        elif kind == "date" and ctype == binlog_pb2.DATE:
            op = T_DATE
        elif kind == "datetime" and ctype == binlog_pb2.DATETIME:
            op = T_DATETIME
        else:
            return None
        cols.append((op, int(cid), bool(nullable), a))
    try:
        return _snaprowc.Plan(cols)
    except (ValueError, TypeError, OverflowError):
        return None


# One batch of the native path: PyMySQL's parser of one row packet (its converters,
# the Python path's), and the payloads of the batch's row packets, not yet parsed.
RawBatch = tuple[Callable[[Any], tuple[Any, ...]], list[bytes]]
# Bytes asked of the connection at a time when the row packets are split natively.
READ_CHUNK = 1 << 20


def raw_batches(conn: Any, table: SourceTable, rows: int) -> Iterator[RawBatch]:
    """The table's rows as ``batches`` reads them, ``rows`` at a time, but as the row
    packets' payloads of the result, unparsed: ``packets_rows`` gives ``batches``' rows
    from them, the native encoder (``text_plan``) the serialized Rows. Read in a thread
    one batch ahead of the caller (``readahead``)."""
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise ValueError(f"rows must be a positive integer, got {rows!r}")
    select = ", ".join(f"`{c.name.replace('`', '``')}`" for c in table.columns)

    def read(put: Callable[[RawBatch], None]) -> None:
        cur = conn.cursor(pymysql.cursors.SSCursor)  # unbuffered: memory bounded by the batches held
        cur.execute(f"SELECT {select} FROM `{table.db}`.`{table.name}`")
        # PyMySQL's own steps for an unbuffered result (MySQLResult._read_rowdata_packet_unbuffered),
        # without parsing each row; a PyMySQL without them fails here, in every test of the snapshot.
        result = cur._result
        parse = result._read_row_from_packet
        if _snaprowc is not None:
            _read_split(conn, rows, lambda batch: put((parse, batch)))
        else:
            read_packet = conn._read_packet
            batch: list[bytes] = []
            while True:
                packet = read_packet()
                if result._check_packet_is_eof(packet):
                    break
                batch.append(packet._data)
                if len(batch) >= rows:
                    put((parse, batch))
                    batch = []
            if batch:
                put((parse, batch))
        result.unbuffered_active = False
        result.connection = None
        result.rows = None
        cur.close()

    yield from readahead.ahead(read, depth=1, name=f"snapshot-read-{table.name}")


def _read_split(conn: Any, rows: int, put: Callable[[list[bytes]], None]) -> None:
    """The rest of an unbuffered result's row packets read from ``conn``'s socket in
    chunks of ``READ_CHUNK`` bytes and split by ``_snaprowc.frames``, ``rows``
    payloads per ``put``, up to its EOF packet (PyMySQL's steps, ``_read_packet``,
    cost 3-4 us a row in Python). An error packet raises as PyMySQL raises it; a
    lost connection raises PyMySQL's OperationalError."""
    assert _snaprowc is not None
    rfile = conn._rfile
    if conn._current_timeout != conn._read_timeout:
        conn._sock.settimeout(conn._read_timeout)
        conn._current_timeout = conn._read_timeout
    buf, pos = bytearray(), 0
    batch: list[bytes] = []
    while True:
        got, pos, status = _snaprowc.frames(buf, pos, rows - len(batch))
        if status == _snaprowc.FRAMES_ERROR:
            conn._force_close()
            pymysql.protocol.MysqlPacket(got.pop(), conn.encoding).raise_for_error()
        batch += got
        if len(batch) >= rows:
            put(batch)
            batch = []
        if status == _snaprowc.FRAMES_EOF:
            if pos != len(buf):  # nothing follows a SELECT's result until the next command
                conn._force_close()
                raise pymysql.err.InternalError(f"{len(buf) - pos} unexpected bytes after a result's end")
            break
        if status == _snaprowc.FRAMES_MORE:
            del buf[:pos]
            pos = 0
            try:
                chunk = rfile.read1(READ_CHUNK)
            except OSError as exc:
                conn._force_close()
                raise pymysql.err.OperationalError(
                    2013, f"Lost connection to MySQL server during query ({exc})") from None
            if not chunk:
                conn._force_close()
                raise pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
            buf += chunk
    if batch:
        put(batch)


def packets_rows(raw: RawBatch, table: SourceTable) -> list[dict[str, Any]]:
    """The rows of a ``raw_batches`` batch exactly as ``batches`` gives them."""
    parse, payloads_ = raw
    packet = pymysql.protocol.MysqlPacket
    return [{c.name: as_binlog_value(v, c) for c, v in zip(table.columns, parse(packet(p, "")), strict=True)}
            for p in payloads_]


def payloads(raw: RawBatch) -> list[bytes]:
    """The row packets' payloads, for the native encoder."""
    return raw[1]
