"""The ``binlake`` command: run services, operate the cluster, inspect binlogs, benchmark.

Every subcommand's --help shows examples. User mistakes (bad flags, bad
config, unreachable services, refused windows) print one clear line and exit
with status 2; nothing prints a traceback for them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pathlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from binlake import __version__, errors, tso

EXIT_USER = 2

_EPILOG_TOP = """\
Start a cluster on one machine:
  binlake registry --data-dir data/registry --addr 127.0.0.1:8230 &
  binlake pump --registry 127.0.0.1:8230 --data-dir data/pump1 --addr 127.0.0.1:8250 &
  binlake pump --registry 127.0.0.1:8230 --data-dir data/pump2 --addr 127.0.0.1:8260 &
Look at it:
  binlake ctl pumps --registry 127.0.0.1:8230
  binlake ctl dump --registry 127.0.0.1:8230 --start 2026-11-21T08:00 --end 2026-11-21T08:05

Configuration: flags > BINLAKE_* environment > --config TOML (see config/binlake.toml) > defaults.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line naming the command and where help is
    (subcommand parsers are of this class too: add_subparsers inherits it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _int_arg(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _ts_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a TSO (an integer such as 470614378216685568), got {text!r}; "
            "use --start/--end for datetimes"
        ) from None
    if not 0 <= value <= tso.MAX_TS:
        raise argparse.ArgumentTypeError(f"a TSO must be in [0, 2^63), got {value}")
    return value


def _scratch_dir(text: str) -> str:
    """A directory to work in: existing and writable, or creatable under a writable one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a directory, got an empty string")
    path = pathlib.Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory")
    if not _can_create_under(path):
        raise argparse.ArgumentTypeError(f"cannot create or write {text}: no writable directory there")
    return text


def _can_create_under(path: pathlib.Path) -> bool:
    """Whether a directory could be made at ``path``: its nearest existing ancestor
    takes a new entry (tried, then removed: permission bits alone do not tell, e.g. /proc)."""
    import tempfile

    nearest = path
    while not nearest.exists():
        nearest = nearest.parent
    if not nearest.is_dir():
        return False
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".binlake-probe-", dir=nearest))
    except OSError:
        return False
    return True


def _int_list(text: str) -> str:
    """Comma-separated positive integers (e.g. writer counts, sizes), checked; the text itself."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,4,16, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers such as 1,4,16, got {text!r}")
    return text


