"""The Pump's gRPC server: protobuf in, ``PumpService`` call, protobuf out.

One servicer on a thread-pool gRPC server. A write stream's batches are read
by a thread of its own and handed to the storage's group commit as soon as
they arrive, then answered in order by the handler's thread once durable, so a
client may keep several batches in flight. The reading thread usually commits
the group itself (validate, append, fsync: the GIL is free while it waits on
the disk; see ``pump.storage``), so the one hand-off of an acknowledgement is
to the handler's thread; the storage's indexer follows behind. When a batch
arrives while an earlier one of the stream is still unanswered (a client with
``max_inflight_batches`` above 1), the reader hands its commit to the storage's
committer thread and reads on, so one batch is fsynced while the next travels:
with one Pump at 16 writers that gave 1-30 % more transactions/s and a 29-41 %
lower p99 in four runs (bench/RESULTS.md). A batch that finds none unanswered
(always, with one batch on the wire) is committed by the reader itself, unless
it is large (``HANDOFF_BYTES``): then too the committer takes it and the reader
reads on, because a client sending that much (a source in bulk, whose group of
megabytes goes out as several batches) most likely has the next batch on the
way, and its fsync of a megabyte or more is long against the thread hop.

There is one servicer, not one per concurrency model: an asyncio servicer
(``grpc.aio`` on uvloop) was measured against this one on the same storage and
lost in 10 of 12 cases (``bench/RESULTS.md``, "Pump write path"), and two
copies of the stream and pull bodies had to be kept in sync by hand.
"""

from __future__ import annotations

import collections
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
from binlake.pump.storage import Part, Results

# A batch of at least this many payload bytes is committed by the storage's committer
# thread even with no other batch unanswered (module docstring): its append and fsync
# (a few milliseconds per megabyte) overlap the reading of the next batch.
HANDOFF_BYTES = 256 << 10
# How often an idle write stream checks whether the Pump is shutting down.
_IDLE_CHECK_S = 0.2


def _code_name(err: errors.BinlakeError | None) -> str:
    return "OK" if err is None else rpc.status_code(err).name


def _response(results: Results, batch_id: int) -> pump_pb2.WriteBinlogsResp:
    out = pump_pb2.WriteBinlogsResp(batch_id=batch_id)
    for err in results:
        if err is None:
            out.results.add()
        else:
            out.results.add(code=rpc.status_code(err).value[0], message=str(err))
    return out


class _Slot:
    """One stream batch's place in the answer order, filled once it is durable."""

    __slots__ = ("batch_id", "started", "results", "_wake")

    def __init__(self, batch_id: int, started: float, wake: queue.SimpleQueue[bool]) -> None:
        self.batch_id = batch_id
        self.started = started
        # One result per binlog, or what failed the whole batch; None until then.
        self.results: Results | BaseException | None = None
        self._wake = wake

    def done(self, results: Results | None, exc: BaseException | None) -> None:
        # Runs on the thread that committed the batch's group (or the reader's, for a refusal): quick.
        self.results = results if results is not None else (exc or errors.Unavailable("pump storage write failed"))
        self._wake.put(False)


