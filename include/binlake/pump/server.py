"""The Pump's gRPC server: protobuf in, ``PumpService`` call, protobuf out.

The server is asyncio (``grpc.aio``) on one event-loop thread that owns
reading every write stream, handing batches to the storage's group commit and
writing the answers; the only other threads a write touches are the storage's
writer (validate, append, fsync: the GIL is free while it waits on the disk)
and, after the acknowledgement, its indexer. The storage wakes the loop once
per group commit (not once per request), so a group of N batches costs one
cross-thread hand-off back. Reads and Status run their blocking storage work
(LevelDB, file reads, waiting for the safe ts) in a small thread pool so the
loop never waits on them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import grpc
import grpc.aio

from binlake import errors, rpc
from binlake.proto import pump_pb2, pump_pb2_grpc
from binlake.pump.metrics import PumpMetrics
from binlake.pump.service import PendingWrite, PumpService
from binlake.pump.storage import Results

T = TypeVar("T")

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


class _Waker:
    """Settles asyncio futures from the storage's writer thread with one loop
    wake-up per burst: results are queued, and the loop is woken only when the
    queue was empty (the loop drains everything queued by then)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._ready: list[tuple[asyncio.Future[Results], Results | None, BaseException | None]] = []

    def callback(self, fut: asyncio.Future[Results]) -> Callable[[Results | None, BaseException | None], None]:
        def done(results: Results | None, exc: BaseException | None) -> None:
            with self._lock:
                self._ready.append((fut, results, exc))
                wake = len(self._ready) == 1
            if wake:
                try:
                    self._loop.call_soon_threadsafe(self._drain)
                except RuntimeError:  # the loop closed: nobody waits any more
                    pass

        return done

    def _drain(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for fut, results, exc in ready:
            if fut.done():
                continue
            if results is not None:
                fut.set_result(results)
            else:
                fut.set_exception(exc or errors.Unavailable("pump storage write failed"))


class PumpServicer(pump_pb2_grpc.PumpServicer):
    def __init__(self, service: PumpService, metrics: PumpMetrics, pool: concurrent.futures.Executor) -> None:
        self.service = service
        self.metrics = metrics
        self._pool = pool
        self._waker: _Waker | None = None

    def _count_refusals(self, results: Results) -> None:
        for err in results:
            if err is not None:
                self.metrics.refusals.labels(_code_name(err)).inc()

    def _submit(self, payloads: list[bytes], cluster_id: int) -> asyncio.Future[Results]:
        """Queue a batch for group commit (on the loop): a future of its results."""
        loop = asyncio.get_running_loop()
        if self._waker is None:
            self._waker = _Waker(loop)
        fut: asyncio.Future[Results] = loop.create_future()
        self.service.write_cb(payloads, cluster_id, self._waker.callback(fut))
        return fut

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    @rpc.aio_servicer_method
    async def WriteBinlog(
        self, request: pump_pb2.WriteBinlogReq, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pump_pb2.WriteBinlogResp:
        started = time.perf_counter()
        if not request.payload:
            # The seed's probe: an empty binlog checks the Pump would take a write.
            self.service.probe(request.cluster_id)
            return pump_pb2.WriteBinlogResp()
        (err,) = await self._submit([request.payload], request.cluster_id)
        self.metrics.latency.observe(time.perf_counter() - started)
        self.metrics.requests.labels("WriteBinlog", _code_name(err)).inc()
        if err is not None:
            raise err
        return pump_pb2.WriteBinlogResp()

    @rpc.aio_servicer_method
    async def WriteBinlogs(
        self, request: pump_pb2.WriteBinlogsReq, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pump_pb2.WriteBinlogsResp:
        started = time.perf_counter()
        results = await self._submit(list(request.payloads), request.cluster_id)
        self.metrics.latency.observe(time.perf_counter() - started)
        self.metrics.requests.labels("WriteBinlogs", "OK").inc()
        self._count_refusals(results)
        return _response(results, request.batch_id)

    async def WriteBinlogStream(
        self, request_iterator: AsyncIterator[pump_pb2.WriteBinlogsReq], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pump_pb2.WriteBinlogsResp]:
        """Batches arrive on one stream; each is queued for group commit as soon as
        it is read (a reader task on the same loop), and answered in order once
        durable, so a client may keep several batches in flight."""
        answers: asyncio.Queue[tuple[int, float, asyncio.Future[Results]] | BaseException | None] = asyncio.Queue()

        async def read_requests() -> None:
            try:
                async for req in request_iterator:
                    started = time.perf_counter()
                    try:
                        fut = self._submit(list(req.payloads), req.cluster_id)
                    except errors.BinlakeError as exc:
                        answers.put_nowait(exc)
                        return
                    answers.put_nowait((req.batch_id, started, fut))
            except (grpc.RpcError, asyncio.CancelledError):
                pass  # the client went away; answer what was queued
            except Exception as exc:
                answers.put_nowait(exc)
            finally:
                answers.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read_requests())
        try:
            while True:
                if answers.empty():
                    try:
                        item = await asyncio.wait_for(answers.get(), _IDLE_CHECK_S)
                    except TimeoutError:
                        if self.service.closing:
                            # Shutting down: end idle streams so a graceful stop need
                            # not wait out its grace period; clients reconnect elsewhere.
                            await context.abort(
                                grpc.StatusCode.UNAVAILABLE, f"pump {self.service.node_id} is shutting down"
                            )
                        continue
                else:
                    item = answers.get_nowait()
                if item is None:
                    return
                if isinstance(item, errors.BinlakeError):
                    await context.abort(rpc.status_code(item), str(item))
                if isinstance(item, BaseException):
                    await context.abort(grpc.StatusCode.INTERNAL, f"write stream failed: {item}")
                assert not isinstance(item, BaseException)
                batch_id, started, fut = item
                try:
                    results = await fut
                except errors.BinlakeError as exc:
                    await context.abort(rpc.status_code(exc), str(exc))
                self.metrics.latency.observe(time.perf_counter() - started)
                self.metrics.requests.labels("WriteBinlogStream", "OK").inc()
                self._count_refusals(results)
                yield _response(results, batch_id)
        finally:
            reader.cancel()

    @rpc.aio_servicer_stream
    async def PullBinlogs(
        self, request: pump_pb2.PullBinlogsReq, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pump_pb2.PullBinlogsResp]:
        timeout = request.wait_timeout_ms / 1000.0 if request.wait_timeout_ms > 0 else 30.0
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = min(timeout, max(0.0, remaining - 0.05))
        batches = self.service.pull(
            request.start_ts, request.end_ts, wait=request.wait, wait_timeout_s=timeout,
            max_txns=request.batch_max_txns, max_bytes=request.batch_max_bytes,
        )
        try:
            while True:
                # Checks, the wait for the safe ts and the reads run in the pool.
                batch = await self._blocking(next, batches, None)
                if batch is None or context.cancelled():
                    return
                yield pump_pb2.PullBinlogsResp(binlogs=batch, node_id=self.service.node_id)
        finally:
            await self._blocking(batches.close)

    @rpc.aio_servicer_method
    async def Status(self, request: pump_pb2.StatusReq, context: grpc.aio.ServicerContext[Any, Any]) -> pump_pb2.StatusResp:
        return await self._blocking(self._status)

    def _status(self) -> pump_pb2.StatusResp:
        s = self.service
        st = s.storage
        return pump_pb2.StatusResp(
            node_id=s.node_id, state=s.state.value, safe_ts=st.safe_ts, max_commit_ts=st.max_commit_ts,
            gc_ts=st.gc_ts, pending_txns=st.pending_count, storage_bytes=st.storage_bytes(),
            disk_free_bytes=s.disk_free(), accepting_writes=s.accepting_writes(),
        )


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (each loop iteration costs a fraction of asyncio's,
    and gRPC needs several per message), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class PumpServer:
    """The Pump's asyncio gRPC server on an event loop of its own thread.

    Built bound (``port`` is known before the servicer is added), so a node can
    derive its id from the port and refuse to start on a taken address.
    """

    def __init__(self, addr: str, options: list[tuple[str, Any]]) -> None:
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pump-grpc-loop", daemon=True)
        self._thread.start()
        self._server: grpc.aio.Server | None = None
        self._stopped = False
        try:
            self.port = self._run(self._bind(addr, options))
        except BaseException:
            self._close_loop()
            raise

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _bind(self, addr: str, options: list[tuple[str, Any]]) -> int:
        self._server = rpc.aio_server(options)
        return rpc.add_port(self._server, addr)

    def add(self, servicer: PumpServicer) -> None:
        """Serve ``servicer`` (before ``start``)."""

        async def add() -> None:
            pump_pb2_grpc.add_PumpServicer_to_server(servicer, self._server)

        self._run(add())

    def start(self) -> None:
        assert self._server is not None
        self._run(self._server.start())

    def stop(self, grace: float | None) -> None:
        """Refuse new calls, let running ones finish within ``grace`` seconds, stop the loop."""
        if self._stopped:
            return
        self._stopped = True
        if self._server is not None:
            self._run(self._server.stop(grace))
        self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def wait_for_termination(self) -> None:
        """Block until the server stopped."""
        self._thread.join()


# ---------------------------------------------------------------------------- thread-pool server


class ThreadedPumpServicer(pump_pb2_grpc.PumpServicer):
    """The same RPCs on a thread-pool server (``server = "threads"``): a stream's
    batches are read by a thread of its own and answered, in order, by the
    handler's thread once durable. Kept beside the asyncio servicer so the two
    can be measured against each other on the same storage."""

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
        it is read (a reader thread), and answered in order once durable."""
        pending: queue.SimpleQueue[tuple[int, float, PendingWrite] | BaseException | None] = queue.SimpleQueue()

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
            if isinstance(item, BaseException):
                context.abort(grpc.StatusCode.INTERNAL, f"write stream failed: {item}")
            assert not isinstance(item, BaseException)
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
    def PullBinlogs(
        self, request: pump_pb2.PullBinlogsReq, context: grpc.ServicerContext
    ) -> Iterator[pump_pb2.PullBinlogsResp]:
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


class ThreadedPumpServer:
    """``PumpServer``'s interface over a thread-pool gRPC server."""

    def __init__(self, addr: str, options: list[tuple[str, Any]], workers: int) -> None:
        self._server = rpc.create_server(workers, "pump-rpc", options)
        self.port = rpc.add_port(self._server, addr)
        self._stopped = False

    def add(self, servicer: ThreadedPumpServicer) -> None:
        pump_pb2_grpc.add_PumpServicer_to_server(servicer, self._server)

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float | None) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._server.stop(grace).wait()

    def wait_for_termination(self) -> None:
        self._server.wait_for_termination()
