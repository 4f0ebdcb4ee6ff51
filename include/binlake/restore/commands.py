"""``binlake snapshot``, ``binlake history``, ``binlake restore``, ``binlake bench restore`` and ``binlake bench scale``.

Registered in ``binlake.cli`` (``_COMMAND_MODULES``). Every refusal (a ts the
ledger does not cover, an unknown table, an occupied --out, an unreachable
target) is raised before anything is written and reaches the user as one line.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from binlake import errors, tso
from binlake.cli.args import int_list, positive_int, s3_lake_arg, spark_bench_args


def _ts(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a commit_ts (a TSO such as 470614378216685568), got {text!r}; use --datetime for a time") \
            from None
    if not 0 < value < tso.MAX_TS:
        raise argparse.ArgumentTypeError(f"a commit_ts is a positive integer below 2^63, got {value}")
    return value


def _tables(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise errors.InvalidArgument("--tables needs at least one table name (comma-separated, TABLE or DB.TABLE)")
    return names


def _rename(text: str) -> str:
    from binlake.restore import naming

    try:
        naming.parse_renames(text)
    except errors.InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--rename ")) from None
    return text


def _schema(text: str) -> str:
    from binlake.restore import naming

    try:
        return str(naming.parse_schema(text))
    except errors.InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--into-schema ")) from None


def _run_id(text: str) -> str:
    from binlake.restore import naming

    try:
        return naming.check_run_id(text)
    except errors.InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--run-id ")) from None


def _parallel(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"expected a number of tables from 1 to 64, got {text!r}")
    return value


def _parallelism(args: argparse.Namespace) -> int:
    """--parallel, else the config file's / environment's [restore] parallelism."""
    from binlake import config

    if getattr(args, "config", None) is not None:
        config.check_file(args.config)
    return int(config.load(config.RestoreSettings, getattr(args, "config", None),
                           parallelism=getattr(args, "parallel", None)).parallelism)


def _lake_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lake", help="lake directory or URI (default: [lake] dir, $BINLAKE_LAKE_DIR)")
    p.add_argument("--master", help="Spark master (default: $BINLAKE_SPARK_MASTER, else local[*])")
    p.add_argument("--tables", help="comma-separated TABLE or DB.TABLE names (default: every table)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object, no progress log")
    p.add_argument("--config", help="TOML config file (its [restore] table: parallelism)")
    p.add_argument("--parallel", type=_parallel, metavar="N",
                   help="tables written or loaded at once after the one pass over the lake (1-64; default: "
                        "[restore] parallelism, env BINLAKE_RESTORE_PARALLELISM, else 4)")


def _time_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ts", type=_ts, help="commit_ts T: every transaction with commit_ts <= T, none after")
    p.add_argument("--datetime", help="a datetime instead of --ts (ISO-8601; local time unless --tz or an offset)")
    p.add_argument("--tz", help="time zone of --datetime (IANA name such as Europe/Paris, or UTC)")


def register(sub: Any, bench: Any, fmt: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "snapshot", help="typed Delta tables of every table as of a commit_ts", formatter_class=fmt,
        description=(
            "Write each table (or --tables) as of commit_ts T to LAKE/snapshots/ts=T/ as typed Delta tables,\n"
            "computed from the newest earlier snapshot plus the changes in between (or the whole history).\n"
            "Restores at or after T then start from it."),
        epilog=("Examples:\n  binlake snapshot --lake data/lake --ts 470614378216685568\n"
                "  binlake snapshot --lake data/lake --datetime 2026-11-21T08:00 --tz UTC --tables accounts\n"))
    _lake_args(p)
    _time_args(p)
    p.set_defaults(handler=snapshot_cmd)

    p = sub.add_parser(
        "history", help="bring the SCD2 history tables up to date with the ingested windows", formatter_class=fmt,
        description=(
            "Keep LAKE/history/t<table_id>: one typed row per version of each row with _valid_from_ts,\n"
            "_valid_to_ts (null while current) and _op, applied window by window from the windows ledger.\n"
            "The table at T:  WHERE _valid_from_ts <= T AND (_valid_to_ts IS NULL OR _valid_to_ts > T)"),
        epilog="Example:\n  binlake history --lake data/lake\n")
    _lake_args(p)
    p.set_defaults(handler=history_cmd)

    p = sub.add_parser(
        "restore", help="rebuild every table as of a commit_ts (Delta tables or a target database)",
        formatter_class=fmt,
        description=(
            "Rebuild every table (or --tables) as of commit_ts T (Reparo's stop-tso: every transaction with\n"
            "commit_ts <= T, none after) from the newest snapshot at or below T plus the changes after it.\n"
            "A T the windows ledger does not cover (above the newest window, in a gap, below the lake's\n"
            "data) is refused with the window to ingest. --out writes typed Delta tables OUT/<db>.<table>;\n"
            "--target creates the tables from the schema at T and bulk-loads them; --verify then runs\n"
            "binlake diff against a source database.\n\n"
            "Into a live database: --target creates only the restored tables and touches nothing else.\n"
            "--rename OLD=NEW (repeat it, or comma-separate) gives a table another name: OLD is one of the\n"
            "restored tables (TABLE or DB.TABLE as named at T), NEW is TABLE or DB.TABLE, where a DB equal\n"
            "to OLD's keeps the table where the restore puts every table and another DB names a schema\n"
            "(PostgreSQL) or database (MySQL/MariaDB). --into-schema S puts every table in S (created if\n"
            "missing; a --rename then gives TABLE or S.TABLE). SQLite and DuckDB have no schemas: both\n"
            "are refused there. With --out they name the directories OUT/<schema or db>.<table>.\n"
            "Every name is checked before the first write (valid for the database, no two tables onto\n"
            "one name); a table already in the target is refused unless --replace, except one the same\n"
            "--run-id created: a killed restore is finished by running it again with its run id (logged)."),
        epilog=("Examples:\n  binlake restore --lake data/lake --ts 470614378216685568 --out data/restored\n"
                "  binlake restore --lake data/lake --datetime '2026-11-21 08:00:00' --tz Europe/Paris \\\n"
                "                  --tables accounts --target sqlite:///restored.db --verify sqlite:///up.db\n"
                "  # the orders as they were at 14:02, next to the live ones:\n"
                "  binlake restore --lake data/lake --datetime '2026-09-03 14:02' --tz UTC --tables shop.orders \\\n"
                "                  --rename shop.orders=shop.orders_0903 --target postgresql://app@db/shop\n"
                "  # a set of tables into a schema of its own (PostgreSQL schema, MariaDB database):\n"
                "  binlake restore --lake data/lake --ts 470614378216685568 --tables shop.orders,shop.items \\\n"
                "                  --into-schema restored_0903 --target mysql://root@db/shop\n"))
    _lake_args(p)
    _time_args(p)
    dest = p.add_mutually_exclusive_group()
    dest.add_argument("--out", help="directory for the typed Delta tables")
    dest.add_argument("--target", help="URL of a database to create and load the tables in: "
                                       "sqlite:///FILE, postgresql://USER@HOST/DB, mysql://USER@HOST/DB or "
                                       "duckdb:///FILE (a DuckDB file to query on a laptop)")
    p.add_argument("--verify", metavar="SOURCE_URL", help="after --target, compare with this database (binlake diff)")
    p.add_argument("--rename", action="append", type=_rename, metavar="OLD=NEW",
                   help="restore table OLD as NEW (TABLE or DB.TABLE); repeat it or comma-separate pairs")
    p.add_argument("--into-schema", type=_schema, metavar="S",
                   help="put every restored table in schema (PostgreSQL) / database (MariaDB) S, created if "
                        "missing; with --out, directories OUT/S.<table>")
    p.add_argument("--run-id", type=_run_id, metavar="ID",
                   help="with --target: the run the created tables are claimed for (default: a new one, shown in "
                        "the log); a rerun with the same ID replaces what that run created, to finish it")
    p.add_argument("--replace", action="store_true",
                   help="overwrite tables already in --out, or in --target tables this restore did not create")
    p.add_argument("--source", choices=["auto", "changes", "history"], default="auto",
                   help="base: auto (newest snapshot, else the whole history), changes (whole history only), "
                        "history (the history tables)")
    p.set_defaults(handler=restore_cmd)

    b = bench.add_parser(
        "restore", help="restore at a late ts: whole history, snapshot, history tables vs SQLite replay",
        formatter_class=fmt,
        epilog=("Examples:\n  binlake bench restore --rows 1000000 --changes 5000000\n"
                "  binlake bench restore --tables 10,1000\n"))
    b.add_argument("--rows", type=positive_int, default=1_000_000, help="rows of the table (default 1000000)")
    b.add_argument("--changes", type=positive_int, default=5_000_000, help="row changes of its history (default 5000000)")
    spark_bench_args(b)
    b.add_argument("--tables", type=int_list, help="comma-separated table counts (e.g. 10,1000): the same rows spread over each, "
                                    "restored into SQLite, PostgreSQL and Delta (default rows 20000)")
    b.add_argument("--parallel", type=_parallel, default=4, metavar="N", help="tables written at once (default 4)")
    b.add_argument("--lake", type=s3_lake_arg, metavar="s3://BUCKET/PREFIX",
                   help="build and restore the lake under this S3 prefix (endpoint and keys from AWS_* or [lake.s3])")
    b.add_argument("--seaweedfs", action="store_true", help="with --lake: start a throwaway SeaweedFS on loopback")
    b.set_defaults(handler=bench_cmd)

    b = bench.add_parser(
        "scale", help="snapshot, history, restore, apply and diff of one wide table at growing sizes: "
                      "throughput, floors, peak memory per process", formatter_class=fmt,
        epilog=("Examples:\n  binlake bench scale --rows 20000\n"
                "  binlake bench scale --rows 1000000,10000000 --master local[2]\n"))
    b.add_argument("--rows", type=int_list, default="1000000",
                   help="rows of the table, comma-separated for several sizes (default 1000000); "
                        "each with 2 changes a row")
    spark_bench_args(b, "Spark master (default: $BINLAKE_SPARK_MASTER, else local[*])")
    b.add_argument("--parallel", type=_parallel, default=4, metavar="N", help="tables written at once (default 4)")
    b.add_argument("--no-s3", action="store_true", help="leave out the restore into Delta on S3 (SeaweedFS)")
    b.set_defaults(handler=bench_scale_cmd)


def _session(args: argparse.Namespace) -> Any:
    from binlake.lake.sparkenv.session import command_session

    return command_session(args.master, quiet=args.log_level != "DEBUG")


def _check_lake(args: argparse.Namespace) -> str:
    from binlake.cli import argcheck
    from binlake.cli.args import lake_arg

    args.lake = lake_arg(args)
    if args.lake is None:
        raise errors.InvalidArgument("no lake given: pass --lake DIR or set BINLAKE_LAKE_DIR")
    if getattr(args, "tz", None) is not None and not args.tz.strip():
        raise errors.InvalidArgument("--tz is empty: give an IANA time zone such as Europe/Paris, or UTC")
    return argcheck.lake("--lake", args.lake)


def _resolve(args: argparse.Namespace) -> int:
    from binlake.restore.restore import resolve_ts

    return resolve_ts(args.ts, args.datetime, args.tz)


def _run(args: argparse.Namespace, what: str, fn: Any) -> Any:
    """Run ``fn(spark, progress)`` with a status line; Spark failures become one line."""
    from rich.console import Console

    from binlake.lake.sparkenv.spark_errors import command_error

    console = Console(stderr=True)
    began = time.monotonic()
    with console.status(what, spinner="dots") as status:
        def progress(message: str) -> None:
            status.update(f"[{time.monotonic() - began:5.1f}s] {message}")
            if not args.json:
                console.log(message, highlight=False)

        status.update("starting Spark")
        spark = _session(args)
        try:
            return fn(spark, progress)
        except errors.BinlakeError:
            raise
        except (ValueError, TypeError) as exc:
            raise errors.InvalidArgument(str(exc)) from None
        except Exception as exc:
            raise command_error(exc, what) from None


def snapshot_cmd(args: argparse.Namespace) -> int:
    from binlake.restore import snapshot

    # The config file first: a bad one is the user's first mistake to hear about.
    parallelism = _parallelism(args)
    lake = _check_lake(args)
    ts = _resolve(args)
    tables = _tables(args.tables)
    result = _run(args, f"snapshot at {ts}", lambda spark, say: snapshot.take(spark, lake, ts, tables, say,
                                                                              parallelism))
    if args.json:
        print(json.dumps({"snapshot_ts": result.snapshot_ts, "rows": result.rows,
                          "tables": [{"table": t, "rows": n, "base": b} for t, n, b in result.tables],
                          "elapsed_s": round(result.elapsed_s, 3)}))
    else:
        print(result.summary())
    return 0


def history_cmd(args: argparse.Namespace) -> int:
    from binlake.restore import history

    parallelism = _parallelism(args)
    lake = _check_lake(args)
    tables = _tables(args.tables)
    result = _run(args, "history tables", lambda spark, say: history.update(spark, lake, tables, say, parallelism))
    if args.json:
        print(json.dumps({"applied_end_ts": result.applied_end_ts, "tables": dict(result.tables),
                          "elapsed_s": round(result.elapsed_s, 3)}))
    else:
        print(result.summary())
    return 0


def restore_cmd(args: argparse.Namespace) -> int:
    from binlake.restore import restore

    parallelism = _parallelism(args)
    lake = _check_lake(args)
    ts = _resolve(args)
    tables = _tables(args.tables)
    if args.out is None and args.target is None:
        raise errors.InvalidArgument("give a destination: --out DIR (Delta tables) or --target URL (a database)")
    from binlake.cli import argcheck
    from binlake.restore import naming

    renames = naming.parse_renames(args.rename)
    into_schema = naming.parse_schema(args.into_schema)
    if args.target is not None and into_schema is not None:
        # Known from the URL alone: refused before connecting (which would create a SQLite file).
        restore.check_options(None, args.target, None, renames, into_schema)
    if args.out is not None:
        argcheck.writable_dir("--out", args.out)
    if args.target is not None:
        # Reachable now, not after Spark has started and the plan is read.
        argcheck.reachable_db("--target", args.target)
    if args.verify is not None:
        argcheck.reachable_db("--verify", args.verify)
    if args.verify and not args.target:
        raise errors.InvalidArgument("--verify compares a target database with its source: use it with --target")
    # The combinations, once every value is known good.
    restore.check_options(args.out, args.target, args.verify, renames, into_schema)
    if args.run_id is not None and args.target is None:
        raise errors.InvalidArgument("--run-id names the run a target's tables are claimed for: use it with --target")
    result = _run(args, f"restore to {ts}", lambda spark, say: restore.run(
        spark, lake, ts, tables=tables, out=args.out, target=args.target, verify_url=args.verify,
        replace=args.replace, source=args.source, progress=say, parallelism=parallelism, renames=renames,
        into_schema=into_schema, run_id=args.run_id))
    if args.json:
        print(json.dumps(result.to_dict(), sort_keys=True))
    else:
        print(result.summary())
    return 0


def bench_cmd(args: argparse.Namespace) -> int:
    # bench/restore_bench.py, found the way every benchmark is (``binlake.cli.benchmarks``).
    from binlake.cli.benchmarks import bench_module

    return int(bench_module("restore").main(args))


def bench_scale_cmd(args: argparse.Namespace) -> int:
    # bench/scale_bench.py, found the way every benchmark is (``binlake.cli.benchmarks``).
    from binlake.cli.benchmarks import bench_module

    return int(bench_module("scale").main(args))
