"""``binlake apply`` and ``binlake diff``: replication from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from binlake import errors, tso


def register(sub: Any, bench: Any, fmt: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "apply", help="apply the lake's change table to a target database (a task file)", formatter_class=fmt,
        description="Apply every ingested window after the target's checkpoint, in commit_ts order, exactly once.",
        epilog="Examples:\n  binlake apply --task config/task.sample.toml\n"
               "  binlake apply --task task.toml --until 2026-11-21T09:00\n"
               "  binlake apply status --task task.toml\n")
    p.add_argument("action", nargs="?", choices=["run", "status"], default="run",
                   help="run (default) or status (checkpoint, windows behind, lag)")
    p.add_argument("--task", required=True, help="task file (TOML; see config/task.sample.toml)")
    p.add_argument("--until-ts", type=int, help="apply only windows that end at or before this TSO")
    p.add_argument("--until", help="apply only windows that end at or before this datetime (UTC unless offset)")
    p.add_argument("--lake", default=None, help="lake directory or URI (default: the task file's lake)")
    p.add_argument("--target", default=None, help="target URL (default: the task file's target)")
    p.add_argument("--master", help="Spark master (default: $BINLAKE_SPARK_MASTER, else local[*])")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=apply_command)

    d = sub.add_parser(
        "diff", help="compare two databases table by table (chunked checksums)", formatter_class=fmt,
        description="Chunked checksum comparison of SOURCE and TARGET; exit 1 when they differ.",
        epilog="Example:\n  binlake diff sqlite:///data/up.db postgresql://app@127.0.0.1/replica --fix-sql fix.sql\n")
    d.add_argument("source", help="SQLAlchemy URL of the reference database")
    d.add_argument("target", help="SQLAlchemy URL of the database to check")
    d.add_argument("--tables", help="comma-separated table names (default: every table)")
    d.add_argument("--chunk-size", type=int, default=10_000, help="rows per checksum chunk (default 10000)")
    d.add_argument("--fix-sql", help="write the statements that make TARGET equal to SOURCE to this file "
                   "(as they are found: memory holds a chunk, whatever the differences)")
    d.add_argument("--keep-keys", type=int, default=None, metavar="N",
                   help="differing keys listed per table and kind; the counts are always exact "
                        "(default: [memory] diff_keys, $BINLAKE_MEMORY_DIFF_KEYS, else 100)")
    d.set_defaults(handler=diff_command)

    b = bench.add_parser(
        "apply", help="apply row changes/s into PostgreSQL/SQLite vs row-by-row and COPY", formatter_class=fmt,
        epilog="Example:\n  binlake bench apply --changes 200000 --windows 10\n")
    b.add_argument("--changes", type=_at_least(1000), default=1_000_000, help="row changes (default 1,000,000)")
    b.add_argument("--sqlite-changes", type=_at_least(1000), default=None,
                   help="run SQLite's cases (its row-by-row replay is slow) on the first N of the changes "
                        "(default: all of them); the table says which size each row is")
    b.add_argument("--windows", type=_at_least(1), default=10, help="lake windows they are cut into (default 10)")
    b.add_argument("--targets", type=_subset("postgresql", "sqlite"), default="postgresql,sqlite",
                   help="comma-separated, from postgresql,sqlite (default both)")
    b.add_argument("--modes", type=_subset("consistent", "parallel"), default="consistent,parallel",
                   help="comma-separated, from consistent,parallel (default both)")
    b.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    b.set_defaults(handler=bench_apply_command)


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    parse.__name__ = "positive_int"  # reported like the other positive counts
    return parse


def _subset(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items or not set(items) <= set(allowed):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list from {', '.join(allowed)}, got {text!r}")
        return ",".join(items)

    return parse


def bench_apply_command(args: argparse.Namespace) -> int:
    # bench/apply_bench.py, found the way every benchmark is (``binlake.cli.benchmarks``).
    from binlake.cli.benchmarks import bench_module

    return int(bench_module("apply").main(args))


def apply_command(args: argparse.Namespace) -> int:
    from binlake.replicate import report, runner, task

    _check_apply_args(args)
    t = task.load(args.task)
    until = parse_until(args.until_ts, args.until)
    if args.action == "status" and (until is not None):
        raise errors.InvalidArgument("apply status takes no --until/--until-ts")
    from binlake.lake.sparkenv.session import command_session
    from binlake.lake.sparkenv.spark_errors import command_error

    spark = command_session(args.master)
    applier = runner.Applier(spark, t, lake=args.lake, target_url=args.target,
                             progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.action == "status":
        st = applier.status()
        if args.json:
            print(json.dumps(st))
        else:
            for k, v in st.items():
                print(f"{k:<16} {v}")
        return 0
    try:
        summary = applier.run(until)
    except errors.BinlakeError:
        raise
    except Exception as exc:
        if type(exc).__module__.startswith(("py4j", "pyspark")):
            raise command_error(exc, "apply") from None
        raise
    if args.json:
        print(json.dumps(report.summary_dict(summary)))
    else:
        print(summary.summary())
    return 0


def _check_apply_args(args: argparse.Namespace) -> None:
    """The flags that override the task file, checked before Spark starts."""
    from binlake.cli import argcheck

    if not args.task.strip():
        raise errors.InvalidArgument("--task is empty: give a task file (see config/task.sample.toml)")
    if args.lake is not None:
        argcheck.lake("--lake", args.lake)
    if args.target is not None:
        argcheck.reachable_db("--target", args.target)


def diff_command(args: argparse.Namespace) -> int:
    from binlake.cli import argcheck
    from binlake.sql.diff import diff_databases

    argcheck.db_url("SOURCE", args.source)
    argcheck.db_url("TARGET", args.target)
    tables = argcheck.names("--tables", args.tables, "accounts,orders")
    if args.chunk_size < 1:
        raise errors.InvalidArgument(f"--chunk-size must be a positive number of rows, got {args.chunk_size}")
    if args.keep_keys is not None and args.keep_keys < 0:
        raise errors.InvalidArgument(f"--keep-keys must be a number of keys (0 or more), got {args.keep_keys}")
    if args.fix_sql is not None:
        argcheck.writable_file("--fix-sql", args.fix_sql)
    try:
        report = diff_databases(args.source, args.target, tables, args.chunk_size, args.fix_sql, args.keep_keys)
    except MemoryError:
        # A chunk's rows are what this process holds (the rest streams or spills to disk).
        raise errors.ResourceExhausted(
            f"out of memory in this process holding a chunk of --chunk-size {args.chunk_size} rows: "
            "lower --chunk-size") from None
    print(report.summary())
    return 0 if report.ok else 1


def parse_until(until_ts: int | None, until: str | None) -> int | None:
    """``--until-ts`` or ``--until`` (a datetime, UTC unless it has a zone) as a ts."""
    if until_ts is not None and until is not None:
        raise errors.InvalidArgument("give --until-ts or --until, not both")
    if until is not None:
        try:
            return tso.parse_datetime(until)
        except ValueError as exc:
            raise errors.InvalidArgument(f"--until: {exc}") from None
    if until_ts is not None and until_ts <= 0:
        raise errors.InvalidArgument(f"--until-ts must be a positive TSO, got {until_ts}")
    return until_ts
