"""The native replication-stream framer (``source.mysql._framec``) against
mysql-replication's own reader, on generated event streams.

The contract (stated in ``_framec.c``): for every event the framer decodes,
its fields are what mysql-replication reads from the same packet (the rows
events' bitmaps and the span of their row images included, which is what the
native row decoder is handed); events it does not read the same way come back
RAW (the whole packet, for mysql-replication); events the source ignores are
dropped as mysql-replication's only_events drops them. Hypothesis builds
streams of GTID / QUERY / TABLE_MAP / rows (v1, v2, with and without extra row
info) / XID / ROTATE / heartbeat / ignored events, with and without CRC32
checksums, cut into protocol packets and fed in arbitrary chunks; each event
is parsed both ways. No server needed: the end-to-end equality on a real
MariaDB is ``test_mysql_native_rows.test_source_sends_the_same_with_and_without_native``.
"""

from __future__ import annotations

import random
import struct
import zlib
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymysql.protocol import MysqlPacket
from pymysqlreplication.event import FormatDescriptionEvent, RotateEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import TableMapEvent, UpdateRowsEvent

from binlake.source.mysql import framing

pytestmark = pytest.mark.skipif(not framing.available(), reason=f"_framec not built: {framing.import_error()}")

ALLOWED = frozenset(framing.EVENTS) | {FormatDescriptionEvent, TableMapEvent, RotateEvent}
ROWS_TYPES = sorted(framing.ROWS)


def _event(kind: int, body: bytes, ts: int, pos: int, checksum: bool) -> bytes:
    """One event as a protocol payload (OK marker, header, body, CRC32 from zlib)."""
    size = 19 + len(body) + (4 if checksum else 0)
    ev = struct.pack("<IBIIIH", ts, kind, 1, size, pos, 0) + body
    if checksum:
        ev += struct.pack("<I", zlib.crc32(ev))
    return b"\x00" + ev


def _packets(payload: bytes) -> bytes:
    """Protocol packets: 16 MiB - 1 per packet, the last one shorter (maybe empty)."""
    out, seq = [], 0
    while True:
        chunk, payload = payload[:0xFFFFFF], payload[0xFFFFFF:]
        out.append(len(chunk).to_bytes(3, "little") + bytes([seq & 0xFF]) + chunk)
        seq += 1
        if len(chunk) < 0xFFFFFF:
            return b"".join(out)


def _lenenc(n: int) -> bytes:
    if n < 251:
        return bytes([n])
    if n < 1 << 16:
        return b"\xfc" + n.to_bytes(2, "little")
    return b"\xfd" + n.to_bytes(3, "little")


_names = st.binary(min_size=1, max_size=12).map(lambda b: b.hex().encode())
_query_status = st.lists(st.sampled_from([b"\x00" + b"\x00\x00\x00\x00", b"\x01" + b"\x00" * 8,
                                          b"\x04" + b"\x21\x00\x21\x00\x08\x00"]), max_size=3).map(b"".join)


