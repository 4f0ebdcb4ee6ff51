"""The Pump's gRPC servicer: protobuf in, ``PumpService`` call, protobuf out."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from binlake import errors, rpc
from binlake.proto import pump_pb2, pump_pb2_grpc
from binlake.pump.metrics import PumpMetrics
from binlake.pump.service import PumpService


def _code_name(err: errors.BinlakeError | None) -> str:
    return "OK" if err is None else rpc.status_code(err).name


def _response(results: list[errors.BinlakeError | None], batch_id: int) -> pump_pb2.WriteBinlogsResp:
    out = pump_pb2.WriteBinlogsResp(batch_id=batch_id)
    for err in results:
        if err is None:
            out.results.add()
        else:
            out.results.add(code=rpc.status_code(err).value[0], message=str(err))
    return out


class PumpServicer(pump_pb2_grpc.PumpServicer):
    def __init__(self, service: PumpService, metrics: PumpMetrics) -> None:
        self.service = service
        self.metrics = metrics

    def _count_refusals(self, results: list[errors.BinlakeError | None]) -> None:
        for err in results:
            if err is not None:
                self.metrics.refusals.labels(_code_name(err)).inc()

    @rpc.servicer_method
    def WriteBinlog(self, request: pump_pb2.WriteBinlogReq, context: grpc.ServicerContext) -> pump_pb2.WriteBinlogResp:
        started = time.perf_counter()
        if not request.payload:
            # The seed's probe: an empty binlog checks the Pump would take a write.
            self.service.probe(request.cluster_id)
            return pump_pb2.WriteBinlogResp()
        (err,) = self.service.write([request.payload], request.cluster_id)
        self.metrics.latency.observe(time.perf_counter() - started)
        self.metrics.requests.labels("WriteBinlog", _code_name(err)).inc()
        if err is not None:
            raise err
        return pump_pb2.WriteBinlogResp()

    @rpc.servicer_method
    def WriteBinlogs(self, request: pump_pb2.WriteBinlogsReq, context: grpc.ServicerContext) -> pump_pb2.WriteBinlogsResp:
        started = time.perf_counter()
        results = self.service.write(list(request.payloads), request.cluster_id)
        self.metrics.latency.observe(time.perf_counter() - started)
        self.metrics.requests.labels("WriteBinlogs", "OK").inc()
        self._count_refusals(results)
        return _response(results, request.batch_id)

    def WriteBinlogStream(self, request_iterator: Iterator[pump_pb2.WriteBinlogsReq], context: grpc.ServicerContext) -> Iterator[pump_pb2.WriteBinlogsResp]:
        """Batches arrive on one stream; each is queued for group commit as soon as
        it is read (a reader thread), and answered in order once durable."""
        pending: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def read_requests() -> None:
            try:
                for req in request_iterator:
                    started = time.perf_counter()
                    try:
                        write = self.service.write_async(list(req.payloads), req.cluster_id)
                    except errors.BinlakeError as exc:
                        pending.put(exc)
                        return
                    pending.put((req.batch_id, started, write))
            except grpc.RpcError:
                pass  # the client went away; answer what was queued
            except Exception as exc:
                pending.put(exc)
            finally:
                pending.put(None)

        threading.Thread(target=read_requests, name="pump-stream-reader", daemon=True).start()
        while True:
            try:
                item = pending.get(timeout=0.2)
            except queue.Empty:
                if self.service.closing:
                    # Shutting down: end idle streams so a graceful stop need
                    # not wait out its grace period; clients reconnect elsewhere.
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"pump {self.service.node_id} is shutting down")
                continue
            if item is None:
                return
            if isinstance(item, errors.BinlakeError):
                context.abort(rpc.status_code(item), str(item))
            if isinstance(item, Exception):
                context.abort(grpc.StatusCode.INTERNAL, f"write stream failed: {item}")
            batch_id, started, write = item
            try:
                results = write.result()
            except errors.BinlakeError as exc:
                context.abort(rpc.status_code(exc), str(exc))
            self.metrics.latency.observe(time.perf_counter() - started)
            self.metrics.requests.labels("WriteBinlogStream", "OK").inc()
            self._count_refusals(results)
            yield _response(results, batch_id)

    @rpc.servicer_stream
    def PullBinlogs(self, request: pump_pb2.PullBinlogsReq, context: grpc.ServicerContext) -> Iterator[pump_pb2.PullBinlogsResp]:
        timeout = request.wait_timeout_ms / 1000.0 if request.wait_timeout_ms > 0 else 30.0
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = min(timeout, max(0.0, remaining - 0.05))
        for batch in self.service.pull(
            request.start_ts, request.end_ts, wait=request.wait, wait_timeout_s=timeout,
            max_txns=request.batch_max_txns, max_bytes=request.batch_max_bytes,
        ):
            if not context.is_active():
                return
            yield pump_pb2.PullBinlogsResp(binlogs=batch, node_id=self.service.node_id)

    @rpc.servicer_method
    def Status(self, request: pump_pb2.StatusReq, context: grpc.ServicerContext) -> pump_pb2.StatusResp:
        s = self.service
        st = s.storage
        return pump_pb2.StatusResp(
            node_id=s.node_id, state=s.state.value, safe_ts=st.safe_ts, max_commit_ts=st.max_commit_ts,
            gc_ts=st.gc_ts, pending_txns=st.pending_count, storage_bytes=st.storage_bytes(),
            disk_free_bytes=s.disk_free(), accepting_writes=s.accepting_writes(),
        )
