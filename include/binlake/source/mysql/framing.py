"""The replication stream read natively: the source's events from the bytes of
the replica connection, framed by the C ``_framec``, with mysql-replication
kept for what is rare.

mysql-replication still opens the connections, registers as a replica and
sends COM_BINLOG_DUMP (or the GTID dump), exactly as before; after that,
``NativeReader`` reads the connection's socket in large chunks and the C
framer cuts them into packets and events (header, CRC32, the fields of
GTID / QUERY / TABLE_MAP / ROWS / XID / ROTATE / heartbeat). Events it does not
read itself (FORMAT_DESCRIPTION, and any event outside the shapes it knows)
come back as their whole packet, which ``event()`` hands to mysql-replication's
own event classes with the reader's settings, as its ``fetchone`` would; rows
events the native row decoder declines are parsed the same way.

The events yielded are small tuples (``Ev*`` below) in place of
mysql-replication's objects; ``from_library`` turns a library event into the
same tuple, so the source has one event loop for both paths and the equality
tests compare them directly.

``BINLAKE_NATIVE_FRAMING=0`` in the environment forces mysql-replication's own
reader (read when a source starts); without the built extension it is the
only path.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pymysql
from pymysql.protocol import MysqlPacket
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants import BINLOG
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

from binlake.source.readburst import BURST_BYTES

# The extension module (typed by its .pyi), or None where it was not built.
_framec: ModuleType | None
try:  # optional: built by `pip install -e .` (setup.py); without it mysql-replication reads everything
    from binlake.source.mysql import _framec
    _IMPORT_ERROR = ""
except ImportError as _exc:
    _framec = None
    _IMPORT_ERROR = str(_exc)

NATIVE_FRAMING_ENV = "BINLAKE_NATIVE_FRAMING"
READ_CHUNK = 1 << 18  # bytes per socket read: many small events per read when the server is ahead

# Event kinds (the C framer's codes; negative ones are framing outcomes).
QUERY, ROTATE, FORMAT, XID, TABLE_MAP, HEARTBEAT, GTID, MARIADB_GTID = 2, 4, 15, 16, 19, 27, 33, 162
WRITE_V1, UPDATE_V1, DELETE_V1, WRITE_V2, UPDATE_V2, DELETE_V2 = 23, 24, 25, 30, 31, 32
EOF, ERROR, BADSUM, RAW = -1, -2, -3, -4
WRITES = frozenset({WRITE_V1, WRITE_V2})
UPDATES = frozenset({UPDATE_V1, UPDATE_V2})
DELETES = frozenset({DELETE_V1, DELETE_V2})
ROWS = WRITES | UPDATES | DELETES
# Rows events carrying the library's event object (``LIB_ROWS``): from the Python
# reader, or a packet the framer left to mysql-replication.
LIB_ROWS = 1000
LIB_TABLE_MAP = 1001

# What the source asks mysql-replication for (its only_events).
EVENTS = [RotateEvent, GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent, TableMapEvent, WriteRowsEvent,
          UpdateRowsEvent, DeleteRowsEvent, HeartbeatLogEvent]


def available() -> bool:
    """Whether ``_framec`` was built and imports (``import_error()`` says why not)."""
    return _framec is not None


def import_error() -> str:
    return _IMPORT_ERROR


def enabled() -> bool:
    """Built, and not switched off with ``BINLAKE_NATIVE_FRAMING=0``."""
    from binlake import config

    return _framec is not None and config.load(config.NativeSettings).framing


def from_library(ev: Any, log_pos: int) -> tuple[Any, ...] | None:
    """A mysql-replication event as the tuple the native reader gives for it
    (rows events and TABLE_MAPs carry the event object), or None (ignored)."""
    ts = int(ev.timestamp)
    if isinstance(ev, RotateEvent):
        return (ROTATE, ts, log_pos, int(ev.position), ev.next_binlog)
    if isinstance(ev, (GtidEvent, MariadbGtidEvent)):
        return (GTID, ts, log_pos)
    if isinstance(ev, QueryEvent):
        s = ev.schema
        return (QUERY, ts, log_pos, s.decode() if isinstance(s, bytes) else str(s or ""), ev.query)
    if isinstance(ev, XidEvent):
        return (XID, ts, log_pos)
    if isinstance(ev, TableMapEvent):
        return (LIB_TABLE_MAP, ts, log_pos, ev.table_id, ev)
    if isinstance(ev, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
        return (LIB_ROWS, ts, log_pos, ev.table_id, ev)
    if isinstance(ev, HeartbeatLogEvent):
        return (HEARTBEAT, ts, log_pos)
    return None


def library_events(stream: BinLogStreamReader) -> Iterator[tuple[Any, ...]]:
    """mysql-replication's own reader, as tuples (``BINLAKE_NATIVE_FRAMING=0``)."""
    for ev in stream:
        t = from_library(ev, stream.log_pos)
        if t is not None:
            yield t