def _include_dir(text: str) -> str:
    """Another checkout's include dir (``bench pump --baseline``): a binlake package in it."""
    if not (pathlib.Path(text) / "binlake" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an include dir with a binlake package in it (e.g. `git archive main include | "
            "tar -x -C /tmp/base`, then /tmp/base/include)")
    return text


def _pump_servers(text: str) -> str:
    """Comma-separated Pump gRPC server kinds (``bench pump --pump-servers``); the text itself."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    if text and not kinds or any(k not in ("asyncio", "threads") for k in kinds):
        raise argparse.ArgumentTypeError(f"expected asyncio and/or threads (comma-separated), got {text!r}")
    return text


def _datetime_arg(text: str) -> int:
    try:
        return tso.parse_datetime(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_registry(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--registry", default=os.environ.get("BINLAKE_REGISTRY", os.environ.get("BINLAKE_PUMP_REGISTRY")),
        help="registry HOST:PORT (default: $BINLAKE_REGISTRY, else 127.0.0.1:8230)",
    )


def _add_lake(p: argparse.ArgumentParser) -> None:
    """Where the lake is and which Spark reads it (``lake.commands`` builds the session)."""
    p.add_argument("--lake", default=os.environ.get("BINLAKE_LAKE_DIR"),
                   help="lake directory or URI (default: $BINLAKE_LAKE_DIR)")
    p.add_argument("--master", help="Spark master (default: $BINLAKE_SPARK_MASTER, else local[*])")


def _add_window(p: argparse.ArgumentParser) -> None:
    """A commit_ts window as TSOs or datetimes (``lake.commands.window_args`` reads it)."""
    p.add_argument("--start-ts", type=_ts_arg, help="window start (inclusive), a TSO")
    p.add_argument("--end-ts", type=_ts_arg, help="window end (exclusive), a TSO")
    p.add_argument("--start", type=_datetime_arg, help="window start as an ISO datetime (UTC unless offset given)")
    p.add_argument("--end", type=_datetime_arg, help="window end as an ISO datetime")


def _registry_addr(args: argparse.Namespace) -> str:
    from binlake.rpc import parse_addr

    if args.registry is not None and not args.registry.strip():
        raise errors.InvalidArgument("--registry is empty: give the registry's HOST:PORT (e.g. 127.0.0.1:8230)")
    addr = args.registry or "127.0.0.1:8230"
    parse_addr(addr, "--registry")
    return addr


# -- up (the always-on stack of `make up`; implementation in binlake.stack) -------------

_UP_DESCRIPTION = """\
Run the always-on stack on this machine, in the foreground: the registry, N Pumps on fixed
loopback ports (data under DATA_DIR), and Airflow with SQLite metadata in DATA_DIR/airflow
(API server + UI, scheduler, DAG processor, triggerer) running this project's dags/ and
plugins/, so binlake_ingest ingests every window into DATA_DIR/lake. Prints where everything
is; Ctrl-C stops Airflow, then the Pumps, then the registry. Starting it again finds the
same cluster, lake and Airflow state, and the ingest DAG catches up on the windows missed."""


def _add_up_parser(sub: argparse._SubParsersAction, fmt: type[argparse.HelpFormatter]) -> None:
    from binlake import stack

    p = sub.add_parser(
        "up", help="run registry, Pumps and Airflow on this machine (make up)", formatter_class=fmt,
        description=_UP_DESCRIPTION,
        epilog=(
            "Examples:\n"
            "  binlake up                                   # UI on http://127.0.0.1:8080\n"
            "  binlake up --pumps 2 --airflow-port 8081 --data-dir /tmp/binlake\n"
            "  binlake up --no-airflow                      # only the registry and the Pumps\n"
            "  binlake up --pump-args='--gc-retention-days 1 --fake-binlog-interval-s 1'\n"
        ),
    )
    p.add_argument("--data-dir", default="data", help="root of all state and logs (default ./data)")
    p.add_argument("--pumps", type=_positive_int, default=3, help="number of Pumps (default 3)")
    p.add_argument("--registry-addr", default=stack.DEFAULT_REGISTRY_ADDR,
                   help=f"registry HOST:PORT (default {stack.DEFAULT_REGISTRY_ADDR}; port 0 = a free port)")
    p.add_argument("--pump-port-base", type=_non_negative_int, default=stack.DEFAULT_PUMP_PORT_BASE,
                   help="Pump i listens on BASE+10*(i-1), metrics on the next port (default 8250: "
                        "8250/8251, 8260/8261, ...; 0 = free ports)")
    p.add_argument("--pump-args", default="",
                   help="extra `binlake pump` flags for every Pump, one string (use --pump-args='...')")
    p.add_argument("--no-airflow", dest="airflow", action="store_false", help="start only the registry and Pumps")
    p.add_argument("--airflow-port", type=_positive_int, default=stack.DEFAULT_AIRFLOW_PORT,
                   help="port of the Airflow API server and UI on 127.0.0.1 (default 8080)")
    p.add_argument("--dags-folder", help="Airflow DAGs (default: $BINLAKE_DAGS_FOLDER, else the checkout's dags/)")
    p.add_argument("--plugins-folder",
                   help="Airflow plugins (default: $BINLAKE_PLUGINS_FOLDER, else the checkout's plugins/)")
    p.add_argument("--ready-timeout-s", type=_positive_float, default=180.0,
                   help="give up if a service is not ready after this long (default 180)")


def _run_up(args: argparse.Namespace) -> int:
    import shlex

    from binlake import config, stack

    for flag, value in (("--data-dir", args.data_dir), ("--dags-folder", args.dags_folder),
                        ("--plugins-folder", args.plugins_folder)):
        if value is not None and not value.strip():
            raise errors.InvalidArgument(f"{flag} is empty: give a directory")
    paths = config.paths()
    dags = pathlib.Path(args.dags_folder) if args.dags_folder else paths.dags()
    plugins = pathlib.Path(args.plugins_folder) if args.plugins_folder else paths.plugins()
    try:
        pump_args = stack.parse_pump_args(args.pump_args)
    except ValueError as exc:
        raise errors.InvalidArgument(f"--pump-args {args.pump_args!r} is not a valid shell string: {exc}") from None
    _, unknown = build_parser().parse_known_args(["pump", *pump_args])
    if unknown:
        raise errors.InvalidArgument(
            f"--pump-args: {shlex.join(unknown)} is not a `binlake pump` flag (see `binlake pump --help`)")

    cfg = stack.StackConfig(
        data_dir=pathlib.Path(args.data_dir), pumps=args.pumps, registry_addr=args.registry_addr,
        pump_port_base=args.pump_port_base, pump_args=pump_args,
        airflow=args.airflow, airflow_port=args.airflow_port, dags_folder=dags,
        plugins_folder=plugins, ready_timeout_s=args.ready_timeout_s,
    )
    return stack.Stack(cfg).run()

# -- end of up ----------------------------------------------------------------------------


# Subcommands that live beside their concept. Each module has
# ``register(sub, bench, fmt)``, which adds its parsers (``bench``: the
# subparsers of ``binlake bench``) and sets ``handler`` on each:
# ``handler(args) -> int`` (exit status). Errors it raises go through ``main``
# like every other command's. One line a module, so commands stay findable.
_COMMAND_MODULES: tuple[str, ...] = (
    "binlake.ctl_consumers",
    "binlake.source.commands",
    "binlake.replicate.commands",
    "binlake.restore.commands",
)


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="binlake", description=__doc__.splitlines()[0], epilog=_EPILOG_TOP, formatter_class=fmt
    )
    parser.add_argument("--version", action="version", version=f"binlake {__version__}")
    parser.add_argument("--log-level", default=os.environ.get("BINLAKE_LOG_LEVEL", "INFO"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log verbosity (default INFO)")
    # TLS for every gRPC server and client this command runs ([security] in --config,
    # BINLAKE_SECURITY_* env); paths only, and no env-derived defaults shown here.
    parser.add_argument("--ca", help="CA certificate (PEM): verify peers; servers then require client certs")
    parser.add_argument("--cert", help="certificate (PEM) this process presents, as server and client")
    parser.add_argument("--key", help="private key (PEM) of --cert")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    # -- registry
    p = sub.add_parser(
        "registry", help="run the registry (TSO and node states)", formatter_class=fmt,
        description="Run the registry: hands out TSOs and keeps every node's state.",
        epilog="Example:\n  binlake registry --data-dir data/registry --addr 127.0.0.1:8230\n",
    )
    p.add_argument("--config", help="TOML config file (its [registry] table)")
    p.add_argument("--data-dir", help="where the SQLite store lives (default data/registry)")
    p.add_argument("--addr", help="HOST:PORT to listen on (default 127.0.0.1:8230; port 0 = any free port)")
    p.add_argument("--tso-window-ms", type=_positive_int, help="TSO high-water step persisted ahead of use")

    # -- pump
    p = sub.add_parser(
        "pump", help="run a Pump (durable, sorted binlog storage)", formatter_class=fmt,
        description=(
            "Run a Pump. It recovers its data dir (cutting a torn tail), registers with the registry,\n"
            "then accepts writes; it serves complete transactions of any commit_ts window below its\n"
            "safe ts. SIGTERM/SIGINT shut it down gracefully (state 'paused')."
        ),
        epilog=(
            "Examples:\n"
            "  binlake pump --registry 127.0.0.1:8230 --data-dir data/pump1 --addr 127.0.0.1:8250\n"
            "  binlake pump --config config/binlake.toml --node-id pump1 --metrics-addr 127.0.0.1:8251\n"
        ),
    )
    p.add_argument("--config", help="TOML config file (its [pump] table documents every key)")
    p.add_argument("--registry", help="registry HOST:PORT")
    p.add_argument("--data-dir", help="value log and index directory")
    p.add_argument("--addr", help="HOST:PORT to listen on (port 0 = any free port)")
    p.add_argument("--advertise-addr", help="address writers and readers use, if not --addr")
    p.add_argument("--node-id", help="node id (default: remembered in the data dir, else host:port)")
    p.add_argument("--metrics-addr", help="HOST:PORT for Prometheus /metrics")
    p.add_argument("--fake-binlog-interval-s", type=float, help="idle heartbeat binlog interval (default 3)")
    p.add_argument("--txn-timeout-s", type=float, help="ask the writer about a prewrite after this (default 600)")
    p.add_argument("--gc-retention-days", type=float,
                   help="keep binlogs this many days (default 7); never past a consumer's checkpoint")
    p.add_argument("--gc-hard-limit-days", type=float,
                   help="collect past consumer checkpoints older than this (default 0 = never)")
    p.add_argument("--gc-hard-limit-bytes", type=int,
                   help="collect past consumer checkpoints above this storage size (default 0 = never)")
    p.add_argument("--max-binlog-bytes", type=_positive_int, help="largest binlog accepted (default 1 GiB)")
    p.add_argument("--stop-write-at-free-bytes", type=int, help="refuse writes below this free disk (default 1 GiB)")

    # -- up
    _add_up_parser(sub, fmt)

    # -- ctl
    ctl = sub.add_parser("ctl", help="operate the cluster (binlogctl)", formatter_class=fmt,
                         description="Operate the cluster: list Pumps, pause or retire them, get a TSO, dump binlogs.")
    csub = ctl.add_subparsers(dest="ctl_command", metavar="ACTION")
    c = csub.add_parser("pumps", help="table of Pumps and their state", formatter_class=fmt,
                        epilog="Example:\n  binlake ctl pumps --registry 127.0.0.1:8230\n")
    _add_registry(c)
    c.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    for name, help_text in (
        ("pause-pump", "stop a Pump taking new transactions (it finishes pending ones, then reports paused)"),
        ("offline-pump", "retire a Pump: no new writes; it stays readable until GC passes its data"),
    ):
        c = csub.add_parser(name, help=help_text, description=help_text, formatter_class=fmt,
                            epilog=f"Example:\n  binlake ctl {name} pump1 --registry 127.0.0.1:8230\n")
        c.add_argument("node_id", help="the Pump's node id (see `binlake ctl pumps`)")
        _add_registry(c)
    c = csub.add_parser("ts", help="a fresh TSO and its datetime")
    _add_registry(c)
    c = csub.add_parser(
        "dump", help="complete transactions of a window as JSON lines", formatter_class=fmt,
        description=(
            "Print the complete transactions with commit_ts in [start, end) from every Pump (or one),\n"
            "merged in commit_ts order, one JSON object per line. Bounds as TSOs or datetimes (UTC)."
        ),
        epilog=(
            "Examples:\n"
            "  binlake ctl dump --start-ts 470614378216685568 --end-ts 470614500000000000\n"
            "  binlake ctl dump --start 2026-11-21T08:00 --end 2026-11-21T08:05 --pump pump1\n"
        ),
    )
    _add_registry(c)
    _add_window(c)
    c.add_argument("--pump", help="read only this Pump")
    c.add_argument("--wait", action="store_true", help="wait for the safe ts to reach the window end")
    c.add_argument("--rows", action="store_true", help="include decoded rows, not only counts")
    c = csub.add_parser(
        "checksum", help="row count and order-independent checksum of every table of a database",
        formatter_class=fmt,
        description=(
            "Read every row of every table (or --tables) of a SQLAlchemy URL and print its row count and a\n"
            "checksum that is equal exactly when the rows are equal, whatever the database (SQLite,\n"
            "PostgreSQL, MySQL/MariaDB) or the order rows were written in. binlake's own _binlake_* tables\n"
            "are skipped. Needs no registry."
        ),
        epilog=(
            "Examples:\n"
            "  binlake ctl checksum sqlite:///data/upstream.db\n"
            "  binlake ctl checksum postgresql+psycopg2://u:p@db/app --tables accounts,sbtest1 --json\n"
            "  binlake ctl checksum sqlite:///restored.db --schema-from sqlite:///data/upstream.db\n"
        ),
    )
    c.add_argument("url", help="SQLAlchemy URL of the database")
    c.add_argument("--tables", help="comma-separated table names (default: every table)")
    c.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    c.add_argument("--schema-from", metavar="URL",
                   help="type columns by binlake's table definitions in this database (e.g. the upstream)")
    c.add_argument("--include-internal", action="store_true", help="also checksum binlake's _binlake_* tables")

    # -- workload
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
    _add_registry(p)
    p.add_argument("--upstream", default=os.environ.get("BINLAKE_UPSTREAM"),
                   help="SQLAlchemy URL of the upstream database (default: $BINLAKE_UPSTREAM)")
    p.add_argument("--profile", choices=["oltp", "bank", "ddl", "mixed"], default="oltp",
                   help="transaction mix (default oltp)")
    p.add_argument("--tables", type=_positive_int, default=4, help="oltp tables sbtest1..K (default 4)")
    p.add_argument("--txns", type=_positive_int, default=10_000,
                   help="workload transactions after the setup (default 10000)")
    p.add_argument("--clients", type=_positive_int, default=8, help="concurrent client threads (default 8)")
    p.add_argument("--seed", type=_int_arg, default=1, help="random seed of the plan (default 1)")
    p.add_argument("--rate", type=_positive_float, help="at most this many transactions/s overall (default: no limit)")
    p.add_argument("--table-rows", type=_non_negative_int, default=1000,
                   help="initial rows per oltp table (default 1000)")
    p.add_argument("--accounts", type=_positive_int, default=100, help="bank accounts (default 100)")
    p.add_argument("--large-txn-rows", type=_positive_int, default=10_000,
                   help="rows of a large transaction (default 10000)")
    p.add_argument("--large-txn-every", type=_non_negative_int, default=500,
                   help="one large transaction every this many (default 500; 0 = none)")
    p.add_argument("--ddl-every", type=_positive_int, default=50,
                   help="about this many transactions between DDLs (profiles ddl, mixed; default 50)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")

    # -- ingest
    p = sub.add_parser(
        "ingest", help="ingest a commit_ts window from every Pump into the Delta lake", formatter_class=fmt,
        description=(
            "Read the complete transactions of [start, end) from every Pump that may hold them, decode their\n"
            "row changes with the schema history, and write them to the lake's Delta tables: changes\n"
            "(partitioned by commit date), ddl_history and windows. Runs Spark in this process (the same job\n"
            "as jobs/ingest.py under spark-submit). Re-running a window replaces exactly its rows; a window\n"
            "overlapping an ingested one with other bounds is refused. Every Pump must be reachable, have a\n"
            "safe ts at or above the window end and a GC ts at or below its start."
        ),
        epilog=(
            "Examples:\n"
            "  binlake ingest --start 2026-11-21T08:00 --end 2026-11-21T08:05 --lake data/lake\n"
            "  binlake ingest --start-ts 470614378216685568 --end-ts 470614456854364160 --lake data/lake \\\n"
            "                 --registry 127.0.0.1:8230 --pumps pump1,pump2 --json\n"
        ),
    )
    _add_registry(p)
    _add_window(p)
    _add_lake(p)
    p.add_argument("--pumps", help="comma-separated Pump ids to read (default: every Pump that may hold the window)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object, no progress log")

    # -- lake
    lake = sub.add_parser("lake", help="inspect the Delta lake (windows, changes)", formatter_class=fmt,
                          description="Inspect the lake's Delta tables without a registry or Pumps.")
    lsub = lake.add_subparsers(dest="lake_command", metavar="WHAT")
    c = lsub.add_parser("windows", help="table of ingested windows, with the gaps between them", formatter_class=fmt,
                        epilog="Example:\n  binlake lake windows --lake data/lake\n")
    _add_lake(c)
    c.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    c = lsub.add_parser(
        "changes", help="row changes of one table, in commit order", formatter_class=fmt,
        epilog=(
            "Examples:\n"
            "  binlake lake changes --lake data/lake --table sbtest1 --limit 20\n"
            "  binlake lake changes --lake data/lake --table main.accounts --from-ts 470614378216685568 --json\n"
        ),
    )
    _add_lake(c)
    c.add_argument("--table", required=True, help="TABLE or DB.TABLE (the name when the change was made)")
    c.add_argument("--from-ts", type=_ts_arg, help="only changes with commit_ts >= this TSO")
    c.add_argument("--to-ts", type=_ts_arg, help="only changes with commit_ts < this TSO")
    c.add_argument("--limit", type=_positive_int, default=50, help="at most this many changes (default 50)")
    c.add_argument("--json", action="store_true", help="JSON lines instead of a table")

    # -- bench
    bench = sub.add_parser("bench", help="benchmarks (results go to bench/RESULTS.md)", formatter_class=fmt)
    bsub = bench.add_subparsers(dest="bench_command", metavar="WHICH")
    b = bsub.add_parser(
        "pump", help="Pump write throughput and latency vs raw append+fsync", formatter_class=fmt,
        epilog="Example:\n  binlake bench pump --seconds 5 --writers 1,4,16 --sizes 1024,65536\n",
    )
    b.add_argument("--seconds", type=_positive_float, default=5.0, help="measure each case this long (default 5)")
    b.add_argument("--writers", type=_int_list, default="1,4,16,64,256",
                   help="comma-separated writer counts (default 1,4,16,64,256)")
    b.add_argument("--sizes", type=_int_list, default="1024,65536", help="comma-separated transaction sizes in bytes")
    b.add_argument("--dir", type=_scratch_dir,
                   help="scratch directory on the disk to measure (default: a temp dir under bench/)")
    b.add_argument("--client-procs", type=_positive_int, default=1,
                   help="writer threads are spread over this many client processes (default 1)")
    b.add_argument("--no-tso-per-txn", dest="tso_per_txn", action="store_false",
                   help="skip the extra case that fetches two TSOs per transaction from the registry")
    b.add_argument("--baseline", metavar="INCLUDE_DIR", type=_include_dir,
                   help="also run every case on another checkout's Pump and client (its include dir), "
                        "back to back in the same run")
    b.add_argument("--no-storage", dest="storage", action="store_false",
                   help="skip the storage-alone cases (Storage.submit in one process, no gRPC)")
    b.add_argument("--pump-servers", default="", metavar="KINDS", type=_pump_servers,
                   help="run every case on each of these Pump gRPC servers: asyncio,threads "
                        "(default: the Pump's configured one)")
    b = bsub.add_parser(
        "writer", help="TxnWriter throughput with binlog vs the same transactions without", formatter_class=fmt,
        epilog="Example:\n  binlake bench writer --seconds 5 --clients 1,8\n",
    )
    b.add_argument("--seconds", type=_positive_float, default=5.0, help="measure each case this long (default 5)")
    b.add_argument("--clients", type=_int_list, default="1,8", help="comma-separated client counts (default 1,8)")
    b = bsub.add_parser(
        "ingest", help="row changes/s from three Pumps into Delta vs Parquet->Delta", formatter_class=fmt,
        epilog="Example:\n  binlake bench ingest --rows 1000000 --runs 2\n",
    )
    b.add_argument("--rows", type=_positive_int, default=1_000_000, help="row changes to ingest (default 1000000)")
    b.add_argument("--rows-per-txn", type=_positive_int, default=2000, help="row changes per transaction (default 2000)")
    b.add_argument("--runs", type=_positive_int, default=2, help="runs of each case; the best is reported (default 2)")
    b.add_argument("--master", help="Spark master (default local[*])")
    b.add_argument("--dir", type=_scratch_dir, help="scratch directory (default: a temp dir under bench/)")
    b.add_argument("--decode-only", action="store_true",
                   help="only the decoding step: CPU µs per row change, Python path vs native (no Pumps, no Spark)")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub, bsub, fmt)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return EXIT_USER
    try:
        _configure_tls(args)
        if getattr(args, "master", None) is not None:
            from binlake.lake.spark import check_master

            check_master(args.master, "--master")
        return _dispatch(parser, args)
    except errors.BinlakeError as exc:
        print(f"binlake {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _bench_module(name: str) -> Any:
    """``bench/<name>_bench.py`` loaded from the bench folder (``binlake.config.PathSettings``:
    $BINLAKE_BENCH_DIR, else the checkout's bench/), without touching sys.path."""

    from binlake import config

    path = config.paths().bench() / f"{name}_bench.py"
    if not path.is_file():
        raise errors.FailedPrecondition(
            f"no benchmark {path}: the benchmarks live in a binlake checkout's bench/ folder; "
            "run from a checkout or set BINLAKE_BENCH_DIR")
    # The benchmarks share bench/benchkit.py and import it by its plain name.
    kit = path.parent / "benchkit.py"
    if kit.is_file() and "benchkit" not in sys.modules:
        _load_file("benchkit", kit)
    return _load_file(f"{name}_bench", path)


def _load_file(name: str, path: pathlib.Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered first: dataclasses in the module look their module up by name.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _configure_tls(args: argparse.Namespace) -> None:
    """[security] from flags > env > the command's --config file, for every server and channel."""
    from binlake import config, rpc

    settings = config.load(config.SecuritySettings, getattr(args, "config", None),
                           ca=args.ca, cert=args.cert, key=args.key)
    rpc.configure_tls(settings.files())
    # Child processes (`binlake up`'s registry and Pumps, spark-submit) inherit the same
    # files through the environment (paths only; the key's contents are never copied).
    for name in ("ca", "cert", "key"):
        value = getattr(settings, name)
        if value:
            os.environ[f"BINLAKE_SECURITY_{name.upper()}"] = value


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from binlake import config

    handler = getattr(args, "handler", None)
    if handler is not None:
        return int(handler(args))
    if args.command == "registry":
        from binlake.registry import server

        settings = config.load(config.RegistrySettings, args.config, data_dir=args.data_dir, addr=args.addr,
                               tso_window_ms=args.tso_window_ms)
        server.run(settings)
        return 0
    if args.command == "pump":
        from binlake.pump import node

        settings = config.load(
            config.PumpSettings, args.config, registry=args.registry, data_dir=args.data_dir, addr=args.addr,
            advertise_addr=args.advertise_addr, node_id=args.node_id, metrics_addr=args.metrics_addr,
            fake_binlog_interval_s=args.fake_binlog_interval_s, txn_timeout_s=args.txn_timeout_s,
            gc_retention_days=args.gc_retention_days, gc_hard_limit_days=args.gc_hard_limit_days,
            gc_hard_limit_bytes=args.gc_hard_limit_bytes, max_binlog_bytes=args.max_binlog_bytes,
            stop_write_at_free_bytes=args.stop_write_at_free_bytes,
        )
        node.run(settings)
        return 0
    if args.command == "up":
        return _run_up(args)
    if args.command == "ctl":
        from binlake import ctl

        if args.ctl_command is None:
            parser.parse_args(["ctl", "--help"])
        if args.ctl_command == "checksum":
            return ctl.run(args, None)  # reads a database, not the cluster
        return ctl.run(args, _registry_addr(args))
    if args.command == "workload":
        from binlake.source import workload

        if not args.upstream:
            raise errors.InvalidArgument(
                "workload needs --upstream URL (a SQLAlchemy URL such as sqlite:///data/upstream.db), "
                "or $BINLAKE_UPSTREAM"
            )
        if args.accounts < 2:
            raise errors.InvalidArgument(f"--accounts must be at least 2 (a transfer needs two), got {args.accounts}")
        return workload.command(args, _registry_addr(args))
    if args.command == "ingest":
        from binlake.lake import commands

        if not args.lake:
            raise errors.InvalidArgument("ingest needs --lake PATH (the lake directory or URI), or $BINLAKE_LAKE_DIR")
        return commands.ingest(args, _registry_addr(args))
    if args.command == "lake":
        from binlake.lake import commands

        if args.lake_command is None:
            parser.parse_args(["lake", "--help"])
        if not args.lake:
            raise errors.InvalidArgument(f"lake {args.lake_command} needs --lake PATH, or $BINLAKE_LAKE_DIR")
        return commands.windows(args) if args.lake_command == "windows" else commands.changes(args)
    if args.command == "bench":
        if args.bench_command not in ("pump", "writer", "ingest"):
            parser.parse_args(["bench", "--help"])
        return _bench_module(args.bench_command).main(args)  # type: ignore[no-any-return]
    parser.error(f"unknown command {args.command}")
    return EXIT_USER


if __name__ == "__main__":
    raise SystemExit(main())
