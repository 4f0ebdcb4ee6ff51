"""Hand-written protobuf encodings of the two messages a source's bulk path writes
most: a PREWRITE ``Binlog`` and the ``WriteBinlogsReq`` batch that carries it.

Why: each is mostly one large bytes field (the transaction's serialized
PrewriteValue, the batch's payloads). Built through the protobuf library, the
bytes were copied into the message and then again, with the encoder's buffer
growth, into its serialization, a few times per megabyte written, all under
the GIL the source's reader needs; here each is one ``b"".join`` (one copy).
The output is byte for byte what the library serializes for the same fields
(fields in number order, zero scalars omitted; ``tests/unit/test_wire.py``).
"""

from __future__ import annotations

from typing import NamedTuple

from binlake.codec import wire_tag
from binlake.proto import binlog_pb2, pump_pb2


def varint(n: int) -> bytes:
    """``n`` (0 <= n < 2**64; a negative int64 as its two's complement) as a protobuf varint."""
    if n < 0:
        n += 1 << 64
    if not 0 <= n < 1 << 64:
        raise ValueError(f"a varint holds 0..2**64-1 (or a negative int64), got {n!r}")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# The one-byte tags of the fields written here (codec.wire_tag: binlog.proto's and pump.proto's).
BINLOG_TP = bytes([wire_tag(binlog_pb2.Binlog, "tp")])
_START_TS = bytes([wire_tag(binlog_pb2.Binlog, "start_ts")])
_PREWRITE_KEY = bytes([wire_tag(binlog_pb2.Binlog, "prewrite_key")])
_PREWRITE_VALUE = bytes([wire_tag(binlog_pb2.Binlog, "prewrite_value")])
_CLUSTER_ID = bytes([wire_tag(pump_pb2.WriteBinlogsReq, "cluster_id")])
_PAYLOADS = bytes([wire_tag(pump_pb2.WriteBinlogsReq, "payloads")])
_BATCH_ID = bytes([wire_tag(pump_pb2.WriteBinlogsReq, "batch_id")])


class EncodedPrewrite(NamedTuple):
    """A PREWRITE binlog already serialized (``prewrite``), with the start_ts the
    PumpClient places it by."""

    start_ts: int
    payload: bytes


def prewrite(start_ts: int, key: bytes, value: bytes) -> EncodedPrewrite:
    """``Binlog(tp=PREWRITE, start_ts=start_ts, prewrite_key=key, prewrite_value=value)``
    serialized (tp PREWRITE is 0: not written)."""
    if isinstance(start_ts, bool) or not isinstance(start_ts, int) or start_ts <= 0:
        raise ValueError(f"start_ts must be a positive integer, got {start_ts!r}")
    parts = [_START_TS, varint(start_ts)]
    if key:
        parts += [_PREWRITE_KEY, varint(len(key)), key]
    if value:
        parts += [_PREWRITE_VALUE, varint(len(value)), value]
    return EncodedPrewrite(start_ts, b"".join(parts))


def write_binlogs_req(cluster_id: int, payloads: list[bytes], batch_id: int) -> bytes:
    """``WriteBinlogsReq(cluster_id=..., payloads=..., batch_id=...)`` serialized."""
    parts: list[bytes] = []
    if cluster_id:
        parts += [_CLUSTER_ID, varint(cluster_id)]
    for p in payloads:
        parts += [_PAYLOADS, varint(len(p)), p]
    if batch_id:
        parts += [_BATCH_ID, varint(batch_id)]
    return b"".join(parts)
