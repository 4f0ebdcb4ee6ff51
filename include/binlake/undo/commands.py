"""``binlake undo`` and ``binlake bench undo``.

Registered in ``binlake.cli`` (``_COMMAND_MODULES``). Every refusal (a range
the windows ledger does not cover, an unknown table, a --where that does not
parse, a target without the table, an apply target not yet past the changes)
comes before anything is written and reaches the user as one line, exit 2;
conflicts list the first ones and end with one line, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from binlake import errors
from binlake.cli.args import positive_int, spark_bench_args

_EPILOG = """\
Examples:
  # What would a revert of 14:03-14:05 (Paris time) on shop.orders do? Nothing is written.
  binlake undo --lake data/lake --start 2026-11-21T14:03 --end 2026-11-21T14:05 --tz Europe/Paris \\
               --tables shop.orders --target postgresql://app@db/shop --dry-run
  # The same as SQL for review, then run it.
  binlake undo --lake data/lake --start 2026-11-21T14:03 --end 2026-11-21T14:05 --tz Europe/Paris \\
               --tables shop.orders --target postgresql://app@db/shop --sql undo-0903.sql
  binlake undo --lake data/lake --start 2026-11-21T14:03 --end 2026-11-21T14:05 --tz Europe/Paris \\
               --tables shop.orders --target postgresql://app@db/shop
  # Exact transactions, only their deletes:
  binlake undo --lake data/lake --txn 470614378216685568 --where "op = 'delete'" --target sqlite:///app.db
"""


def _max(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of conflicts to list (0 or more), got {text!r}")
    return value


def register(sub: Any, bench: Any, fmt: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "undo", help="revert the rows a bad change touched, from the lake's images (flashback)", formatter_class=fmt,
        description=(
            "For every key the chosen changes touched, put back the image it had before the first of them, if\n"
            "the target still holds the image the last of them left. Any other row is a conflict: nothing is\n"
            "written and the first conflicts are listed (--skip-conflicts reverts the rest, --force overwrites).\n"
            "One target transaction, recorded in _binlake_undo: a rerun does nothing, a killed run leaves the\n"
            "target as it was. Changes: --start/--end ([T1, T2): TSOs or datetimes) or --txn START_TS[,...]."),
        epilog=_EPILOG)
    p.add_argument("--lake", help="lake directory or URI (default: [lake] dir, $BINLAKE_LAKE_DIR)")
    p.add_argument("--master", help="Spark master (default: $BINLAKE_SPARK_MASTER, else local[*])")
    p.add_argument("--start", metavar="T1", help="first commit_ts to undo (inclusive): a TSO or a datetime")
    p.add_argument("--end", metavar="T2", help="end of the range (exclusive): a TSO or a datetime")
    p.add_argument("--tz", help="time zone of datetimes (IANA name such as Europe/Paris, or UTC; default local)")
    p.add_argument("--txn", metavar="START_TS[,...]", help="undo exactly these transactions (their start_ts)")
    p.add_argument("--tables", help="comma-separated TABLE or DB.TABLE names, as named today (default: every "
                                    "table the changes touched)")
    p.add_argument("--where", help="Spark SQL predicate over the change rows: op, db, table, commit_ts, start_ts, "
                                   "before.COL, after.COL (e.g. \"op = 'update' AND before.status = 'paid'\")")
    p.add_argument("--target", required=True, help="URL of the database to revert: sqlite:///FILE, "
                                                   "postgresql://USER@HOST/DB, mysql://USER@HOST/DB")
    p.add_argument("--dry-run", action="store_true", help="print the plan (rows per table, conflicts); write nothing")
    p.add_argument("--sql", metavar="FILE", help="write the statements (the target's dialect) to FILE instead of "
                                                 "running them")
    p.add_argument("--skip-conflicts", action="store_true", help="revert every key but the conflicting ones")
    p.add_argument("--force", action="store_true", help="revert conflicting keys too (overwrite later changes)")
    p.add_argument("--max-conflicts", type=_max, default=20, metavar="N", help="conflicts listed (default 20)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object, no progress log")
    p.set_defaults(handler=undo_cmd)

    b = bench.add_parser(
        "undo", help="undo of N row changes into PostgreSQL and MariaDB vs the apply and mariadb-binlog --flashback",
        formatter_class=fmt,
        epilog="Examples:\n  binlake bench undo --changes 100000\n  binlake bench undo\n")
    b.add_argument("--changes", type=positive_int, default=1_000_000, help="row changes to undo (default 1000000)")
    spark_bench_args(b)
    b.set_defaults(handler=bench_cmd)


def options(args: argparse.Namespace) -> Any:
    from binlake.undo import revert

    return revert.Options(dry_run=args.dry_run, sql_file=args.sql, skip_conflicts=args.skip_conflicts,
                          force=args.force, max_conflicts=args.max_conflicts)


def undo_cmd(args: argparse.Namespace) -> int:
    from binlake.cli import argcheck
    from binlake.restore.commands import _check_lake, _run
    from binlake.undo import selection, steps

    sel = selection.choose(args.start, args.end, txns=args.txn, tables=args.tables, where=args.where, tz=args.tz)
    opts = options(args)
    lake = _check_lake(args)
    steps.check(sel, args.target, opts)
    argcheck.reachable_db("--target", args.target)
    _plan, result = _run(args, "undo", lambda spark, say: steps.run(spark, lake, sel, args.target, opts, say))
    if args.json:
        print(json.dumps(result.to_dict(), sort_keys=True))
    else:
        print(result.summary())
    if result.mode == "conflicts":
        raise errors.Conflict(
            f"{result.conflict_count:,} key(s) changed since the changes to undo: nothing written; review the "
            "conflicts above, then rerun with --skip-conflicts (revert the others) or --force (overwrite them)")
    return 0


def bench_cmd(args: argparse.Namespace) -> int:
    # bench/undo_bench.py, found the way every benchmark is (``binlake.cli.benchmarks``).
    from binlake.cli.benchmarks import bench_module

    return int(bench_module("undo").main(args))
