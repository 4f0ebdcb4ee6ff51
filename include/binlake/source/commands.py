"""``binlake source mysql|postgres`` and ``binlake bench source``: back up an
existing database without touching its application."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from binlake import errors
from binlake.cli.args import number_in, positive_float, positive_int, scratch_dir
from binlake.net import DEFAULT_REGISTRY_ADDR

log = logging.getLogger(__name__)


def _server_id(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in 1..4294967295, got {text!r}") from None
    if not 1 <= v < 2**32:
        raise argparse.ArgumentTypeError(f"expected a number in 1..4294967295, got {v}")
    return v


_step_ms = number_in(float, 0, 1000, "milliseconds")


_max_step_ms = number_in(float, 0, 4000, "milliseconds")


_MAX_STEP_HELP = ("longest a step waits to fill its group while transactions keep arriving, in ms (default 4x "
                  "--step-ms, 100 at the defaults; equal to --step-ms: a fixed pace): under a steady stream steps "
                  "grow to this, so each carries more; acknowledgements up to about twice this much later")


_STEP_HELP = ("least time between two steps of the Pump pipeline, in ms (default 25; 0: as fast as round trips "
              "allow): larger groups, less CPU per transaction, acknowledgements up to this much later")


def register(sub: Any, bench: Any, fmt: type[argparse.HelpFormatter]) -> None:
    src = sub.add_parser("source", help="read an existing database's log into the Pumps (no application changes)",
                         formatter_class=fmt)
    ssub = src.add_subparsers(dest="source_command", metavar="KIND", required=True)
    m = ssub.add_parser(
        "mysql", help="MySQL/MariaDB row binlog -> Pumps (as a replica)", formatter_class=fmt,
        epilog=(
            "The server needs log_bin, binlog_format=ROW and binlog_row_image=FULL; the user needs\n"
            "REPLICATION SLAVE, REPLICATION CLIENT and SELECT.\n\n"
            "Examples:\n"
            "  binlake source mysql --dsn mysql://repl:pw@db1:3306 --server-id 4001 --registry 127.0.0.1:8230 \\\n"
            "      --data-dir data/source-db1 --tables 'shop.*'\n"
            "  binlake source mysql --dsn mysql://root@127.0.0.1:3306 --server-id 4001 --start binlog.000042:4\n"
            "  binlake source mysql --dsn mysql://root@127.0.0.1:3306 --server-id 4001 --start snapshot \\\n"
            "      --tables 'shop.*'   # the rows already there first, then the binlog from that snapshot\n"
        ),
    )
    m.add_argument("--dsn", required=True, help="mysql://USER[:PASSWORD]@HOST[:PORT]")
    m.add_argument("--server-id", type=_server_id, required=True,
                   help="this replica's server id (unique among the server's replicas)")
    m.add_argument("--registry", default=DEFAULT_REGISTRY_ADDR,
                   help=f"registry HOST:PORT or a group HOST:PORT,HOST:PORT,... (default {DEFAULT_REGISTRY_ADDR})")
    m.add_argument("--start", default=None,
                   help="where a new --data-dir starts: now (default), snapshot (the chosen tables' rows "
                        "first, then the binlog from that snapshot), FILE:POS or gtid:SET; "
                        "ignored once a checkpoint exists")
    m.add_argument("--snapshot-batch-rows", type=int, default=10_000,
                   help="rows per transaction of a --start snapshot (default 10000)")
    m.add_argument("--tables", default=None, help="DB.TABLE globs, comma-separated (default: every non-system table)")
    m.add_argument("--data-dir", default="data/source-mysql",
                   help="checkpoint and TSO journal (default data/source-mysql)")
    m.add_argument("--status-addr", default="127.0.0.1:0",
                   help="HOST:PORT of the TxnStatus service the Pumps ask (default: any free loopback port)")
    m.add_argument("--step-ms", type=_step_ms, default=None, help=_STEP_HELP)
    m.add_argument("--max-step-ms", type=_max_step_ms, default=None, help=_MAX_STEP_HELP)
    m.set_defaults(handler=_run_mysql)

    pg = ssub.add_parser(
        "postgres", help="PostgreSQL logical decoding (pgoutput) -> Pumps", formatter_class=fmt,
        epilog=(
            "The server needs wal_level=logical; every published table REPLICA IDENTITY FULL.\n\n"
            "Examples:\n"
            "  binlake source postgres --dsn postgresql://repl@db1:5432/shop --slot binlake --publication binlake \\\n"
            "      --create --registry 127.0.0.1:8230 --data-dir data/source-pg\n"
            "  binlake source postgres --dsn postgresql://repl@db1:5432/shop --slot binlake --publication binlake \\\n"
            "      --start snapshot   # the rows already there first (a new slot's snapshot), then the slot\n"
        ),
    )
    pg.add_argument("--dsn", required=True, help="postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE")
    pg.add_argument("--slot", required=True, help="logical replication slot (pgoutput)")
    pg.add_argument("--publication", required=True, help="publication naming the tables to back up")
    pg.add_argument("--create", action="store_true",
                    help="create the publication FOR ALL TABLES, and the slot (--start snapshot always creates "
                         "its own), if missing")
    pg.add_argument("--registry", default=DEFAULT_REGISTRY_ADDR,
                    help=f"registry HOST:PORT or a group HOST:PORT,HOST:PORT,... (default {DEFAULT_REGISTRY_ADDR})")
    pg.add_argument("--start", default=None,
                    help="where a new --data-dir starts: now (default: stream from the slot) or snapshot (creates "
                         "the slot with an exported snapshot, sends the published tables' rows, then streams from "
                         "that snapshot; refused if the slot exists); ignored once a checkpoint exists")
    pg.add_argument("--snapshot-batch-rows", type=positive_int, default=10_000,
                    help="rows per transaction of a --start snapshot (default 10000)")
    pg.add_argument("--data-dir", default="data/source-postgres",
                    help="checkpoint and TSO journal (default data/source-postgres)")
    pg.add_argument("--status-addr", default="127.0.0.1:0", help="HOST:PORT of the TxnStatus service")
    pg.add_argument("--step-ms", type=_step_ms, default=None, help=_STEP_HELP)
    pg.add_argument("--max-step-ms", type=_max_step_ms, default=None, help=_MAX_STEP_HELP)
    pg.set_defaults(handler=_run_postgres)

    b = bench.add_parser(
        "source", help="MariaDB source row changes/s vs mysqlbinlog, and its overhead on the upstream",
        formatter_class=fmt, epilog="Example:\n  binlake bench source --rows 1000000 --seconds 10\n",
    )
    b.add_argument("--rows", type=positive_int, default=1_000_000, help="row changes in the binlog (default 1000000)")
    b.add_argument("--rows-per-txn", type=positive_int, default=1000, help="row changes per transaction (default 1000)")
    b.add_argument("--seconds", type=positive_float, default=10.0, help="each upstream throughput case (default 10)")
    b.add_argument("--dir", type=scratch_dir, help="scratch directory (default: a temp dir under bench/, removed after)")
    b.add_argument("--nice", type=_niceness, default=0,
                   help="run the registry, Pump and source at this niceness, 0..19 (default 0: as the benchmark)")
    b.add_argument("--step-ms", type=_step_ms, default=None,
                   help="the paced live case's --step-ms (default: the source's default)")
    b.add_argument("--also-step-ms", type=_step_ms, action="append", default=[], metavar="MS",
                   help="one more paced live case at this --step-ms, in the same run; repeatable")
    b.add_argument("--max-step-ms", type=_max_step_ms, default=None,
                   help="the adaptive live case's --max-step-ms (default: the source's default)")
    b.add_argument("--postgres", action="store_true",
                   help="measure the PostgreSQL source instead (live case only, against pg_recvlogical)")
    b.add_argument("--pinned", action="store_true",
                   help="upstream (server + client) on CPU 0, registry, Pump, source and C replica on CPU 1")
    b.add_argument("--pgoutput-only", action="store_true",
                   help="only PostgreSQL tuple decoding, in process: native (_pgoutc) against the Python path")
    b.add_argument("--bulk-only", action="store_true",
                   help="only the bulk cases (mysqlbinlog, the source's start-up, each decoding path), no live cases")
    b.add_argument("--framing-only", action="store_true",
                   help="only the MySQL stream framing, in process: native against mysql-replication's reader")
    b.set_defaults(handler=_bench)


_niceness = number_in(int, 0, 19, "a niceness")


def _bench(args: argparse.Namespace) -> int:
    # bench/source_bench.py, found the way every benchmark is (``binlake.cli.benchmarks``).
    from binlake.cli.benchmarks import bench_module

    return int(bench_module("source").main(args))


def _check_args(args: argparse.Namespace) -> None:
    """Every option checked before any connection: with the database down, a wrong
    --registry or --data-dir is still reported as itself."""
    from binlake.cli import argcheck

    argcheck.addr_list("--registry", args.registry)
    argcheck.listen_addr("--status-addr", args.status_addr)
    argcheck.writable_dir("--data-dir", args.data_dir)
    if not args.dsn.strip():
        raise errors.InvalidArgument("--dsn is empty: give the database's URL (see --help)")


def _run_mysql(args: argparse.Namespace) -> int:
    from binlake.cli import argcheck
    from binlake.source.mysql.source import MySQLSource

    _check_args(args)
    argcheck.names("--tables", args.tables, "shop.*,app.orders")
    source = MySQLSource(args.dsn, server_id=args.server_id, registry=args.registry, data_dir=args.data_dir,
                         start=args.start, tables=args.tables, status_addr=args.status_addr,
                         snapshot_batch_rows=args.snapshot_batch_rows, pace_s=_pace(args),
                         max_pace_s=_max_pace(args))
    return _run(source)


def _run_postgres(args: argparse.Namespace) -> int:
    from binlake.source.postgres.source import PostgresSource

    _check_args(args)
    for flag, name in (("--slot", args.slot), ("--publication", args.publication)):
        if len(name) > 63:  # PostgreSQL truncates longer identifiers silently
            raise errors.InvalidArgument(f"{flag} {name[:20]}...: at most 63 characters, got {len(name)}")

    source = PostgresSource(args.dsn, slot=args.slot, publication=args.publication, registry=args.registry,
                            data_dir=args.data_dir, create=args.create, start=args.start,
                            snapshot_batch_rows=args.snapshot_batch_rows, status_addr=args.status_addr,
                            pace_s=_pace(args), max_pace_s=_max_pace(args))
    return _run(source)


def _pace(args: argparse.Namespace) -> float:
    from binlake.source.pipeline import PACE_S

    return PACE_S if args.step_ms is None else args.step_ms / 1000


def _max_pace(args: argparse.Namespace) -> float | None:
    """--max-step-ms in seconds (None: the source's default, MAX_PACE_FACTOR x the pace);
    below --step-ms it is refused here, in the option's words."""
    if args.max_step_ms is None:
        return None
    if args.max_step_ms < _pace(args) * 1000:
        raise errors.InvalidArgument(f"--max-step-ms {args.max_step_ms:g} is below the step pace "
                                     f"({_pace(args) * 1000:g} ms, --step-ms): give at least that")
    return float(args.max_step_ms) / 1000


def _run(source: Any) -> int:
    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping after the current transaction", signum)
        source.stop()

    # Only the main thread may install handlers (an embedding program runs us elsewhere).
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    try:
        source.run()
    except errors.BinlakeError:
        raise
    except Exception as exc:  # a driver error that is not a lost connection: one line, not a traceback
        print(f"binlake source: error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
              file=sys.stderr)
        return 1
    return 0
