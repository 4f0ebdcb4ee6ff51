"""``binlake workload`` and ``binlake bench writer``: the parsers, their checks and
the command. The planner, the runner and TxnWriter are imported when the command
runs (they need SQLAlchemy), so that building the parser stays cheap.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from binlake import errors
from binlake.cli import benchmarks
from binlake.cli.args import (
    add_registry,
    int_arg,
    int_list,
    non_negative_int,
    positive_float,
    positive_int,
    registry_addr,
)


def register(sub: Any, bench: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """Add ``binlake workload`` and ``binlake bench writer`` (see ``binlake.cli._COMMAND_MODULES``)."""
    p = sub.add_parser(
        "workload", help="drive an upstream database with a realistic, reproducible transaction mix",
        formatter_class=fmt,
        description=(
            "Run transactions against an upstream SQL database through binlake's writer (TxnWriter), which\n"
            "sends every transaction's binlogs to the Pumps. The transactions are a pure function of\n"
            "(--profile, --tables, --txns, --seed, sizes): the same seed gives the same transactions, and with\n"
            "--clients 1 the same final data. The setup (CREATE TABLE, initial rows) runs first, so use a\n"
            "fresh database.\n\n"
            "Profiles:\n"
            "  oltp   sysbench-like tables sbtest1..K: point/range updates, inserts, deletes, primary-key\n"
            "         changes, unique-key swaps, delete+re-insert, NULLs in a unique column, ~64 KiB rows,\n"
            "         and one large transaction (--large-txn-rows rows) every --large-txn-every\n"
            "  bank   transfers between --accounts accounts; the sum of balances never changes\n"
            "  ddl    oltp with schema changes every ~--ddl-every transactions (add/rename/retype/drop\n"
            "         column, add/drop unique key, rename/truncate/create/drop table)\n"
            "  mixed  bank + oltp + ddl"
        ),
        epilog=(
            "Examples:\n"
            "  binlake workload --registry 127.0.0.1:8230 --upstream sqlite:///data/upstream.db\n"
            "  binlake workload --upstream sqlite:///data/up.db --profile mixed --txns 5000 --clients 8 --seed 7\n"
            "  binlake workload --upstream postgresql+psycopg2://u:p@db/app --profile bank --rate 200\n"
        ),
    )
    add_registry(p)
    p.add_argument("--upstream", help="SQLAlchemy URL of the upstream database (default: [source] upstream, "
                   "$BINLAKE_UPSTREAM)")
    p.add_argument("--profile", choices=["oltp", "bank", "ddl", "mixed"], default="oltp",
                   help="transaction mix (default oltp)")
    p.add_argument("--tables", type=positive_int, default=4, help="oltp tables sbtest1..K (default 4)")
    p.add_argument("--txns", type=positive_int, default=10_000,
                   help="workload transactions after the setup (default 10000)")
    p.add_argument("--clients", type=positive_int, default=8, help="concurrent client threads (default 8)")
    p.add_argument("--seed", type=int_arg, default=1, help="random seed of the plan (default 1)")
    p.add_argument("--rate", type=positive_float, help="at most this many transactions/s overall (default: no limit)")
    p.add_argument("--table-rows", type=non_negative_int, default=1000,
                   help="initial rows per oltp table (default 1000)")
    p.add_argument("--accounts", type=positive_int, default=100, help="bank accounts (default 100)")
    p.add_argument("--large-txn-rows", type=positive_int, default=10_000,
                   help="rows of a large transaction (default 10000)")
    p.add_argument("--large-txn-every", type=non_negative_int, default=500,
                   help="one large transaction every this many (default 500; 0 = none)")
    p.add_argument("--ddl-every", type=positive_int, default=50,
                   help="about this many transactions between DDLs (profiles ddl, mixed; default 50)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(handler=_run)

    b = bench.add_parser(
        "writer", help="TxnWriter throughput with binlog vs the same transactions without", formatter_class=fmt,
        epilog="Example:\n  binlake bench writer --seconds 5 --clients 1,8\n",
    )
    b.add_argument("--seconds", type=positive_float, default=5.0, help="measure each case this long (default 5)")
    b.add_argument("--clients", type=int_list, default="1,8", help="comma-separated client counts (default 1,8)")
    b.set_defaults(handler=_bench)


def _run(args: argparse.Namespace) -> int:
    from binlake import config

    if args.upstream is None:
        args.upstream = config.load(config.SourceSettings).upstream
    if not args.upstream:
        raise errors.InvalidArgument(
            "workload needs --upstream URL (a SQLAlchemy URL such as sqlite:///data/upstream.db), "
            "or $BINLAKE_UPSTREAM"
        )
    if args.accounts < 2:
        raise errors.InvalidArgument(f"--accounts must be at least 2 (a transfer needs two), got {args.accounts}")
    return _command(args, registry_addr(args))


def _command(args: argparse.Namespace, registry: str) -> int:
    """``binlake workload``: plan, run, print the summary."""
    from binlake.workload.plan import plan
    from binlake.workload.run import format_summary, run
    from binlake.writer.txn_writer import TxnWriter

    txns = plan(args.profile, args.tables, args.txns, args.seed, large_txn_rows=args.large_txn_rows,
                large_txn_every=args.large_txn_every, ddl_every=args.ddl_every, table_rows=args.table_rows,
                accounts=args.accounts)
    with TxnWriter(args.upstream, registry=registry) as writer:
        summary = run(writer, txns, args.clients, args.rate, progress=not args.quiet)
    if args.json:
        print(json.dumps({"profile": args.profile, "seed": args.seed, **summary.to_dict()}))
    else:
        print(format_summary(summary, f"workload {args.profile} (seed {args.seed})"))
    return 130 if summary.interrupted else 0


def _bench(args: argparse.Namespace) -> int:
    # bench/writer_bench.py, found the way every benchmark is (``binlake.cli.benchmarks``).
    return int(benchmarks.bench_module("writer").main(args))
