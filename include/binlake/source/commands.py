"""``binlake source KIND`` (one per source in ``SOURCES``), ``binlake bench source``
and ``binlake bench snapshot``: back up an existing database without touching its application.

Each source's command line is a ``SourceCommand`` in its own module (e.g.
``source.mysql.commands``): its name, words, own options and checks, and how
they build its ``source.base.Source``. The options every source has, the
checks before any connection, and running a source until a signal stops it
are here, once.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import logging
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from binlake import errors
from binlake.cli.args import (
    add_registry,
    number_in,
    positive_float,
    positive_int,
    registry_addr,
    scratch_dir,
    spark_bench_args,
)

if TYPE_CHECKING:  # the sources are imported when one runs, not to build the parser
    from binlake.source.base import Source

log = logging.getLogger(__name__)

# The sources ``binlake source`` offers, in --help's order: modules with a ``COMMAND``
# (a SourceCommand). A new source adds its module here.
SOURCES: tuple[str, ...] = (
    "binlake.source.mysql.commands",
    "binlake.source.postgres.commands",
)


@dataclasses.dataclass(frozen=True)
class SourceCommand:
    """A source's command line, ``binlake source NAME``. The options every source
    has (--dsn, --registry, --start, --snapshot-batch-rows, --snapshot-max-rows-per-s, --data-dir, --status-addr,
    --step-ms, --max-step-ms) are added by ``register`` in this record's words;
    ``add_arguments`` adds the source's own (after --dsn); ``check`` refuses what it
    cannot use before any connection; ``build`` makes the source (importing its
    database drivers only then)."""

    name: str
    help: str
    epilog: str
    dsn_help: str
    start_help: str
    batch_rows_type: Callable[[str], int]
    add_arguments: Callable[[argparse.ArgumentParser], None]
    check: Callable[[argparse.Namespace], None]
    build: Callable[[argparse.Namespace, float, float | None], Source[Any]]


_step_ms = number_in(float, 0, 1000, "milliseconds")


_max_step_ms = number_in(float, 0, 4000, "milliseconds")


_MAX_STEP_HELP = ("longest a step waits to fill its group while transactions keep arriving, in ms (default 4x "
                  "--step-ms, 100 at the defaults; equal to --step-ms: a fixed pace): under a steady stream steps "
                  "grow to this, so each carries more; acknowledgements up to about twice this much later")


_max_rows_per_s = number_in(float, 0, 1e9, "rows/s")


_MAX_ROWS_HELP = ("at most this many snapshot rows a second, on average (default 0: as fast as the upstream "
                  "serves them). Set it below your ingest's rows/s so the lake's windows of every other writer "
                  "stay fresh while a big snapshot runs, or to spare a busy primary; the snapshot takes longer")


_STEP_HELP = ("least time between two steps of the Pump pipeline, in ms (default 25; 0: as fast as round trips "
              "allow): larger groups, less CPU per transaction, acknowledgements up to this much later")


def register(sub: Any, bench: Any, fmt: type[argparse.HelpFormatter]) -> None:
    src = sub.add_parser("source", help="read an existing database's log into the Pumps (no application changes)",
                         formatter_class=fmt)
    ssub = src.add_subparsers(dest="source_command", metavar="KIND", required=True)
    for module in SOURCES:
        cmd: SourceCommand = importlib.import_module(module).COMMAND
        p = ssub.add_parser(cmd.name, help=cmd.help, formatter_class=fmt, epilog=cmd.epilog)
        p.add_argument("--dsn", required=True, help=cmd.dsn_help)
        cmd.add_arguments(p)
        # As every other client: the flag, else [cluster] registry / $BINLAKE_REGISTRY, else the default.
        add_registry(p)
        p.add_argument("--start", default=None, help=cmd.start_help)
        p.add_argument("--snapshot-batch-rows", type=cmd.batch_rows_type, default=10_000,
                       help="rows per transaction of a --start snapshot (default 10000)")
        p.add_argument("--snapshot-max-rows-per-s", type=_max_rows_per_s, default=0.0, metavar="ROWS",
                       help=_MAX_ROWS_HELP)
        p.add_argument("--data-dir", default=f"data/source-{cmd.name}",
                       help=f"checkpoint and TSO journal (default data/source-{cmd.name})")
        p.add_argument("--status-addr", default="127.0.0.1:0",
                       help="HOST:PORT of the TxnStatus service the Pumps ask (default: any free loopback port)")
        p.add_argument("--step-ms", type=_step_ms, default=None, help=_STEP_HELP)
        p.add_argument("--max-step-ms", type=_max_step_ms, default=None, help=_MAX_STEP_HELP)
        p.set_defaults(handler=functools.partial(_run_source, cmd))

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

    b = bench.add_parser(
        "snapshot", help="--start snapshot of a big MariaDB/PostgreSQL database under a workload: through the "
                         "Pumps, ingest, restore and diff, against the dump tools", formatter_class=fmt,
        epilog="Examples:\n  binlake bench snapshot --rows 200000 --db mariadb\n"
               "  binlake bench snapshot --rows 1000000 --db both\n"
               "  binlake bench snapshot   # 10,000,000 rows (about 3 GB) on each database\n")
    b.add_argument("--rows", type=positive_int, default=10_000_000,
                   help="rows of the snapshot's tables in all (default 10000000, about 3 GB)")
    b.add_argument("--tables", type=positive_int, default=20, help="tables the rows are spread over (default 20)")
    b.add_argument("--rate", type=positive_float, default=200.0,
                   help="workload transactions/s on the upstream throughout (default 200)")
    b.add_argument("--batch-rows", type=positive_int, default=10_000,
                   help="the source's --snapshot-batch-rows (default 10000)")
    b.add_argument("--max-rows-per-s", type=_max_rows_per_s, default=0.0,
                   help="the source's --snapshot-max-rows-per-s (default 0: no limit)")
    b.add_argument("--db", choices=("mariadb", "postgres", "both"), default="both",
                   help="which upstream (default both, one after the other)")
    b.add_argument("--window-s", type=positive_float, default=10.0,
                   help="least seconds an ingest window spans (default 10)")
    spark_bench_args(b, "Spark master of the ingest and restore runs (default: $BINLAKE_SPARK_MASTER, else local[*])")
    b.set_defaults(handler=_bench_snapshot)


def _bench_snapshot(args: argparse.Namespace) -> int:
    if args.rows < args.tables:
        raise errors.InvalidArgument(f"--rows {args.rows} is fewer than --tables {args.tables}: every table "
                                     "needs a row at least")
    # bench/snapshot_bench.py, found the way every benchmark is (``binlake.cli.benchmarks``).
    from binlake.cli.benchmarks import bench_module

    return int(bench_module("snapshot").main(args))


_niceness = number_in(int, 0, 19, "a niceness")


def _bench(args: argparse.Namespace) -> int:
    # bench/source_bench.py, found the way every benchmark is (``binlake.cli.benchmarks``).
    from binlake.cli.benchmarks import bench_module

    return int(bench_module("source").main(args))


def _check_args(args: argparse.Namespace) -> None:
    """Every option checked before any connection: with the database down, a wrong
    --registry or --data-dir is still reported as itself."""
    from binlake.cli import argcheck

    args.registry = registry_addr(args)
    argcheck.addr_list("--registry", args.registry)
    argcheck.listen_addr("--status-addr", args.status_addr)
    argcheck.writable_dir("--data-dir", args.data_dir)
    if not args.dsn.strip():
        raise errors.InvalidArgument("--dsn is empty: give the database's URL (see --help)")


def _run_source(cmd: SourceCommand, args: argparse.Namespace) -> int:
    """``binlake source NAME``: every check, then the source until a signal stops it."""
    _check_args(args)
    cmd.check(args)
    return _run(cmd.build(args, _pace(args), _max_pace(args)))


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


def _run(source: Source[Any]) -> int:
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
