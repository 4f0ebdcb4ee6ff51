"""``binlake ingest`` and ``binlake lake ...``: the lake from the command line.

Each command builds the one SparkSession (``lake.sparkenv.session.build_spark``) in this
process. Spark's own console output is turned down so that a refused window
prints one clear line (the CLI's ``binlake <cmd>: error: ...``), not a JVM
stack trace.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import sys
import time
from typing import Any

from binlake import config, errors, tso
from binlake.cli.args import window_args
from binlake.lake.sparkenv.session import command_session
from binlake.lake.sparkenv.spark_errors import command_error


def pump_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    pumps = [p.strip() for p in text.split(",") if p.strip()]
    if not pumps:
        raise errors.InvalidArgument("--pumps needs at least one pump id (comma-separated)")
    return pumps


# ---------------------------------------------------------------- binlake ingest
def ingest(args: argparse.Namespace, registry: str) -> int:
    from binlake.lake.ingest import ingest_window
    from binlake.lake.pumps.pump_check import plan_read

    start, end = window_args(args)
    writable_lake(args.lake)
    pumps = pump_list(args.pumps)
    # Refuse an unservable window in a second, before a JVM starts (ingest checks again).
    plan_read(registry, start, end, pumps)
    from rich.console import Console

    console = Console(stderr=True)
    began = time.monotonic()
    with console.status(f"ingest [{start}, {end})", spinner="dots") as status:
        def progress(message: str) -> None:
            status.update(f"[{time.monotonic() - began:5.1f}s] {message}")
            if not args.json:
                console.log(message, highlight=False)

        status.update("starting Spark")
        spark = command_session(args.master, quiet=args.log_level != "DEBUG")
        try:
            result = ingest_window(spark, args.lake, registry, start, end, pumps, progress,
                                   decode_here=args.decode_here_rows)
        except errors.BinlakeError:
            raise
        except (ValueError, TypeError) as exc:
            raise errors.InvalidArgument(str(exc)) from None
        except Exception as exc:  # a Spark/Delta failure: its first line, not a JVM trace
            raise command_error(exc, f"ingest [{start}, {end})") from None
    if args.json:
        print(json.dumps(result.to_dict(), sort_keys=True))
    else:
        print(result.summary())
    return 0


# ---------------------------------------------------------------- binlake lake windows / changes
def _fmt_ts(ts: int) -> str:
    return tso.to_datetime(ts).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if ts > 0 else "-"


def existing_lake(lake: str) -> None:
    """A local lake must be a directory that exists; an S3 lake's bucket must answer
    the configured endpoint and keys (other URIs are Spark's to resolve)."""
    from binlake.lake.store import location, s3

    if location.parse(lake, "--lake").is_s3:
        s3.probe(lake)
    if "://" not in lake and not os.path.isdir(lake):
        what = "is a file" if os.path.exists(lake) else "does not exist"
        raise errors.InvalidArgument(f"--lake {lake} {what}: give the lake directory an ingest wrote")


def writable_lake(lake: str) -> None:
    """A local lake must be a directory, or creatable under a writable one; an S3
    lake's bucket must answer the configured endpoint and keys (checked before a JVM
    starts, so nothing is written with settings that cannot work)."""
    from binlake.lake.store import location, s3

    if location.parse(lake, "--lake").is_s3:
        s3.probe(lake)
    if "://" in lake:
        return
    path = os.path.abspath(lake)
    if os.path.exists(path) and not os.path.isdir(path):
        raise errors.InvalidArgument(f"--lake {lake} is a file: give a directory for the lake")
    from binlake.cli.argcheck import can_create_under

    if not can_create_under(pathlib.Path(path)):
        raise errors.InvalidArgument(f"--lake {lake} cannot be created: no writable directory there")


def windows(args: argparse.Namespace) -> int:
    from binlake.lake.store.ledger import read_windows, uncovered

    existing_lake(args.lake)
    spark = command_session(args.master)
    try:
        rows = read_windows(spark, args.lake)
    except Exception as exc:
        raise command_error(exc, f"reading the windows of {args.lake}") from None
    if args.json:
        for r in rows:
            print(json.dumps(r, default=str, sort_keys=True))
        return 0
    if not rows:
        print(f"no windows ingested in {args.lake}")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Windows of {args.lake}", title_justify="left")
    for col in ("start (UTC)", "end (UTC)", "start_ts", "end_ts", "txns", "rows", "DDL", "pumps", "status",
                "ingested at"):
        table.add_column(col, justify="right" if col in ("txns", "rows", "DDL") else "left", no_wrap=True)
    for r in rows:
        table.add_row(_fmt_ts(r["start_ts"]), _fmt_ts(r["end_ts"]), str(r["start_ts"]), str(r["end_ts"]),
                      str(r["txns"]), str(r["rows"]), str(r["ddls"]), ",".join(r["pumps"]), r["status"],
                      str(r["ingested_at"])[:19])
    console = Console(width=220)
    console.print(table)
    first, last = rows[0]["start_ts"], max(r["end_ts"] for r in rows)
    gaps = uncovered(rows, first, last)
    if gaps:
        console.print("gaps (not ingested): " + ", ".join(f"[{a}, {b}) {_fmt_ts(a)} .. {_fmt_ts(b)}" for a, b in gaps))
    return 0


def changes(args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    from binlake.lake.store.ledger import is_delta
    from binlake.lake.store.location import CHANGES, table_path

    existing_lake(args.lake)
    if not args.table or not args.table.strip():
        raise errors.InvalidArgument("--table needs a table name (TABLE or DB.TABLE)")
    db, _, tbl = args.table.strip().rpartition(".")
    if args.from_ts is not None and args.to_ts is not None and args.from_ts >= args.to_ts:
        raise errors.InvalidArgument(f"--from-ts {args.from_ts} must be below --to-ts {args.to_ts}")
    spark = command_session(args.master)
    path = table_path(args.lake, CHANGES)
    if not is_delta(spark, path):
        raise errors.NotFound(f"no change table at {path}: nothing was ingested into {args.lake}")
    df = spark.read.format("delta").load(path).where(F.col("tbl") == tbl)
    if db:
        df = df.where(F.col("db") == db)
    if args.from_ts is not None:
        df = df.where(F.col("commit_ts") >= args.from_ts)
    if args.to_ts is not None:
        df = df.where(F.col("commit_ts") < args.to_ts)
    try:
        rows = df.orderBy("commit_ts", "seq").limit(args.limit).collect()
    except Exception as exc:
        raise command_error(exc, f"reading changes of {args.table}") from None
    if args.json:
        for r in rows:
            print(json.dumps(r.asDict(), default=_json_default, ensure_ascii=False))
        return 0
    if not rows:
        print(f"no changes of {args.table} in {args.lake}" + _range_text(args))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Changes of {args.table}" + _range_text(args), title_justify="left")
    for col in ("commit (UTC)", "commit_ts", "seq", "op", "keys", "before", "after"):
        table.add_column(col, overflow="fold" if col in ("before", "after") else "ellipsis")
    for r in rows:
        table.add_row(_fmt_ts(r["commit_ts"]), str(r["commit_ts"]), str(r["seq"]), r["op"], r["keys"],
                      _short(r["before"]), _short(r["after"]))
    Console(width=220).print(table)
    if len(rows) == args.limit:
        print(f"(first {args.limit}; use --limit or --from-ts/--to-ts for more)", file=sys.stderr)
    return 0


def _range_text(args: argparse.Namespace) -> str:
    if args.from_ts is None and args.to_ts is None:
        return ""
    return f" in [{args.from_ts if args.from_ts is not None else '-inf'}, {args.to_ts if args.to_ts is not None else '+inf'})"


def _short(image: str | None, limit: int = 300) -> str:
    if image is None:
        return "-"
    return image if len(image) <= limit else image[:limit] + "…"


def _json_default(value: Any) -> Any:
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    return str(value)


# ---------------------------------------------------------------- the commands' parsers
def register(sub: Any, bench: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """Add ``binlake ingest``, ``binlake lake ...`` and ``binlake bench ingest``
    (see ``binlake.cli._COMMAND_MODULES``)."""
    from binlake.cli.args import (
        add_lake,
        add_registry,
        add_window,
        number_in,
        positive_int,
        s3_lake_arg,
        scratch_dir,
        window_ts_arg,
    )

    p = sub.add_parser(
        "ingest", help="ingest a commit_ts window from every Pump into the Delta lake", formatter_class=fmt,
        description=(
            "Read the complete transactions of [start, end) from every Pump that may hold them, decode their\n"
            "row changes with the schema history, and write them to the lake's Delta tables: changes\n"
            "(partitioned by commit date), ddl_history and windows. Runs Spark in this process (the same job\n"
            "as jobs/ingest.py under spark-submit). Re-running a window replaces exactly its rows; a window\n"
            "overlapping an ingested one with other bounds is refused. Every Pump that may hold the window\n"
            "must have a safe ts at or above its end and a GC ts at or below its start; with replicated Pumps\n"
            "(binlake ctl replication: each binlog on R Pumps, acknowledged by W) up to W - 1 of them may be\n"
            "unreachable, since each acknowledged transaction is on one of the others. A window waiting for a\n"
            "Pump is refused naming it (exit 2: retry later)."
        ),
        epilog=(
            "Examples:\n"
            "  binlake ingest --start 2026-11-21T08:00 --end 2026-11-21T08:05 --lake data/lake\n"
            "  binlake ingest --start-ts 470614378216685568 --end-ts 470614456854364160 --lake data/lake \\\n"
            "                 --registry 127.0.0.1:8230 --pumps pump1,pump2 --json\n"
        ),
    )
    add_registry(p)
    add_window(p)
    add_lake(p)
    p.add_argument("--pumps", help="comma-separated Pump ids to read (default: every Pump that may hold the window)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object, no progress log")
    p.add_argument("--decode-here-rows", type=number_in(int, 0, 10_000_000, "a row count"), metavar="N",
                   default=None,
                   help="a window of at most N row changes is decoded in this process (on a local lake "
                        "appended by delta-rs as it is decoded, or streamed to staged files for Spark's replace, "
                        "in bounded batches; on S3 handed to Spark); a larger one is read "
                        "from the Pumps by Spark's tasks (default: no limit on a local lake, 100000 on S3; 0: "
                        "always by Spark's tasks, e.g. on a cluster whose executors should share the decoding)")
    p.set_defaults(handler=_ingest_command)

    lake = sub.add_parser(
        "lake", help="inspect the Delta lake (windows, changes, status, metrics)", formatter_class=fmt,
        description=("Inspect the lake's Delta tables: windows and changes read the lake alone; status and\n"
                     "metrics also ask the registry for the Pumps' safe ts and the consumers' checkpoints."))
    lsub = lake.add_subparsers(dest="lake_command", metavar="WHAT")
    c = lsub.add_parser("windows", help="table of ingested windows, with the gaps between them", formatter_class=fmt,
                        epilog="Example:\n  binlake lake windows --lake data/lake\n")
    add_lake(c)
    c.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    c = lsub.add_parser(
        "changes", help="row changes of one table, in commit order", formatter_class=fmt,
        epilog=(
            "Examples:\n"
            "  binlake lake changes --lake data/lake --table sbtest1 --limit 20\n"
            "  binlake lake changes --lake data/lake --table main.accounts --from-ts 470614378216685568 --json\n"
        ),
    )
    add_lake(c)
    c.add_argument("--table", required=True, help="TABLE or DB.TABLE (the name when the change was made)")
    c.add_argument("--from-ts", type=window_ts_arg, help="only changes with commit_ts >= this TSO")
    c.add_argument("--to-ts", type=window_ts_arg, help="only changes with commit_ts < this TSO")
    c.add_argument("--limit", type=positive_int, default=50, help="at most this many changes (default 50)")
    c.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    c = lsub.add_parser(
        "status", help="freshness: newest window, its lag behind the Pumps' safe ts, windows waiting",
        formatter_class=fmt,
        description=(
            "How fresh the lake is, without Spark: the newest ingested window, how far its end is behind\n"
            "the lowest safe ts of the online Pumps (the lag), the closed windows not ingested yet (gaps in\n"
            "the ledger, and windows of the newest one's length up to the safe ts), the Pumps and the\n"
            "consumers' checkpoints. `binlake lake metrics` serves the same figures to Prometheus."
        ),
        epilog="Examples:\n  binlake lake status --lake data/lake --registry 127.0.0.1:8230\n"
               "  binlake lake status --lake data/lake --json\n",
    )
    add_lake(c)
    add_registry(c)
    c.add_argument("--json", action="store_true", help="one JSON object instead of the report")
    c = lsub.add_parser(
        "metrics", help="serve the lake's freshness as Prometheus metrics (binlake_lake_lag_seconds, ...)",
        formatter_class=fmt,
        description=(
            "Serve http://ADDR/metrics until Ctrl-C; every scrape measures the lake as `binlake lake status`\n"
            "does: binlake_lake_lag_seconds, binlake_lake_windows_waiting, binlake_lake_windows,\n"
            "binlake_lake_newest_window_end_seconds, binlake_lake_consumer_checkpoint_seconds{consumer},\n"
            "binlake_lake_up (0 when the registry or the ledger cannot be read), and the last restore\n"
            "drill's binlake_drill_last_* (passed, rto_seconds, rpo_seconds, proving_share, ...)."
        ),
        epilog="Example:\n  binlake lake metrics --lake data/lake --registry 127.0.0.1:8230 --addr 127.0.0.1:8239\n",
    )
    add_lake(c)
    add_registry(c)
    c.add_argument("--addr", default="127.0.0.1:8239", help="HOST:PORT to serve /metrics on (default 127.0.0.1:8239)")
    lake.set_defaults(handler=_lake_command)

    b = bench.add_parser(
        "ingest", help="row changes/s from three Pumps into Delta vs Parquet->Delta", formatter_class=fmt,
        epilog="Example:\n  binlake bench ingest --rows 1000000 --runs 2\n",
    )
    b.add_argument("--rows", type=positive_int, default=1_000_000, help="row changes to ingest (default 1000000)")
    b.add_argument("--rows-per-txn", type=positive_int, default=2000, help="row changes per transaction (default 2000)")
    b.add_argument("--runs", type=positive_int, default=2, help="runs of each case; the best is reported (default 2)")
    b.add_argument("--master", help="Spark master (default local[*])")
    b.add_argument("--dir", type=scratch_dir, help="scratch directory (default: a temp dir under bench/)")
    b.add_argument("--lake", type=s3_lake_arg, metavar="s3://BUCKET/PREFIX",
                   help="also ingest into a lake under this S3 prefix each run, beside the local-disk lake "
                        "(endpoint and keys from AWS_* or [lake.s3])")
    b.add_argument("--seaweedfs", action="store_true",
                   help="with --lake: start a throwaway SeaweedFS on loopback and use it")
    b.add_argument("--decode-only", action="store_true",
                   help="only the decoding step: CPU µs per row change, Python path vs native (no Pumps, no Spark)")
    b.set_defaults(handler=_bench_command)


def _ingest_command(args: argparse.Namespace) -> int:
    from binlake.cli.args import lake_arg, registry_addr

    args.lake = lake_arg(args)
    if not args.lake:
        raise errors.InvalidArgument("ingest needs --lake PATH (the lake directory or URI), or $BINLAKE_LAKE_DIR")
    return ingest(args, registry_addr(args))


def _lake_command(args: argparse.Namespace) -> int:
    from binlake.cli import build_parser
    from binlake.cli.args import lake_arg

    if args.lake_command is None:
        build_parser().parse_args(["lake", "--help"])
    args.lake = lake_arg(args)
    if not args.lake:
        raise errors.InvalidArgument(f"lake {args.lake_command} needs --lake PATH, or $BINLAKE_LAKE_DIR")
    if args.lake_command == "status":
        return status(args)
    if args.lake_command == "metrics":
        return metrics(args)
    return windows(args) if args.lake_command == "windows" else changes(args)


def status(args: argparse.Namespace) -> int:
    """``binlake lake status``: the lake's freshness (``binlake.lake.freshness``)."""
    from binlake.cli.args import registry_addr
    from binlake.lake import freshness
    from binlake.lake.store import drills

    existing_lake(args.lake)
    f = freshness.measure(args.lake, registry_addr(args))
    # The memory bounds this host's data work runs with (what a job that ran out of
    # memory names), as this command's config file and environment set them.
    memory = config.memory()
    bounds = {**memory.model_dump(), "partition_bytes": memory.partition_bytes_in_force()}
    last = drills.last(args.lake)
    if args.json:
        print(json.dumps({**f.to_dict(), "memory": bounds, "last_drill": drills.summary(last)}, sort_keys=True,
                         default=str))
    else:
        for line in freshness.lines(f):
            print(line)
        print("last drill      " + drills.line(last))
        print("memory          " + ", ".join(f"{name} {value}" for name, value in bounds.items())
              + "  ([memory], BINLAKE_MEMORY_*)")
    return 0


def metrics(args: argparse.Namespace) -> int:
    """``binlake lake metrics``: serve the freshness gauges until interrupted."""
    from binlake.cli.args import registry_addr
    from binlake.lake import freshness

    existing_lake(args.lake)
    registry = registry_addr(args)
    freshness.ledger(args.lake)  # an unreadable lake is refused before serving
    try:
        server, where = freshness.serve(args.addr, args.lake, registry)
    except OSError as exc:
        raise errors.InvalidArgument(f"--addr {args.addr}: cannot listen there ({exc.strerror or exc})") from None
    print(f"binlake lake metrics: http://{where}/metrics (lake {args.lake}, registry {registry}); Ctrl-C stops",
          flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
    return 0


def _bench_command(args: argparse.Namespace) -> int:
    from binlake.cli.benchmarks import bench_module

    # bench/ingest_bench.py, found the way every benchmark is (``binlake.cli.benchmarks``).
    return int(bench_module("ingest").main(args))
