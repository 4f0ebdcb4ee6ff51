"""Reading windows of complete transactions from Pumps.

``pull_pump`` streams one Pump's window; ``pull_window`` merges several Pumps'
windows into one ``(commit_ts, start_ts)`` order and keeps one copy of a
transaction that two Pumps hold (a prewrite retried after a failed write; see
``client.pump_client``): both copies share start_ts and commit_ts, so they meet
side by side in the merge.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

import grpc

from binlake import errors, rpc
from binlake.config import GiB
from binlake.proto import binlog_pb2, pump_pb2, pump_pb2_grpc


def pull_pump(
    addr: str, start_ts: int, end_ts: int, *, node_id: str = "", wait: bool = False,
    wait_timeout_s: float = 30.0, timeout_s: float | None = None, max_message_bytes: int = GiB,
    keys_only: bool = False,
) -> Iterator[binlog_pb2.Binlog]:
    """The complete transactions one Pump holds in [start_ts, end_ts), in order
    (``keys_only``: start_ts and commit_ts alone). A transaction larger than the
    Pump's read batch comes in parts (``pump.proto`` BinlogPart), joined here."""
    what = f"pump {node_id or addr}"
    with rpc.channel(addr, rpc.client_options(max_message_bytes)) as channel:
        stub = pump_pb2_grpc.PumpStub(channel)
        req = pump_pb2.PullBinlogsReq(
            start_ts=start_ts, end_ts=end_ts, wait=wait, wait_timeout_ms=int(wait_timeout_s * 1000),
            keys_only=keys_only, accept_parts=True,
        )
        joined = bytearray()
        try:
            for resp in stub.PullBinlogs(req, timeout=timeout_s):
                if resp.HasField("part"):
                    done = _join(joined, resp.part, what)
                    if done is not None:
                        yield done
                    continue
                yield from resp.binlogs
        except grpc.RpcError as exc:
            raise rpc.from_rpc_error(exc, f"reading [{start_ts}, {end_ts}) from {what}") from None
        if joined:
            raise errors.Unavailable(f"{what} ended its window in the middle of a transaction's parts")


def _join(joined: bytearray, part: pump_pb2.BinlogPart, what: str) -> binlog_pb2.Binlog | None:
    """Add one part to ``joined``; the transaction once its last part is in."""
    if part.offset != len(joined):
        raise errors.Unavailable(
            f"{what} sent a part of start_ts {part.start_ts} at offset {part.offset}, expected {len(joined)}")
    joined += part.data
    if len(joined) < part.total_bytes:
        return None
    b: binlog_pb2.Binlog = binlog_pb2.Binlog.FromString(bytes(joined))
    joined.clear()
    b.tp = binlog_pb2.COMMIT
    b.commit_ts = part.commit_ts
    b.prewrite_key = b""
    return b


def merge_dedup(streams: Iterable[Iterator[binlog_pb2.Binlog]]) -> Iterator[binlog_pb2.Binlog]:
    """Merge ordered streams by (commit_ts, start_ts); drop repeated start_ts."""
    merged = heapq.merge(*streams, key=lambda b: (b.commit_ts, b.start_ts))
    last: tuple[int, int] | None = None
    for b in merged:
        key = (b.commit_ts, b.start_ts)
        if key == last:
            continue
        last = key
        yield b


def pull_window(
    pumps: dict[str, str], start_ts: int, end_ts: int, *, wait: bool = False, wait_timeout_s: float = 30.0
) -> Iterator[binlog_pb2.Binlog]:
    """Every Pump's window merged into commit_ts order, duplicates removed."""
    streams = [
        pull_pump(addr, start_ts, end_ts, node_id=node_id, wait=wait, wait_timeout_s=wait_timeout_s)
        for node_id, addr in sorted(pumps.items())
    ]
    return merge_dedup(streams)
