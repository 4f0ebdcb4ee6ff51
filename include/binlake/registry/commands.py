"""``binlake registry``: the command that runs the registry (TSO and node states), and
``binlake bench registry`` (``bench/registry_bench.py``: failover time, TSO on etcd vs
SQLite, a writer's registry calls through a failover)."""

from __future__ import annotations

import argparse
from typing import Any

from binlake.cli.args import positive_float, positive_int


def register(sub: Any, bench: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """Add ``binlake registry`` (see ``binlake.cli._COMMAND_MODULES``)."""
    p = sub.add_parser(
        "registry", help="run the registry (TSO and node states)", formatter_class=fmt,
        description="Run the registry: hands out TSOs and keeps every node's state.",
        epilog="Examples:\n  binlake registry --data-dir data/registry --addr 127.0.0.1:8230\n"
               "  # a new cluster replicated from its first write (two copies of every prewrite):\n"
               "  binlake registry --data-dir data/registry --replicas 2\n"
               "  # one member of a group of three on etcd (run one per host):\n"
               "  binlake registry --store etcd://h1:2379,h2:2379,h3:2379 --addr h1:8230\n",
    )
    p.add_argument("--config", help="TOML config file (its [registry] table)")
    p.add_argument("--data-dir", help="where the SQLite store lives (default data/registry)")
    p.add_argument("--addr", help="HOST:PORT to listen on (default 127.0.0.1:8230; port 0 = any free port)")
    p.add_argument("--store", help="store URL instead of --data-dir: sqlite:///file.db, or "
                   "etcd://h1:2379,h2:2379,h3:2379[/prefix] to run one member of a registry group (one leads)")
    p.add_argument("--cluster-id", type=positive_int, help="refuse a store that holds another cluster id")
    p.add_argument("--tso-window-ms", type=positive_int, help="TSO high-water step persisted ahead of use")
    p.add_argument("--replicas", type=int, metavar="R",
                   help="the cluster's replication from ts 0: Pumps each prewrite is written to (1-16), recorded "
                        "when this registry creates the store; on a store that has served it must equal the "
                        "setting in force (change it with binlake ctl replication)")
    p.add_argument("--min-acks", type=int, metavar="W",
                   help="with --replicas: Pumps that must acknowledge a write (1-R; default R)")
    p.set_defaults(handler=_run)

    b = bench.add_parser(
        "registry", help="registry group: failover time, TSO throughput (etcd vs SQLite), writers through a failover",
        formatter_class=fmt,
        description="Measure a registry group on a three-member etcd against a lone SQLite registry (bench/RESULTS.md).",
    )
    b.add_argument("--runs", type=positive_int, default=5, help="failovers to time (default 5)")
    b.add_argument("--seconds", type=positive_float, default=3.0, help="seconds per TSO throughput case (default 3)")
    b.add_argument("--threads", type=positive_int, default=16, help="TSO caller threads (default 16)")
    b.set_defaults(handler=_bench)


def _run(args: argparse.Namespace) -> int:
    from binlake import config, errors
    from binlake.registry import server

    if args.store is not None and not args.store.strip():
        raise errors.InvalidArgument(
            "--store is empty: give etcd://HOST:2379,... or sqlite:///path/registry.db, or leave it out for --data-dir")
    settings = config.load(config.RegistrySettings, args.config, data_dir=args.data_dir, addr=args.addr,
                           tso_window_ms=args.tso_window_ms, store=args.store, cluster_id=args.cluster_id,
                           replicas=args.replicas, min_acks=args.min_acks)
    server.run(settings)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from binlake.cli import benchmarks

    return int(benchmarks.bench_module("registry").main(args))
