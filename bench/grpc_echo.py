"""grpcio's own ceiling on this machine: a bidirectional-stream echo with no
binlake code in it, measured in the same run as the Pump cases.

The server is grpcio's thread-pool server in its own process, with one
generic stream-stream method that answers every request message with 8 bytes
(the size of a Pump acknowledgement's fields); no protobuf, no servicer logic,
no storage. Each writer is a thread of one client process with its own
stream, sending one SIZE-byte message and waiting for its answer before the
next, as a Pump writer waits for each acknowledgement.

A committed transaction of ``binlake bench pump`` (commit binlog "sync") is two
acknowledged messages, so ``round trips/s / 2`` bounds what any Pump or client
built on grpcio in Python could commit here, before a byte is stored or a
message is parsed. ``binlake bench pump --echo`` prints it beside the Pump.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import resource
import time
from collections.abc import Iterator
from typing import Any

from benchkit import cpu_seconds, percentile, run_threads

_METHOD = "/binlake.bench.Echo/Stream"


def _serve(out: Any) -> None:
    from concurrent import futures

    import grpc

    def echo(requests: Iterator[bytes], _ctx: Any) -> Iterator[bytes]:
        for _m in requests:
            yield b"\0" * 8

    handler = grpc.method_handlers_generic_handler("binlake.bench.Echo", {
        "Stream": grpc.stream_stream_rpc_method_handler(echo)})
    # One pool thread per stream (a stream holds its thread for its whole life).
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=300))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    out.put(port)
    server.wait_for_termination()


def echo_case(writers: int, size: int, seconds: float) -> dict[str, float]:
    """Round trips/s, latency and CPU per round trip of ``writers`` echo streams."""
    import grpc

    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    server = ctx.Process(target=_serve, args=(out,), daemon=True)
    server.start()
    channel = None
    try:
        port = out.get(timeout=60)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=30)
        call = channel.stream_stream(_METHOD)
        payload = b"x" * size
        counts = [0] * writers
        lat: list[list[float]] = [[] for _ in range(writers)]

        def run(i: int, stop: Any) -> None:
            requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

            def gen() -> Iterator[bytes]:
                while (m := requests.get()) is not None:
                    yield m

            answers = call(gen())
            requests.put(payload)  # open the stream before the clock starts
            next(answers)
            mine = lat[i]
            n = 0
            while not stop.is_set():
                t0 = time.perf_counter()
                requests.put(payload)
                next(answers)
                mine.append(time.perf_counter() - t0)
                n += 1
            counts[i] = n
            requests.put(None)

        server_cpu0 = cpu_seconds(server.pid or 0)
        self0 = resource.getrusage(resource.RUSAGE_SELF)
        elapsed = run_threads(writers, seconds, run)
        self1 = resource.getrusage(resource.RUSAGE_SELF)
        server_cpu1 = cpu_seconds(server.pid or 0)
        total = max(1, sum(counts))
        all_lat = sorted(x for per in lat for x in per)
        client_cpu = (self1.ru_utime - self0.ru_utime) + (self1.ru_stime - self0.ru_stime)
        return {"writers": writers, "size": size, "rt_s": sum(counts) / elapsed,
                "p50_ms": percentile(all_lat, 0.5) * 1000, "p99_ms": percentile(all_lat, 0.99) * 1000,
                "server_cpu_us": (server_cpu1 - server_cpu0) / total * 1e6,
                "client_cpu_us": client_cpu / total * 1e6}
    finally:
        if channel is not None:
            channel.close()
        server.terminate()
        server.join(10)
