"""``binlake pump`` and ``binlake bench pump``: run a Pump, measure its writes."""

from __future__ import annotations

import argparse
from typing import Any

from binlake.cli import benchmarks
from binlake.cli.args import include_dir, int_list, number_in, positive_float, positive_int, scratch_dir


def register(sub: Any, bench: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """Add ``binlake pump`` and ``binlake bench pump`` (see ``binlake.cli._COMMAND_MODULES``)."""
    p = sub.add_parser(
        "pump", help="run a Pump (durable, sorted binlog storage)", formatter_class=fmt,
        description=(
            "Run a Pump. It recovers its data dir (cutting a torn tail), registers with the registry,\n"
            "then accepts writes; it serves complete transactions of any commit_ts window below its\n"
            "safe ts. SIGTERM/SIGINT shut it down gracefully (state 'paused')."
        ),
        epilog=(
            "Examples:\n"
            "  binlake pump --registry 127.0.0.1:8230 --data-dir data/pump1 --addr 127.0.0.1:8250\n"
            "  binlake pump --config config/binlake.toml --node-id pump1 --metrics-addr 127.0.0.1:8251\n"
        ),
    )
    p.add_argument("--config", help="TOML config file (its [pump] table documents every key)")
    # The defaults shown are the [pump] model's: a flag, else [pump] in --config, else BINLAKE_PUMP_*.
    from binlake import config

    fields = config.PumpSettings.model_fields
    p.add_argument("--registry", help="registry HOST:PORT, or a registry group HOST:PORT,HOST:PORT,... (default: "
                                      f"[pump] registry, $BINLAKE_PUMP_REGISTRY, else {fields['registry'].default})")
    p.add_argument("--data-dir", help="value log and index directory (default: [pump] data_dir, "
                                      f"$BINLAKE_PUMP_DATA_DIR, else {fields['data_dir'].default})")
    p.add_argument("--addr", help="HOST:PORT to listen on, port 0 = any free port (default: [pump] addr, "
                                  f"$BINLAKE_PUMP_ADDR, else {fields['addr'].default})")
    p.add_argument("--advertise-addr", help="address writers and readers use, if not --addr")
    p.add_argument("--node-id", help="node id (default: remembered in the data dir, else host:port)")
    p.add_argument("--metrics-addr", help="HOST:PORT for Prometheus /metrics")
    p.add_argument("--fake-binlog-interval-s", type=float, help="idle heartbeat binlog interval (default 3)")
    p.add_argument("--txn-timeout-s", type=float, help="ask the writer about a prewrite after this (default 600)")
    p.add_argument("--gc-retention-days", type=float,
                   help="keep binlogs this many days (default 7); never past a consumer's checkpoint")
    p.add_argument("--gc-hard-limit-days", type=float,
                   help="collect past consumer checkpoints older than this (default 0 = never)")
    p.add_argument("--gc-hard-limit-bytes", type=int,
                   help="collect past consumer checkpoints above this storage size (default 0 = never)")
    p.add_argument("--max-binlog-bytes", type=positive_int, help="largest binlog accepted (default 1 GiB)")
    p.add_argument("--stop-write-at-free-bytes", type=int, help="refuse writes below this free disk (default 1 GiB)")
    p.set_defaults(handler=_run)

    b = bench.add_parser(
        "pump", help="Pump write throughput and latency vs raw append+fsync", formatter_class=fmt,
        epilog="Example:\n  binlake bench pump --seconds 5 --writers 1,4,16 --sizes 1024,65536\n",
    )
    b.add_argument("--seconds", type=positive_float, default=5.0, help="measure each case this long (default 5)")
    b.add_argument("--writers", type=int_list, default="1,4,16,64,256",
                   help="comma-separated writer counts (default 1,4,16,64,256)")
    b.add_argument("--sizes", type=int_list, default="1024,65536", help="comma-separated transaction sizes in bytes")
    b.add_argument("--dir", type=scratch_dir,
                   help="scratch directory on the disk to measure (default: a temp dir under bench/)")
    b.add_argument("--client-procs", type=positive_int, default=1,
                   help="writer threads are spread over this many client processes (default 1)")
    b.add_argument("--no-tso-per-txn", dest="tso_per_txn", action="store_false",
                   help="skip the extra case that fetches two TSOs per transaction from the registry")
    b.add_argument("--baseline", metavar="INCLUDE_DIR", type=include_dir,
                   help="also run every case on another checkout's Pump and client (its include dir), "
                        "back to back in the same run")
    b.add_argument("--no-storage", dest="storage", action="store_false",
                   help="skip the storage-alone cases (Storage.submit in one process, no gRPC)")
    b.add_argument("--floor", action="store_true",
                   help="also run every case against a Pump that acknowledges at once and stores nothing "
                        "(same gRPC server, servicer and client): the transport's ceiling on this machine")
    b.add_argument("--no-flush", action="store_true",
                   help="also run every case on the same Pumps with their disk flush skipped (bench only: "
                        "nothing in binlake can skip it): splits the Pump's cost into its own code and the "
                        "disk's flush")
    b.add_argument("--echo", action="store_true",
                   help="also measure grpcio alone: a stream echo with no binlake code, one stream per writer "
                        "(what any Python Pump on grpcio could reach here)")
    b.add_argument("--replicas", type=int_list, default="1", metavar="RS",
                   help="comma-separated replica counts, e.g. 1,2: every case at each R, on a cluster of max(RS) "
                        "Pumps (default: one Pump, R = 1)")
    b.add_argument("--rounds", type=number_in(int, 1, 99, "a count"), default=1, metavar="N",
                   help="run every case N times, the Pumps and the floors back to back in each round, and report "
                        "the median (steadier ratios on a shared machine; default 1)")
    b.set_defaults(handler=_bench)


def _run(args: argparse.Namespace) -> int:
    from binlake import config
    from binlake.pump import node

    settings = config.load(
        config.PumpSettings, args.config, registry=args.registry, data_dir=args.data_dir, addr=args.addr,
        advertise_addr=args.advertise_addr, node_id=args.node_id, metrics_addr=args.metrics_addr,
        fake_binlog_interval_s=args.fake_binlog_interval_s, txn_timeout_s=args.txn_timeout_s,
        gc_retention_days=args.gc_retention_days, gc_hard_limit_days=args.gc_hard_limit_days,
        gc_hard_limit_bytes=args.gc_hard_limit_bytes, max_binlog_bytes=args.max_binlog_bytes,
        stop_write_at_free_bytes=args.stop_write_at_free_bytes,
    )
    node.run(settings)
    return 0


def _bench(args: argparse.Namespace) -> int:
    # bench/pump_bench.py, found the way every benchmark is (``binlake.cli.benchmarks``).
    return int(benchmarks.bench_module("pump").main(args))
