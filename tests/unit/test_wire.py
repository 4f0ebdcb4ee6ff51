"""``binlake.client.wire``: the hand-written encodings equal the protobuf library's."""

from __future__ import annotations

import random

import pytest

from binlake.client import wire
from binlake.proto import binlog_pb2, pump_pb2


def test_encodings_equal_the_library() -> None:
    rng = random.Random(18)
    assert wire.varint(0) == b"\x00"
    for n in (1, 127, 128, 16383, 16384, 2**35, 2**63 - 1, 2**64 - 1):
        assert wire.varint(n) == pump_pb2.WriteBinlogsReq(batch_id=n).SerializeToString()[1:]
    assert wire.varint(-1) == b"\xff" * 9 + b"\x01"
    for _ in range(100):
        start_ts = rng.choice([1, 127, 128, 2**40 + 7, 2**63 - 1])
        key = rng.choice([b"", b"mysql-source-1a2b", rng.randbytes(200)])
        value = rng.choice([b"", b"\x08\x01", rng.randbytes(rng.choice([127, 128, 70000]))])
        got = wire.prewrite(start_ts, key, value)
        assert got.start_ts == start_ts
        assert got.payload == binlog_pb2.Binlog(tp=binlog_pb2.PREWRITE, start_ts=start_ts, prewrite_key=key,
                                                prewrite_value=value).SerializeToString()
        payloads = [rng.randbytes(rng.choice([0, 5, 300])) for _ in range(rng.randrange(4))]
        cluster_id, batch_id = rng.choice([0, 1, 2**50]), rng.choice([0, 1, 999, 2**33])
        assert wire.write_binlogs_req(cluster_id, payloads, batch_id) == pump_pb2.WriteBinlogsReq(
            cluster_id=cluster_id, payloads=payloads, batch_id=batch_id).SerializeToString()


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        wire.prewrite(0, b"k", b"v")
    with pytest.raises(ValueError, match="varint"):
        wire.varint(2**64)
