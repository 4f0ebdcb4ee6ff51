"""The transaction-status service an upstream writer serves.

A Pump that holds a prewrite whose commit never came asks the writer named by
the prewrite's ``prewrite_key``: committed (with its commit_ts), rolled back,
or still running. The answer comes from a ``StatusProvider``; ``TxnWriter``
backs it with the status table it writes in the same database transaction as
the data, so the answer is exactly what the upstream holds.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

import grpc

from binlake import errors, net, rpc

# The states and the client side live in binlake.client.txn_status (all a Pump
# needs); the writers that serve them import the states from here too.
from binlake.client.txn_status import COMMITTED, ROLLED_BACK, RUNNING, STATES
from binlake.proto import upstream_pb2, upstream_pb2_grpc

log = logging.getLogger(__name__)


class StatusProvider(Protocol):
    def txn_status(self, start_ts: int) -> tuple[str, int]:
        """(RUNNING | COMMITTED | ROLLED_BACK, commit_ts or 0)."""
        ...


class MemoryStatusProvider:
    """Outcomes kept in memory: for tools and tests that play the upstream."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outcomes: dict[int, tuple[str, int]] = {}

    def set_committed(self, start_ts: int, commit_ts: int) -> None:
        with self._lock:
            self._outcomes[start_ts] = (COMMITTED, commit_ts)

    def set_rolled_back(self, start_ts: int) -> None:
        with self._lock:
            self._outcomes[start_ts] = (ROLLED_BACK, 0)

    def txn_status(self, start_ts: int) -> tuple[str, int]:
        with self._lock:
            return self._outcomes.get(start_ts, (RUNNING, 0))


class _Servicer(upstream_pb2_grpc.TxnStatusServicer):
    def __init__(self, provider: StatusProvider) -> None:
        self._provider = provider

    @rpc.servicer_method
    def GetTxnStatus(self, request: upstream_pb2.GetTxnStatusReq, context: grpc.ServicerContext
                     ) -> upstream_pb2.GetTxnStatusResp:
        if request.start_ts <= 0:
            raise errors.InvalidArgument(f"start_ts must be > 0, got {request.start_ts}")
        state, commit_ts = self._provider.txn_status(request.start_ts)
        return upstream_pb2.GetTxnStatusResp(state=STATES[state], commit_ts=commit_ts)


class TxnStatusServer:
    """gRPC server for the TxnStatus service on ``addr`` (port 0 = any free port)."""

    def __init__(self, provider: StatusProvider, addr: str = "127.0.0.1:0") -> None:
        net.parse_addr(addr, "txn status addr")
        self._server = rpc.create_server(4, "txn-status")
        upstream_pb2_grpc.add_TxnStatusServicer_to_server(_Servicer(provider), self._server)
        host = addr.rpartition(":")[0]
        port = rpc.add_port(self._server, addr)
        if port == 0:
            raise errors.Unavailable(f"cannot listen on {addr}")
        self.addr = f"{host}:{port}"

    def start(self) -> TxnStatusServer:
        self._server.start()
        return self

    def stop(self, grace: float = 2.0) -> None:
        self._server.stop(grace).wait()


__all__ = ["COMMITTED", "ROLLED_BACK", "RUNNING", "MemoryStatusProvider", "StatusProvider", "TxnStatusServer"]
