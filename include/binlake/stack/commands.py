"""``binlake up``: the command that runs the always-on stack (``binlake.stack.supervisor``) of `make up`."""

from __future__ import annotations

import argparse
import pathlib
from typing import Any

from binlake import cli, errors
from binlake.cli.args import non_negative_int, positive_float, positive_int
from binlake.net import DEFAULT_REGISTRY_ADDR

_UP_DESCRIPTION = """\
Run the always-on stack on this machine, in the foreground: the registry, N Pumps on fixed
loopback ports (data under DATA_DIR), and Airflow with its metadata on a PostgreSQL server in
DATA_DIR/airflow/postgres (SQLite in DATA_DIR/airflow where PostgreSQL is not installed)
(API server + UI, scheduler, DAG processor, triggerer) running this project's dags/ and
plugins/, and a Spark Connect server (the always-on Spark of the DAGs' jobs), so binlake_ingest ingests every window into DATA_DIR/lake. Prints where everything
is; Ctrl-C stops Airflow, then Spark, then the Pumps, then the registry. Starting it again finds the
same cluster, lake and Airflow state, and the ingest DAG catches up on the windows missed."""


def register(sub: Any, bench: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """Add ``binlake up`` (see ``binlake.cli._COMMAND_MODULES``)."""
    from binlake.stack import airflow_db
    from binlake.stack import supervisor as stack

    p = sub.add_parser(
        "up", help="run registry, Pumps and Airflow on this machine (make up)", formatter_class=fmt,
        description=_UP_DESCRIPTION,
        epilog=(
            "Examples:\n"
            "  binlake up                                   # UI on http://127.0.0.1:8080\n"
            "  binlake up --pumps 2 --airflow-port 8081 --data-dir /tmp/binlake\n"
            "  binlake up --no-airflow                      # only the registry and the Pumps\n"
            "  binlake up --spark-cluster                   # ingests on a Spark standalone cluster\n"
            "  binlake up --pump-args='--gc-retention-days 1 --fake-binlog-interval-s 1'\n"
        ),
    )
    p.add_argument("--data-dir", default="data", help="root of all state and logs (default ./data)")
    p.add_argument("--pumps", type=positive_int, default=3, help="number of Pumps (default 3)")
    p.add_argument("--registry-addr", default=DEFAULT_REGISTRY_ADDR,
                   help=f"registry HOST:PORT (default {DEFAULT_REGISTRY_ADDR}; port 0 = a free port)")
    p.add_argument("--pump-port-base", type=non_negative_int, default=stack.DEFAULT_PUMP_PORT_BASE,
                   help="Pump i listens on BASE+10*(i-1), metrics on the next port (default 8250: "
                        "8250/8251, 8260/8261, ...; 0 = free ports)")
    p.add_argument("--replicas", type=int, metavar="R",
                   help="a new cluster's replication from ts 0: Pumps each prewrite is written to (1 to --pumps); "
                        "an existing DATA_DIR must already have this setting (binlake registry --replicas)")
    p.add_argument("--min-acks", type=int, metavar="W", help="with --replicas: acknowledgements a write needs "
                   "(1 to R; default R)")
    p.add_argument("--pump-args", default="",
                   help="extra `binlake pump` flags for every Pump, one string (use --pump-args='...')")
    p.add_argument("--no-airflow", dest="airflow", action="store_false", help="start only the registry and Pumps")
    p.add_argument("--spark-connect-port", type=non_negative_int, default=stack.DEFAULT_SPARK_CONNECT_PORT,
                   help="port of the always-on Spark Connect server the DAGs' Spark jobs use (default "
                        f"{stack.DEFAULT_SPARK_CONNECT_PORT}; 0 = none, each window then starts its own Spark)")
    p.add_argument("--airflow-port", type=positive_int, default=stack.DEFAULT_AIRFLOW_PORT,
                   help="port of the Airflow API server and UI on 127.0.0.1 (default 8080)")
    p.add_argument("--dags-folder", help="Airflow DAGs (default: $BINLAKE_DAGS_FOLDER, else the checkout's dags/)")
    p.add_argument("--plugins-folder",
                   help="Airflow plugins (default: $BINLAKE_PLUGINS_FOLDER, else the checkout's plugins/)")
    p.add_argument("--spark-cluster", action="store_true",
                   help="run a Spark standalone cluster (master + one worker, from the pyspark wheel) and every "
                        "ingest window as a spark-submit application of it, instead of the Spark Connect server")
    p.add_argument("--spark-master-port", type=positive_int, default=stack.DEFAULT_SPARK_MASTER_PORT,
                   help=f"port of --spark-cluster's master on 127.0.0.1 (default {stack.DEFAULT_SPARK_MASTER_PORT})")
    p.add_argument("--airflow-db", choices=airflow_db.CHOICES, default=airflow_db.AUTO,
                   help="Airflow's metadata database: auto (default: a PostgreSQL server of the stack's own in "
                        "DATA_DIR/airflow/postgres when PostgreSQL is installed, else SQLite), postgres, sqlite")
    p.add_argument("--ready-timeout-s", type=positive_float, default=180.0,
                   help="give up if a service is not ready after this long (default 180)")
    p.set_defaults(handler=_run_up)


def _run_up(args: argparse.Namespace) -> int:
    import shlex

    from binlake import config
    from binlake.stack import supervisor as stack

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
    _, unknown = cli.build_parser().parse_known_args(["pump", *pump_args])
    if unknown:
        raise errors.InvalidArgument(
            f"--pump-args: {shlex.join(unknown)} is not a `binlake pump` flag (see `binlake pump --help`)")

    replication = _replication(args)
    cfg = stack.StackConfig(
        data_dir=pathlib.Path(args.data_dir), pumps=args.pumps, registry_addr=args.registry_addr,
        pump_port_base=args.pump_port_base, pump_args=pump_args,
        airflow=args.airflow, airflow_port=args.airflow_port,
        spark_connect_port=args.spark_connect_port, dags_folder=dags,
        plugins_folder=plugins, ready_timeout_s=args.ready_timeout_s, airflow_db=args.airflow_db,
        spark_cluster=args.spark_cluster, spark_master_port=args.spark_master_port, replication=replication,
    )
    return stack.Stack(cfg).run()


def _replication(args: argparse.Namespace) -> tuple[int, int] | None:
    """(R, W) of ``--replicas``/``--min-acks``, checked against the Pumps and against
    the registry store in DATA_DIR when it exists (before anything starts)."""
    if args.replicas is None:
        if args.min_acks is not None:
            raise errors.InvalidArgument("--min-acks needs --replicas (give both, e.g. --replicas 3 --min-acks 2)")
        return None
    if not 1 <= args.replicas <= args.pumps:
        raise errors.InvalidArgument(
            f"--replicas {args.replicas} must be between 1 and --pumps ({args.pumps}): each prewrite goes to R Pumps")
    acks = args.replicas if args.min_acks is None else args.min_acks
    if not 1 <= acks <= args.replicas:
        raise errors.InvalidArgument(f"--min-acks {acks} must be between 1 and --replicas ({args.replicas})")
    store_file = pathlib.Path(args.data_dir) / "registry" / "registry.db"
    if store_file.exists():
        from binlake.registry.service import create_replication
        from binlake.registry.stores import open_store

        with open_store(store_file.parent) as store:
            create_replication(store, args.replicas, acks, write=False)
    return args.replicas, acks