@st.composite
def _bodies(draw: Any) -> tuple[int, bytes]:
    kind = draw(st.sampled_from(["query", "rotate", "xid", "gtid", "mysql_gtid", "heartbeat", "table_map", "rows",
                                 "ignored"]))
    if kind == "query":
        schema = draw(st.binary(max_size=10).map(lambda b: b.hex().encode()))
        status = draw(_query_status)
        text = draw(st.sampled_from([b"BEGIN", b"COMMIT", b"CREATE TABLE t (a INT)", b"", b"caf\xc3\xa9 \xff"]))
        return 2, struct.pack("<IIBHH", 7, 0, len(schema), 0, len(status)) + status + schema + b"\x00" + text
    if kind == "rotate":
        return 4, struct.pack("<Q", draw(st.integers(4, 2**40))) + draw(_names)
    if kind == "xid":
        return 16, struct.pack("<Q", draw(st.integers(0, 2**64 - 1)))
    if kind == "gtid":
        return 162, struct.pack("<QIB", draw(st.integers(0, 2**64 - 1)), draw(st.integers(0, 2**32 - 1)), 0) + bytes(6)
    if kind == "mysql_gtid":
        return 33, b"\x01" + bytes(range(16)) + struct.pack("<QBQQ", draw(st.integers(1, 2**40)), 2, 3, 4)
    if kind == "heartbeat":
        return 27, draw(_names)
    if kind == "ignored":
        return draw(st.sampled_from([5, 160, 161, 163, 3])), draw(st.binary(max_size=30))
    if kind == "table_map":
        ncols = draw(st.integers(1, 20))
        schema, table = draw(_names), draw(_names)
        return 19, (draw(st.integers(0, 2**48 - 1)).to_bytes(6, "little") + b"\x01\x00"
                    + bytes([len(schema)]) + schema + b"\x00" + bytes([len(table)]) + table + b"\x00"
                    + _lenenc(ncols) + bytes([3]) * ncols + _lenenc(0) + bytes((ncols + 7) // 8))
    t = draw(st.sampled_from(ROWS_TYPES))
    ncols = draw(st.sampled_from([1, 7, 8, 9, 64, 250, 251, 300]))
    head = draw(st.integers(0, 2**48 - 1)).to_bytes(6, "little") + b"\x01\x00"
    if t >= 30:
        extra = draw(st.sampled_from([b"", b"", b"\x01\x05\x00", b"\x01\x05\x00\x06\x00", b"\x02abc"]))
        if extra.startswith(b"\x01") and (len(extra) == 5) != (t == 31):
            extra = b""  # partition info: 2 ids for updates, 1 otherwise
        head += struct.pack("<H", 2 + len(extra)) + extra
    bm = (ncols + 7) // 8
    head += _lenenc(ncols) + draw(st.binary(min_size=bm, max_size=bm))
    if t in framing.UPDATES:
        head += draw(st.binary(min_size=bm, max_size=bm))
    return t, head + draw(st.binary(max_size=200))


def _reference(payload: bytes, checksum: bool, table_map: dict[int, Any]) -> tuple[Any, ...] | None:
    """What mysql-replication reads from one packet, in the framer's tuple shape."""
    ctl = SimpleNamespace(charset="utf8mb4", _get_dbms=lambda: "mysql")
    if payload[5] == 19:
        # The framer reports every TABLE_MAP (the source caches them by body); with
        # freeze_schema mysql-replication skips one whose table id it knows, so it
        # reads each here as a new id (as NativeReader.event does).
        table_map.pop(int.from_bytes(payload[20:26], "little"), None)
    w = BinLogPacketWrapper(MysqlPacket(payload, "utf8mb4"), table_map, ctl, (8, 0, 30), checksum, ALLOWED, None,
                            None, None, None, True, False, False, False, False)
    ev = w.event
    if ev is None:
        return None
    ts, pos = w.timestamp, w.log_pos
    if w.event_type == 2:
        return (2, ts, pos, ev.schema.decode(), ev.query)
    if w.event_type == 4:
        return (4, ts, pos, ev.position, ev.next_binlog.encode())
    if w.event_type in (16, 27, 33, 162):
        return (w.event_type, ts, pos)
    if w.event_type == 19:
        end = len(payload) - (4 if checksum else 0)
        table_map[ev.table_id] = ev.get_table()
        return (19, ts, pos, ev.table_id, payload[20:end], payload)
    if w.event_type in framing.ROWS:
        start = w.packet._position
        return (w.event_type, ts, pos, ev.table_id, payload, start, start + ev.event_size - w.read_bytes,
                ev.number_of_columns, ev.columns_present_bitmap,
                ev.columns_present_bitmap2 if isinstance(ev, UpdateRowsEvent) else None)
    return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(_bodies(), min_size=1, max_size=25), checksum=st.booleans(),
       cuts=st.lists(st.integers(1, 400), max_size=20), ts=st.integers(0, 2**32 - 1))
def test_framer_reads_what_mysql_replication_reads(events: list[tuple[int, bytes]], checksum: bool,
                                                   cuts: list[int], ts: int) -> None:
    payloads = [_event(kind, body, ts, 1000 + i * 100, checksum) for i, (kind, body) in enumerate(events)]
    table_map: dict[int, Any] = {}
    expected: list[tuple[Any, ...]] = []
    for p in payloads:
        kind = p[5]
        if kind in framing.ROWS:
            tid = int.from_bytes(p[20:26], "little")
            table_map.setdefault(tid, SimpleNamespace(data={"primary_key": None}, schema="s", table="t", columns=[]))
        ref = _reference(p, checksum, table_map)
        if kind in (30, 31, 32) and int.from_bytes(p[28:30], "little") > 2:
            # extra row info: left to mysql-replication
            expected.append((framing.RAW, kind, ts, int.from_bytes(p[14:18], "little"), p))
        elif ref is not None:
            expected.append(ref)
    stream = b"".join(_packets(p) for p in payloads)
    framer = framing._framec.Framer(checksum)
    got: list[tuple[Any, ...]] = []
    at = 0
    for n in cuts:
        got += framer.feed(stream[at:at + n])
        at += n
    got += framer.feed(stream[at:])
    assert framer.pending() == 0
    assert [_decoded(t) for t in got] == expected


def _decoded(t: tuple[Any, ...]) -> tuple[Any, ...]:
    """A QUERY's text as the native reader decodes it (``framing.NativeReader``)."""
    if t[0] == framing.QUERY:
        return (*t[:3], t[3].decode(), t[4].decode("utf-8", errors="backslashreplace"))
    return t


def test_checksum_mismatch_eof_error_and_multi_packet_payloads() -> None:
    framer = framing._framec.Framer(True)
    good = _event(16, struct.pack("<Q", 5), 1, 500, True)
    bad = good[:-5] + bytes([good[-5] ^ 1]) + good[-4:]
    assert framer.feed(_packets(good)) == [(16, 1, 500)]
    assert framer.feed(_packets(bad)) == [(framing.BADSUM, 16, 500)]
    assert framing._framec.crc32(b"123456789") == zlib.crc32(b"123456789") == 0xCBF43926
    # Sliced by eight bytes: every length around the slice and an unaligned start agree with zlib.
    data = bytes(random.Random(18).randrange(256) for _ in range(9000))
    for n in [*range(40), 1023, 8191]:
        for off in range(3):
            assert framing._framec.crc32(data[off:off + n]) == zlib.crc32(data[off:off + n]), (n, off)
    # A QUERY longer than one protocol packet: joined as PyMySQL joins it.
    query = b"/*" + b"x" * 0xFFFFFF + b"*/"
    big = _event(2, struct.pack("<IIBHH", 1, 0, 1, 0, 0) + b"d\x00" + query, 9, 7000, True)
    stream = _packets(big)
    assert len(stream) > 0xFFFFFF + 4
    assert framer.feed(stream[:1000]) == [] and framer.pending() == 1000
    assert framer.feed(stream[1000:]) == [(2, 9, 7000, b"d", query)]
    assert framer.feed(_packets(b"\xfe\x00\x00\x02\x00")) == [(framing.EOF,)]
    err = b"\xff\x15\x04#28000Access denied"
    assert framer.feed(_packets(err)) == [(framing.ERROR, err)]


def test_env_switch_forces_the_library_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    assert framing.enabled()
    monkeypatch.setenv(framing.NATIVE_FRAMING_ENV, "0")
    assert not framing.enabled()
