"""grpcio's CPU per unary call at a given call rate: the floor under each step of a
source's group pipeline, measured on this machine.

A source's step makes one unary TSO call to the registry and one round trip on
its write stream to the Pump, about a hundred steps a second at the default
pace. This benchmark has no binlake code in it: a child process serves one
generic unary method on grpcio's thread-pool server (as the registry does) that
answers its 20-byte request as it is; this process calls it from one thread
(a blocking call, as the source's sender makes its TSO call), paced to
``--rates`` calls per second (``max``: back to back). Both processes' CPU
seconds (/proc) over the calls give the CPU per call on each side.

What it shows: at a hundred calls a second each call costs both processes
several times what it costs back to back, since every call wakes idle threads
on both sides (grpcio's poller, the server's pool worker, the caller). So the
per-step share of the chain is bounded below by this, whatever binlake does
around the call, and only fewer steps (a longer pace, bigger groups) lower it.

Run: ``python bench/grpc_pace.py --rates 100,1000,max --calls 500``.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

from benchkit import cpu_seconds

_METHOD = "/binlake.bench.Pace/Call"


def _serve(addr: str) -> None:
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    handler = grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("binlake.bench.Pace", {"Call": handler})])
    server.add_insecure_port(addr)
    server.start()
    server.wait_for_termination()


def _rate(text: str) -> float:
    if text == "max":
        return 0.0
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"a rate is calls per second > 0 or 'max', got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rates", default="100,1000,max",
                        help="comma-separated calls per second, 'max' for back to back (default 100,1000,max)")
    parser.add_argument("--calls", type=int, default=500, help="calls per rate (default 500)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args.serve)
        return 0
    try:
        rates = [_rate(r.strip()) for r in args.rates.split(",") if r.strip()]
    except argparse.ArgumentTypeError as exc:
        print(f"--rates: {exc}", file=sys.stderr)
        return 2
    if not rates or args.calls < 1:
        print("--rates needs at least one rate and --calls a positive number", file=sys.stderr)
        return 2

    import grpc

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    server = subprocess.Popen([sys.executable, __file__, "--serve", addr])
    print(f"load average {os.getloadavg()[0]:.1f} at the start\n")
    print("| calls/s asked | calls/s got | server CPU per call | client CPU per call | both |")
    print("|---|---:|---:|---:|---:|")
    try:
        channel = grpc.insecure_channel(addr)
        call = channel.unary_unary(_METHOD)
        grpc.channel_ready_future(channel).result(timeout=30)
        call(b"x" * 20)
        for rate in rates:
            s0, c0, t0 = cpu_seconds(server.pid), time.process_time(), time.monotonic()
            for i in range(args.calls):
                call(b"x" * 20)
                if rate:
                    wait = t0 + (i + 1) / rate - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
            elapsed = time.monotonic() - t0
            server_us = 1e6 * (cpu_seconds(server.pid) - s0) / args.calls
            client_us = 1e6 * (time.process_time() - c0) / args.calls
            print(f"| {'max' if not rate else f'{rate:g}'} | {args.calls / elapsed:,.0f} | {server_us:,.0f} us | "
                  f"{client_us:,.0f} us | {server_us + client_us:,.0f} us |")
        channel.close()
    finally:
        server.terminate()
        server.wait(10)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
