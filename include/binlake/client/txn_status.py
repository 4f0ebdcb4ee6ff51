"""Asking a writer about a transaction: the client side of the TxnStatus service.

A Pump that holds a prewrite whose commit never came asks the writer named by
the prewrite's ``prewrite_key``: committed (with its commit_ts), rolled back,
or still running. The server side (what a writer serves) is
``binlake.writer.txn_status``; this module is all a Pump needs, so ``pump/``
does not depend on the upstream role.
"""

from __future__ import annotations

import grpc

from binlake import rpc
from binlake.proto import upstream_pb2, upstream_pb2_grpc

RUNNING = "running"
COMMITTED = "committed"
ROLLED_BACK = "rolled_back"

# The wire enum of each state (the service answers with these).
STATES = {
    RUNNING: upstream_pb2.RUNNING,
    COMMITTED: upstream_pb2.COMMITTED,
    ROLLED_BACK: upstream_pb2.ROLLED_BACK,
}
_NAMES = {v: k for k, v in STATES.items()}


def query_status(addr: str, start_ts: int, timeout_s: float = 5.0) -> tuple[str, int]:
    """Ask the writer at ``addr`` about ``start_ts``: (state, commit_ts or 0)."""
    with rpc.channel(addr) as channel:
        stub = upstream_pb2_grpc.TxnStatusStub(channel)
        try:
            resp = stub.GetTxnStatus(upstream_pb2.GetTxnStatusReq(start_ts=start_ts), timeout=timeout_s)
        except grpc.RpcError as exc:
            raise rpc.from_rpc_error(exc, f"txn status of {start_ts} from writer {addr}") from None
    return _NAMES[resp.state], resp.commit_ts
