"""``binlake source mysql``: the MySQL/MariaDB source's command line (its own
options and checks, and how they make a ``source.MySQLSource``); the options
every source has are ``source.commands``'."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from binlake.source.commands import SourceCommand

if TYPE_CHECKING:  # imported when the command runs: the parser stays free of the database drivers
    from binlake.source.mysql.source import MySQLSource


def _server_id(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in 1..4294967295, got {text!r}") from None
    if not 1 <= v < 2**32:
        raise argparse.ArgumentTypeError(f"expected a number in 1..4294967295, got {v}")
    return v


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server-id", type=_server_id, required=True,
                   help="this replica's server id (unique among the server's replicas)")
    p.add_argument("--tables", default=None, help="DB.TABLE globs, comma-separated (default: every non-system table)")


def _check(args: argparse.Namespace) -> None:
    from binlake.cli import argcheck

    argcheck.names("--tables", args.tables, "shop.*,app.orders")


def _build(args: argparse.Namespace, pace_s: float, max_pace_s: float | None) -> MySQLSource:
    from binlake.source.mysql.source import MySQLSource

    return MySQLSource(args.dsn, server_id=args.server_id, registry=args.registry, data_dir=args.data_dir,
                       start=args.start, tables=args.tables, status_addr=args.status_addr,
                       snapshot_batch_rows=args.snapshot_batch_rows, pace_s=pace_s, max_pace_s=max_pace_s,
                       snapshot_max_rows_per_s=args.snapshot_max_rows_per_s)


COMMAND = SourceCommand(
    name="mysql",
    help="MySQL/MariaDB row binlog -> Pumps (as a replica)",
    epilog=(
        "The server needs log_bin, binlog_format=ROW and binlog_row_image=FULL; the user needs\n"
        "REPLICATION SLAVE, REPLICATION CLIENT and SELECT.\n\n"
        "Examples:\n"
        "  binlake source mysql --dsn mysql://repl:pw@db1:3306 --server-id 4001 --registry 127.0.0.1:8230 \\\n"
        "      --data-dir data/source-db1 --tables 'shop.*'\n"
        "  binlake source mysql --dsn mysql://root@127.0.0.1:3306 --server-id 4001 --start binlog.000042:4\n"
        "  binlake source mysql --dsn mysql://root@127.0.0.1:3306 --server-id 4001 --start snapshot \\\n"
        "      --tables 'shop.*'   # the rows already there first, then the binlog from that snapshot\n"
    ),
    dsn_help="mysql://USER[:PASSWORD]@HOST[:PORT]",
    start_help=("where a new --data-dir starts: now (default), snapshot (the chosen tables' rows "
                "first, then the binlog from that snapshot), FILE:POS or gtid:SET; "
                "ignored once a checkpoint exists"),
    # int, not positive_int: 0 reaches MySQLSource, which refuses it in its own words.
    batch_rows_type=int,
    add_arguments=_add_arguments,
    check=_check,
    build=_build,
)
