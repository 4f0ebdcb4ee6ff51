"""``binlake apply`` and ``binlake diff``: replication from the command line."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

from binlake import errors


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
    d.add_argument("--fix-sql", help="write the statements that make TARGET equal to SOURCE to this file")
    d.set_defaults(handler=diff_command)

    # The benchmark lives in the repository's bench/ folder, beside its results.
    bench_dir = pathlib.Path(__file__).resolve().parents[3] / "bench"
    if (bench_dir / "apply_bench.py").is_file():
        sys.path.insert(0, str(bench_dir))
        import apply_bench

        apply_bench.register(bench, fmt)


def apply_command(args: argparse.Namespace) -> int:
    from binlake.replicate import runner, task

    _check_apply_args(args)
    t = task.load(args.task)
    until = runner.parse_until(args.until_ts, args.until)
    if args.action == "status" and (until is not None):
        raise errors.InvalidArgument("apply status takes no --until/--until-ts")
    from binlake.lake.commands import _spark_error, session

    spark = session(args.master)
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
            raise _spark_error(exc, "apply") from None
        raise
    if args.json:
        print(json.dumps(runner.summary_dict(summary)))
    else:
        print(summary.summary())
    return 0


def _check_apply_args(args: argparse.Namespace) -> None:
    """The flags that override the task file, checked before Spark starts."""
    from binlake import argcheck

    if not args.task.strip():
        raise errors.InvalidArgument("--task is empty: give a task file (see config/task.sample.toml)")
    if args.lake is not None:
        argcheck.lake("--lake", args.lake)
    if args.target is not None:
        argcheck.reachable_db("--target", args.target)


def diff_command(args: argparse.Namespace) -> int:
    from binlake import argcheck
    from binlake.replicate.diff import diff_databases

    argcheck.db_url("SOURCE", args.source)
    argcheck.db_url("TARGET", args.target)
    tables = argcheck.names("--tables", args.tables, "accounts,orders")
    if args.chunk_size < 1:
        raise errors.InvalidArgument(f"--chunk-size must be a positive number of rows, got {args.chunk_size}")
    if args.fix_sql is not None:
        argcheck.writable_file("--fix-sql", args.fix_sql)
    report = diff_databases(args.source, args.target, tables, args.chunk_size, args.fix_sql)
    print(report.summary())
    return 0 if report.ok else 1