class PumpServicer(pump_pb2_grpc.PumpServicer):
    """The Pump's RPCs: a stream's batches are read by a thread of its own and
    answered, in order, by the handler's thread once durable."""

    def __init__(self, service: PumpService, metrics: PumpMetrics) -> None:
        self.service = service
        self.metrics = metrics

    def _count_refusals(self, results: Results) -> None:
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
    def WriteBinlogs(
        self, request: pump_pb2.WriteBinlogsReq, context: grpc.ServicerContext
    ) -> pump_pb2.WriteBinlogsResp:
        started = time.perf_counter()
        results = self.service.write(list(request.payloads), request.cluster_id)
        self.metrics.latency.observe(time.perf_counter() - started)
        self.metrics.requests.labels("WriteBinlogs", "OK").inc()
        self._count_refusals(results)
        return _response(results, request.batch_id)

    def WriteBinlogStream(
        self, request_iterator: Iterator[pump_pb2.WriteBinlogsReq], context: grpc.ServicerContext
    ) -> Iterator[pump_pb2.WriteBinlogsResp]:
        """Batches arrive on one stream; each is queued for group commit as soon as
        it is read (a reader thread), and answered in order once durable.

        Each batch gets a slot in arrival order before it is queued; the thread
        that commits its group fills it (``PumpService.write_cb``) and wakes this thread
        through a SimpleQueue, which answers every filled slot at the head. No
        future or condition per batch: one C-level queue hand-off is all the
        acknowledgement costs this thread."""
        order: collections.deque[_Slot] = collections.deque()
        wake: queue.SimpleQueue[bool] = queue.SimpleQueue()  # True: the reader is done

        def read_requests() -> None:
            try:
                for req in request_iterator:
                    slot = _Slot(req.batch_id, time.perf_counter(), wake)
                    # Another batch of this stream not answered yet (the client pipelines), or a
                    # large one: this thread hands the commit on and reads the next batch meanwhile.
                    payloads = list(req.payloads)
                    may_lead = not order and sum(map(len, payloads)) < HANDOFF_BYTES
                    order.append(slot)  # before queueing: its callback may run at once
                    try:
                        self.service.write_cb(payloads, req.cluster_id, slot.done, may_lead=may_lead)
                    except Exception as exc:  # the whole batch refused (or a bug): the stream ends there
                        slot.done(None, exc)
                        return
            except grpc.RpcError:
                pass  # the client went away; answer what was queued
            except Exception as exc:
                slot = _Slot(0, 0.0, wake)
                order.append(slot)
                slot.done(None, exc)
            finally:
                wake.put(True)

        threading.Thread(target=read_requests, name="pump-stream-reader", daemon=True).start()
        reader_done = False
        while True:
            try:
                reader_done = wake.get(timeout=_IDLE_CHECK_S) or reader_done
            except queue.Empty:
                if self.service.closing:
                    # Shutting down: end idle streams so a graceful stop need
                    # not wait out its grace period; clients reconnect elsewhere.
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"pump {self.service.node_id} is shutting down")
                continue
            while order and order[0].results is not None:
                slot = order.popleft()
                results = slot.results
                if isinstance(results, errors.BinlakeError):
                    context.abort(rpc.status_code(results), str(results))
                if isinstance(results, BaseException):
                    context.abort(grpc.StatusCode.INTERNAL, f"write stream failed: {results}")
                assert isinstance(results, list)
                self.metrics.latency.observe(time.perf_counter() - slot.started)
                self.metrics.requests.labels("WriteBinlogStream", "OK").inc()
                self._count_refusals(results)
                yield _response(results, slot.batch_id)
            if reader_done and not order:
                return

    @rpc.servicer_stream
    def PullBinlogs(
        self, request: pump_pb2.PullBinlogsReq, context: grpc.ServicerContext
    ) -> Iterator[pump_pb2.PullBinlogsResp]:
        timeout = request.wait_timeout_ms / 1000.0 if request.wait_timeout_ms > 0 else 30.0
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = min(timeout, max(0.0, remaining - 0.05))
        node_id = self.service.node_id
        for batch in self.service.pull(
            request.start_ts, request.end_ts, wait=request.wait, wait_timeout_s=timeout,
            max_txns=request.batch_max_txns, max_bytes=request.batch_max_bytes,
            parts=request.accept_parts, keys_only=request.keys_only,
        ):
            if not context.is_active():
                return
            if isinstance(batch, Part):
                yield pump_pb2.PullBinlogsResp(node_id=node_id, part=pump_pb2.BinlogPart(
                    start_ts=batch.start_ts, commit_ts=batch.commit_ts, offset=batch.offset,
                    total_bytes=batch.total, data=batch.data))
            else:
                yield pump_pb2.PullBinlogsResp(binlogs=batch, node_id=node_id)

    @rpc.servicer_method
    def Status(self, request: pump_pb2.StatusReq, context: grpc.ServicerContext) -> pump_pb2.StatusResp:
        s = self.service
        st = s.storage
        # The index lags the acknowledgements by a few milliseconds: a Status
        # reflects every write acknowledged before it was asked for.
        st.wait_indexed(timeout=1.0)
        return pump_pb2.StatusResp(
            node_id=s.node_id, state=s.state.value, safe_ts=st.safe_ts, max_commit_ts=st.max_commit_ts,
            gc_ts=st.gc_ts, pending_txns=st.pending_count, storage_bytes=st.storage_bytes(),
            disk_free_bytes=s.disk_free(), accepting_writes=s.accepting_writes(),
        )


class PumpServer:
    """The Pump's thread-pool gRPC server.

    Built bound (``port`` is known before the servicer is added), so a node can
    derive its id from the port and refuse to start on a taken address.
    """

    def __init__(self, addr: str, options: list[tuple[str, Any]], workers: int) -> None:
        self._server = rpc.create_server(workers, "pump-rpc", options)
        self.port = rpc.add_port(self._server, addr)
        self._stopped = False

    def add(self, servicer: PumpServicer) -> None:
        """Serve ``servicer`` (before ``start``)."""
        pump_pb2_grpc.add_PumpServicer_to_server(servicer, self._server)

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float | None) -> None:
        """Refuse new calls, let running ones finish within ``grace`` seconds."""
        if self._stopped:
            return
        self._stopped = True
        self._server.stop(grace).wait()

    def wait_for_termination(self) -> None:
        """Block until the server stopped."""
        self._server.wait_for_termination()
