"""``binlake drill``, ``binlake drill report`` and ``binlake bench drill``.

Registered in ``binlake.cli`` (``_COMMAND_MODULES``). Every user mistake (a bad
flag, a ts the lake does not cover, an unknown table, a bad task file) is refused
before anything is written, as one line; a drill that ran and failed is one line
too (the table and first differing key, or the objective), after its row is in
``LAKE/drills``. Both exit with status 2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from binlake import errors, tso
from binlake.cli.args import non_negative_int, positive_float, positive_int, spark_bench_args


def _ts(text: str) -> int:
    """A commit_ts flag of ``drill`` (which takes no datetime: the ts is drawn or given
    as the TSO a replay names)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a commit_ts (a TSO such as 470614378216685568), got {text!r}; leave --ts out to draw "
            "one with the seed") from None
    if not 0 < value < tso.MAX_TS:
        raise argparse.ArgumentTypeError(f"a commit_ts is a positive integer below 2^63, got {value}")
    return value


def register(sub: Any, bench: Any, fmt: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "drill", help="restore tables at a commit_ts into a scratch target and prove it; RTO and RPO",
        formatter_class=fmt,
        description=(
            "Restore some tables at some commit_ts into a scratch target (a SQLite file by default) and prove\n"
            "the result by independent means, each reported separately:\n"
            "  (a) every apply target equals a restore at exactly its checkpoint, through its task's rules;\n"
            "  (b) the scratch target (the restore's path: the newest snapshot + changes) equals the same\n"
            "      tables rebuilt by the lake's other restore paths (the whole history, the history tables);\n"
            "  (c) with --upstream, tables unchanged since the ts have the upstream's checksums now.\n"
            "Measures the RTO (the restore's seconds, rows/s, GB/h) and the RPO (now - the newest ingested\n"
            "window end; each Pump's safe-ts lag when the registry answers) against [drill] rpo_s/rto_s.\n"
            "The ts and tables are drawn with a seed unless given; the drill is recorded in LAKE/drills.\n"
            "A difference, a restore error or a missed objective: one line, exit status 2."),
        epilog=("Examples:\n  binlake drill --lake data/lake\n"
                "  binlake drill --lake data/lake --seed 7 --until-ts 470614378216685568   (a replay)\n"
                "  binlake drill --lake data/lake --tables accounts --ts 470614378216685568 \\\n"
                "                --upstream sqlite:///up.db --rto-s 60\n"
                "  binlake drill report --lake data/lake --html drills.html\n"))
    _common(p)
    p.add_argument("--ts", type=_ts, help="the commit_ts to restore (default: drawn with the seed)")
    p.add_argument("--tables", help="comma-separated TABLE or DB.TABLE (default: drawn with the seed)")
    p.add_argument("--count", type=positive_int, help="tables to draw (default [drill] tables, 10)")
    p.add_argument("--seed", type=non_negative_int, help="the seed to draw the ts and tables with (default: a fresh one, recorded)")
    p.add_argument("--until-ts", type=_ts, help="draw from windows ending at or below this TSO "
                                                "(default: the newest window end; recorded)")
    p.add_argument("--target", help="scratch database URL (default: a SQLite file in a temporary directory, "
                                    "below [drill] scratch_dir when set); "
                                    "the drill's tables must not exist there")
    p.add_argument("--tasks", help="apply task files to prove against: a directory of *.toml or comma-separated "
                                   "files (default [apply] tasks, else config/tasks)")
    p.add_argument("--upstream", help="the upstream database URL, for proof (c)")
    p.add_argument("--registry", help="registry HOST:PORT, for each Pump's safe-ts lag (default: [cluster] registry; "
                                      "skipped when it does not answer)")
    p.add_argument("--rpo-s", type=positive_float, help="RPO objective in seconds (default [drill] rpo_s)")
    p.add_argument("--rto-s", type=positive_float, help="RTO objective in seconds (default [drill] rto_s)")
    p.add_argument("--report", metavar="FILE", help="also write the HTML report there after the drill")
    p.add_argument("--no-record", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=drill_cmd)
    dsub = p.add_subparsers(dest="drill_command", metavar="SUBCOMMAND")
    r = dsub.add_parser("report", help="the drills' HTML report: RPO and RTO over time, verdict history",
                        formatter_class=fmt,
                        epilog="Example:\n  binlake drill report --lake data/lake --html drills.html\n")
    _common(r)
    r.add_argument("--html", metavar="FILE", help="write the self-contained HTML page here")
    r.set_defaults(handler=report_cmd)

    b = bench.add_parser("drill", help="a drill of N tables: RTO and the share spent proving", formatter_class=fmt,
                         epilog="Example:\n  binlake bench drill --tables 10 --rows 100000\n")
    b.add_argument("--tables", type=positive_int, default=10, help="tables (default 10)")
    b.add_argument("--rows", type=positive_int, default=100_000, help="rows in all (default 100000)")
    spark_bench_args(b)
    b.set_defaults(handler=bench_cmd)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lake", help="lake directory or URI (default: [lake] dir, $BINLAKE_LAKE_DIR)")
    p.add_argument("--master", help="Spark master (default: $BINLAKE_SPARK_MASTER, else local[*])")
    p.add_argument("--config", help="TOML config file (its [drill] and [apply] tables)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _lake(args: argparse.Namespace) -> str:
    from binlake.cli import argcheck
    from binlake.cli.args import lake_arg

    lake = lake_arg(args)
    if lake is None:
        raise errors.InvalidArgument("no lake given: pass --lake DIR or set BINLAKE_LAKE_DIR")
    return argcheck.lake("--lake", lake)


def drill_cmd(args: argparse.Namespace) -> int:
    from binlake import config
    from binlake.cli import argcheck
    from binlake.restore.commands import _run, _tables

    if args.config is not None:
        config.check_file(args.config)
    settings = config.load(config.DrillSettings, args.config, rpo_s=args.rpo_s, rto_s=args.rto_s, tables=args.count)
    lake = _lake(args)
    from binlake.drill import run as drill_run

    tasks_text = args.tasks if args.tasks is not None else config.load(config.ApplySettings, args.config).tasks
    tasks, notes = drill_run.load_tasks(drill_run.task_files(tasks_text))
    if args.target is not None:
        argcheck.reachable_db("--target", args.target)
    if args.upstream is not None:
        argcheck.reachable_db("--upstream", args.upstream)
    if args.report is not None:
        argcheck.writable_file("--report", args.report)
    if args.target is None and settings.scratch_dir is not None:
        argcheck.writable_dir("[drill] scratch_dir", settings.scratch_dir)
    if args.registry is not None:
        # Checked here though an unanswering registry is only skipped: a malformed one is a mistake.
        if not args.registry.strip():
            argcheck.addr("--registry", args.registry)
        argcheck.addr_list("--registry", args.registry)
    registry = args.registry if args.registry is not None else config.load(config.ClusterSettings).registry
    tables = _tables(args.tables)
    args.tz = None

    def go(spark: Any, say: Any) -> Any:
        try:
            return drill_run.run(
                spark, lake, ts=args.ts, tables=tables, seed=args.seed, until_ts=args.until_ts,
                count=settings.tables, target=args.target, tasks=tasks, task_notes=notes, upstream=args.upstream,
                registry=registry, rpo_objective_s=settings.rpo_s, rto_objective_s=settings.rto_s,
                record=not args.no_record, progress=say, scratch_dir=settings.scratch_dir)
        finally:
            if args.report is not None:
                _write_report(lake, args.report)

    d = _run(args, "drill", go)
    print(json.dumps(d.to_dict(), sort_keys=True, default=str) if args.json else d.summary())
    return 0


def _write_report(lake: str, path: str) -> None:
    from binlake.drill import report
    from binlake.lake.store import drills

    report.write(path, drills.read(lake), lake)


def report_cmd(args: argparse.Namespace) -> int:
    from binlake import config
    from binlake.cli import argcheck
    from binlake.lake.store import drills

    if args.config is not None:
        config.check_file(args.config)
    lake = _lake(args)
    if args.html is None and not args.json:
        raise errors.InvalidArgument("drill report needs --html FILE (the page) or --json (the drills as JSON)")
    if args.html is not None:
        argcheck.writable_file("--html", args.html)
        _write_report(lake, args.html)
    rows = drills.read(lake)
    if args.json:
        print(json.dumps(rows, sort_keys=True, default=str))
    else:
        print(f"wrote {args.html}: {len(rows)} drill(s)")
    return 0


def bench_cmd(args: argparse.Namespace) -> int:
    # bench/drill_bench.py, found the way every benchmark is (``binlake.cli.benchmarks``).
    from binlake.cli.benchmarks import bench_module

    return int(bench_module("drill").main(args))
