"""The ordered index over the value log (LevelDB through plyvel).

Key layout (every ts is a big-endian u64, so byte order is ts order):

``W`` start_ts -> Pointer(prewrite) floor(u64) prewrite_key
    Invariant: present iff the prewrite is indexed (so durable in the value log)
    and no commit or rollback for start_ts is indexed yet (the transaction is
    pending). ``floor`` is the sorter's floor for it (``pump.sorter``): the
    bound when it was indexed; absent in older stores (then start_ts).
    ``prewrite_key`` (the writer to ask about it) lets the resolver work from
    the index alone, never reading the prewrite; absent in older stores. A
    transaction whose prewrite and outcome are indexed in the same batch never
    has one (it would be put and deleted in one atomic write).
``T`` start_ts -> b"C" commit_ts(u64) Pointer(prewrite) | b"R" Pointer(prewrite)
    Invariant: the transaction's outcome, written in the same batch that deletes
    its ``W`` key; kept until GC removes the transaction.
``C`` commit_ts start_ts -> Pointer(prewrite)
    Invariant: present iff the transaction committed, its commit record is
    durable, and commit_ts >= gc_ts. Reads of a window scan exactly these keys.
``R`` start_ts -> b""
    Invariant: present iff the transaction was rolled back and not yet collected.
The index lags the value log: the Pump acknowledges a binlog once the value
log's fsync covers it, and its indexer applies durable records later, in log
order, in batches (``pump.storage``). Every invariant above therefore speaks of
the log prefix before ``Mhead``; the records after it are durable, possibly
acknowledged, and not yet reflected here.

``M`` name -> value: meta, always written in the same batch as the keys it covers:
    ``Mhead``  (segment u32, offset u64): every value-log record before it is
               reflected in the index, none after it; recovery replays the log
               from here (idempotently) before taking new writes.
    ``Mbound`` u64: the largest fake-binlog ts or commit_ts stored (safe-ts bound).
    ``Mmaxcommit`` u64: the largest real commit_ts stored.
    ``Mgc``    u64: the GC ts; nothing committed below it is served.
"""

from __future__ import annotations

import pathlib
import struct
from collections.abc import Iterator

import plyvel

from binlake.pump.vlog import POINTER, Pointer

U64 = struct.Struct(">Q")
HEAD = struct.Struct(">IQ")

P_WAIT = b"W"
P_TXN = b"T"
P_COMMIT = b"C"
P_ROLLBACK = b"R"
META_HEAD = b"Mhead"
META_BOUND = b"Mbound"
META_MAX_COMMIT = b"Mmaxcommit"
META_GC = b"Mgc"


def wait_key(start_ts: int) -> bytes:
    return P_WAIT + U64.pack(start_ts)


def txn_key(start_ts: int) -> bytes:
    return P_TXN + U64.pack(start_ts)


def wait_value(ptr: Pointer, floor: int, prewrite_key: bytes) -> bytes:
    return ptr.pack() + U64.pack(floor) + prewrite_key


def commit_key(commit_ts: int, start_ts: int) -> bytes:
    return P_COMMIT + U64.pack(commit_ts) + U64.pack(start_ts)


def rollback_key(start_ts: int) -> bytes:
    return P_ROLLBACK + U64.pack(start_ts)


def decode_commit_key(key: bytes) -> tuple[int, int]:
    return U64.unpack_from(key, 1)[0], U64.unpack_from(key, 9)[0]


def encode_committed(commit_ts: int, ptr: Pointer) -> bytes:
    return b"C" + U64.pack(commit_ts) + ptr.pack()


def encode_rolled_back(ptr: Pointer) -> bytes:
    return b"R" + ptr.pack()


def decode_txn(value: bytes) -> tuple[str, int, Pointer]:
    """(outcome "C"/"R", commit_ts or 0, prewrite pointer)."""
    if value[:1] == b"C":
        return "C", U64.unpack_from(value, 1)[0], Pointer.unpack(value, 9)
    return "R", 0, Pointer.unpack(value, 1)


class Index:
    """A thin wrapper: open/close, meta accessors, and prefix scans."""

    def __init__(self, directory: str | pathlib.Path) -> None:
        self.db = plyvel.DB(str(directory), create_if_missing=True)

    def get_u64(self, key: bytes, default: int = 0) -> int:
        value = self.db.get(key)
        return U64.unpack(value)[0] if value else default

    def head(self) -> tuple[int, int] | None:
        value = self.db.get(META_HEAD)
        return HEAD.unpack(value) if value else None

    def pending(self) -> list[tuple[int, Pointer]]:
        return [
            (U64.unpack_from(k, 1)[0], Pointer.unpack(v))
            for k, v in self.db.iterator(prefix=P_WAIT)
        ]

    def pending_floors(self) -> list[tuple[int, Pointer, int | None]]:
        """(start_ts, prewrite pointer, stored floor or None) of pending transactions."""
        out: list[tuple[int, Pointer, int | None]] = []
        for k, v in self.db.iterator(prefix=P_WAIT):
            floor = U64.unpack_from(v, POINTER.size)[0] if len(v) >= POINTER.size + U64.size else None
            out.append((U64.unpack_from(k, 1)[0], Pointer.unpack(v), floor))
        return out

    def pending_keys(self, after: int, limit: int) -> list[tuple[int, Pointer, bytes]]:
        """Up to ``limit`` pending transactions with start_ts above ``after``, in
        start_ts order: (start_ts, prewrite pointer, prewrite_key; b"" in older stores)."""
        out: list[tuple[int, Pointer, bytes]] = []
        with self.db.iterator(start=wait_key(after + 1), stop=b"X") as it:  # the W keys above ``after``
            for k, v in it:
                out.append((U64.unpack_from(k, 1)[0], Pointer.unpack(v), v[POINTER.size + U64.size:]))
                if len(out) >= limit:
                    break
        return out

    def commits(self, start_ts: int, end_ts: int) -> Iterator[tuple[int, int, Pointer]]:
        """(commit_ts, start_ts, Pointer) for commit_ts in [start_ts, end_ts), in order."""
        it = self.db.iterator(start=P_COMMIT + U64.pack(start_ts), stop=P_COMMIT + U64.pack(end_ts))
        for key, value in it:
            commit_ts, txn_start = decode_commit_key(key)
            yield commit_ts, txn_start, Pointer.unpack(value)

    def close(self) -> None:
        self.db.close()


__all__ = ["POINTER", "Index"]
