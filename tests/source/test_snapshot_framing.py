"""The snapshot's row packets split natively (``_snaprowc.frames``, ``snapshot._read_split``):
every payload exactly as PyMySQL's own reader gives it, in batches of the size asked,
whatever the chunks the bytes arrive in; multi-packet rows joined; an error packet or a
lost connection raised as PyMySQL raises them."""

from __future__ import annotations

import random
import socket
import threading
from typing import Any

import pymysql
import pytest

from binlake.source.mysql import snapshot

_snaprowc = pytest.importorskip("binlake.source.mysql._snaprowc")
MAX = 0xFFFFFF


def packets(payload: bytes, seq: int = 0) -> bytes:
    """``payload`` as the protocol sends it: packets of at most 2^24-1 bytes, a last
    shorter one (empty when the payload is a multiple)."""
    out = b""
    while True:
        part, payload = payload[:MAX], payload[MAX:]
        out += len(part).to_bytes(3, "little") + bytes([seq % 256]) + part
        seq += 1
        if len(part) < MAX:
            return out


EOF_PACKET = b"\xfe\x00\x00\x22\x00"  # warnings 0, status: autocommit, no more results


def test_frames_splits_rows_stops_at_the_eof_and_before_a_partial_packet() -> None:
    rows = [b"\x01a", b"\x02bc", b"\xfe" + b"x" * 10]  # a row may start with 0xfe (an 8-byte length)
    buf = b"".join(packets(r) for r in rows) + packets(EOF_PACKET)
    assert _snaprowc.frames(buf, 0, 10) == (rows, len(buf), _snaprowc.FRAMES_EOF)
    assert _snaprowc.frames(buf, 0, 2) == (rows[:2], 13, _snaprowc.FRAMES_FULL)
    assert _snaprowc.frames(buf, 13, 2) == (rows[2:], len(buf), _snaprowc.FRAMES_EOF)
    for cut in range(len(buf)):
        got, pos, status = _snaprowc.frames(buf[:cut], 0, 10)
        assert status == _snaprowc.FRAMES_MORE and b"".join(packets(r) for r in got) == buf[:pos]
    with pytest.raises(ValueError, match="max_rows"):
        _snaprowc.frames(buf, 0, 0)
    with pytest.raises(ValueError, match="pos"):
        _snaprowc.frames(buf, len(buf) + 1, 1)


def test_frames_joins_a_row_of_several_packets_and_stops_at_an_error() -> None:
    big = b"\xfc" + b"z" * MAX  # exactly 2^24 bytes: a full packet, then a 1-byte one
    exact = b"\x05" + b"y" * (MAX - 1)  # exactly 2^24-1: a full packet, then an empty one
    error = b"\xff\x10\x04#HY000boom"
    buf = packets(big) + packets(exact) + packets(error)
    got, pos, status = _snaprowc.frames(buf, 0, 10)
    assert status == _snaprowc.FRAMES_ERROR and got == [big, exact, error]
    assert pos == len(packets(big)) + len(packets(exact))
    # A chain not yet whole is not taken.
    assert _snaprowc.frames(buf[:MAX + 8], 0, 10) == ([], 0, _snaprowc.FRAMES_MORE)
    assert _snaprowc.frames(buf[:MAX + 9], 0, 10) == ([big], MAX + 9, _snaprowc.FRAMES_MORE)


class _Conn:
    """The parts of a PyMySQL connection ``_read_split`` uses, over a real socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._rfile = sock.makefile("rb")
        self._read_timeout: float | None = 10.0
        self._current_timeout: float | None = None
        self.encoding = "utf8"
        self.closed = False

    def _force_close(self) -> None:
        self.closed = True


def _serve(data: bytes, chunk_sizes: list[int], close: bool = False) -> tuple[_Conn, threading.Thread]:
    ours, theirs = socket.socketpair()

    def send() -> None:
        at = 0
        for size in chunk_sizes:
            theirs.sendall(data[at:at + size])
            at += size
        theirs.sendall(data[at:])
        if close:
            theirs.close()

    t = threading.Thread(target=send, daemon=True)
    t.start()
    return _Conn(ours), t


@pytest.mark.parametrize("seed", range(5))
def test_read_split_gives_every_row_in_batches_whatever_the_chunks(seed: int) -> None:
    rng = random.Random(seed)
    rows = [bytes([1 + rng.randrange(200)]) + rng.randbytes(rng.randrange(0, 300)) for _ in range(5000)]
    rows.insert(1234, b"\x01" + b"w" * (MAX + 100))  # one row over a packet
    data = b"".join(packets(r) for r in rows) + packets(EOF_PACKET)
    conn, t = _serve(data, [rng.randrange(1, 5000) for _ in range(200)])
    batches: list[list[bytes]] = []
    snapshot._read_split(conn, 777, batches.append)
    t.join()
    assert [len(b) for b in batches[:-1]] == [777] * (len(batches) - 1) and 0 < len(batches[-1]) <= 777
    assert [r for b in batches for r in b] == rows
    assert not conn.closed


def test_read_split_raises_the_servers_error_and_a_lost_connection() -> None:
    error = b"\xff" + (1317).to_bytes(2, "little") + b"#70100Query execution was interrupted"
    conn, t = _serve(packets(b"\x01a") + packets(error), [])
    got: list[Any] = []
    with pytest.raises(pymysql.err.OperationalError, match="interrupted") as caught:
        snapshot._read_split(conn, 10, got.append)
    assert caught.value.args[0] == 1317 and conn.closed
    t.join()
    conn, t = _serve(packets(b"\x01a") + packets(b"\x01b")[:3], [], close=True)
    with pytest.raises(pymysql.err.OperationalError, match="Lost connection") as lost:
        snapshot._read_split(conn, 10, got.append)
    assert lost.value.args[0] == 2013 and conn.closed
    t.join()