class NativeReader:
    """Reads a BinLogStreamReader's replica connection through the C framer.

    The tuples it yields: those of ``_framec`` (module docstring there) with
    QUERY's schema and query decoded as mysql-replication decodes them and
    ROTATE's file name as text; RAW packets are resolved here (FORMAT_DESCRIPTION
    updates the framer; a TABLE_MAP or rows event mysql-replication parses comes
    as ``LIB_TABLE_MAP`` / ``LIB_ROWS`` with the event object).
    """

    def __init__(self, stream: BinLogStreamReader, burst_s: float = 0.0) -> None:
        if _framec is None:
            raise RuntimeError(f"the native framer is not built: {_IMPORT_ERROR}")
        self._framec = _framec
        if not 0 <= burst_s <= 0.1:
            raise ValueError(f"burst_s must be in [0, 0.1] seconds, got {burst_s!r}")
        self.stream = stream
        self.framer: Any = None
        self._rfile: Any = None
        # source.readburst: after a small read (a trickle: the socket held less than
        # BURST_BYTES), sleep this long so the next read takes what arrived meanwhile.
        self._burst_s = burst_s
        self._drained = False

    def _connect(self) -> None:
        s = self.stream
        # mysql-replication's own connect: handshake, checksum and heartbeat settings,
        # replica registration, the dump command; nothing of the dump is read yet.
        s._BinLogStreamReader__connect_to_stream()
        s._BinLogStreamReader__connect_to_ctl()
        self.framer = self._framec.Framer(bool(s._BinLogStreamReader__use_checksum))
        # PyMySQL's buffered reader over the socket: whatever it already holds comes first.
        self._rfile = s._stream_connection._rfile

    def _read(self) -> bytes:
        if self._drained and self._burst_s:
            time.sleep(self._burst_s)
        try:
            data: bytes = self._rfile.read1(READ_CHUNK)
        except OSError as exc:
            raise pymysql.err.OperationalError(2013, f"Lost connection to MySQL server ({exc})") from None
        if not data:
            raise pymysql.err.OperationalError(2013, "Lost connection to MySQL server (the replication stream ended)")
        self._drained = len(data) < BURST_BYTES
        return data

    def event(self, packet: bytes) -> Any:
        """mysql-replication's event for one packet, with the bookkeeping its
        ``fetchone`` does (TABLE_MAP cache, FORMAT_DESCRIPTION); None if it
        would not yield it."""
        s = self.stream
        p = "_BinLogStreamReader__"
        if len(packet) >= 26 and packet[5] == BINLOG.TABLE_MAP_EVENT:
            # With freeze_schema mysql-replication ignores a TABLE_MAP of a table id it knows;
            # the native path reads every one (a changed map for a known id replaces it).
            s.table_map.pop(int.from_bytes(packet[20:26], "little"), None)
        w = BinLogPacketWrapper(
            MysqlPacket(packet, s._stream_connection.encoding), s.table_map, s._ctl_connection, s.mysql_version,
            getattr(s, p + "use_checksum"), getattr(s, p + "allowed_events_in_packet"), getattr(s, p + "only_tables"),
            getattr(s, p + "ignored_tables"), getattr(s, p + "only_schemas"), getattr(s, p + "ignored_schemas"),
            getattr(s, p + "freeze_schema"), getattr(s, p + "ignore_decode_errors"), getattr(s, p + "verify_checksum"),
            getattr(s, p + "optional_meta_data"), getattr(s, p + "enable_logging"),
            getattr(s, p + "use_column_name_cache"), getattr(s, p + "post_header_lengths"),
        )
        ev = w.event
        if w.event_type == BINLOG.FORMAT_DESCRIPTION_EVENT and ev is not None:
            s.mysql_version = ev.mysql_version
            setattr(s, p + "post_header_lengths", ev.post_header_len)
            if ev.post_header_len:
                self.framer.set_post_header(bytes(ev.post_header_len))
        if w.event_type == BINLOG.TABLE_MAP_EVENT and ev is not None:
            s.table_map[ev.table_id] = ev.get_table()
        if ev is None or ev.__class__ not in getattr(s, p + "allowed_events"):
            return None
        return ev

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        self._connect()
        s = self.stream
        framer = self.framer
        while True:
            for e in framer.feed(self._read()):
                kind = e[0]
                if kind == QUERY:
                    schema: bytes = e[3]
                    yield (QUERY, e[1], e[2], schema.decode(), e[4].decode("utf-8", errors="backslashreplace"))
                elif kind == ROTATE:
                    if e[1] != 0:
                        s.table_map = {}  # as mysql-replication: table ids may be reused after a server restart
                    yield (ROTATE, e[1], e[3], e[3], e[4].decode())
                elif kind >= 0:
                    yield e
                elif kind == RAW:
                    ev = self.event(e[4])
                    if ev is not None:
                        t = from_library(ev, int(ev.packet.log_pos) or int(e[3]))
                        if t is not None:
                            yield t
                elif kind == EOF:
                    return
                elif kind == ERROR:
                    MysqlPacket(e[1], s._stream_connection.encoding).raise_for_error()
                    raise pymysql.err.OperationalError(2013, "the server sent an error packet")
                else:  # BADSUM
                    raise ConnectionError(f"binlog event (type {e[1]}, end position {e[2]}) failed its CRC32 "
                                          "checksum: corrupt in transit or on the server; re-reading it")
