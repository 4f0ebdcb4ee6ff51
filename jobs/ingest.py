"""spark-submit entry point: ingest one commit_ts window into the Delta lake.

    spark-submit jobs/ingest.py --start-ts A --end-ts B --lake PATH --registry HOST:PORT [--pumps p1,p2]

Argument parsing, one SparkSession (``binlake.lake.sparkenv.session.build_spark``), one
call to ``binlake.lake.ingest.ingest_window``; the result is printed as one
JSON line (last line of stdout). A refused window exits with its message on
stderr and status 3 when no retry can help (below a Pump's GC ts, overlapping
an ingested window with other bounds, a bad argument) or 2 when a retry may
(a Pump unreachable, a safe ts still below the window end); anything else
exits non-zero with Spark's error. Airflow's ingest task fails at once on 3.
A malformed argument (bad TSO, registry address, lake path or master) is one
line and exit 2, before a JVM starts.
"""

from __future__ import annotations

import argparse
import json
import sys

from binlake import config, errors
from binlake.cli.args import Parser, ts_arg
from binlake.net import DEFAULT_REGISTRY_ADDR


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="jobs/ingest.py", description=__doc__.splitlines()[0])
    parser.add_argument("--start-ts", type=ts_arg, required=True, help="window start (inclusive), a TSO")
    parser.add_argument("--end-ts", type=ts_arg, required=True, help="window end (exclusive), a TSO")
    # The defaults come from binlake.config ([lake] dir, [cluster] registry), read when
    # the job starts; a bad value there is a one-line error naming its variable.
    try:
        lake = config.load(config.LakeSettings).dir
        registry = config.load(config.ClusterSettings).registry or DEFAULT_REGISTRY_ADDR
    except errors.ConfigError as exc:
        parser.error(str(exc))
    parser.add_argument("--lake", default=lake, required=lake is None,
                        help="lake directory or URI (default: $BINLAKE_LAKE_DIR)")
    parser.add_argument("--registry", default=registry,
                        help="registry HOST:PORT or a group's HOST:PORT,HOST:PORT,... "
                        f"(default: $BINLAKE_REGISTRY, else {DEFAULT_REGISTRY_ADDR})")
    parser.add_argument("--pumps", help="comma-separated Pump ids (default: every Pump that may hold the window)")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, $BINLAKE_SPARK_MASTER or local[*])")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, every one checked before a JVM starts (a mistake: one line, exit 2)."""
    from binlake import errors, net
    from binlake.lake.commands import pump_list, writable_lake
    from binlake.lake.sparkenv.session import check_master

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.start_ts >= args.end_ts:
        parser.error(f"window [{args.start_ts}, {args.end_ts}) is empty: --start-ts must be below --end-ts")
    try:
        net.parse_addr_list(args.registry, "--registry")
        writable_lake(args.lake)
        pump_list(args.pumps)
        if args.master is not None:
            check_master(args.master, "--master")
    except errors.InvalidArgument as exc:
        parser.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from binlake import errors
    from binlake.lake.commands import pump_list
    from binlake.lake.ingest import ingest_window
    from binlake.lake.sparkenv.session import LAKE_CONF, build_spark

    try:
        spark = build_spark("binlake-ingest", args.master, extra_conf=LAKE_CONF)
        result = ingest_window(spark, args.lake, args.registry, args.start_ts, args.end_ts, pump_list(args.pumps),
                               progress=lambda message: print(message, file=sys.stderr, flush=True))
    except errors.BinlakeError as exc:
        final = errors.is_final(exc)
        print(f"ingest: error{' (retrying cannot help)' if final else ''}: {exc}", file=sys.stderr)
        return errors.EXIT_FINAL if final else errors.EXIT_RETRYABLE
    print(result.summary(), file=sys.stderr)
    print(json.dumps(result.to_dict(), sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
