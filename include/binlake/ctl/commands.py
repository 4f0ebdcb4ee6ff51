"""``binlake ctl``: operate the cluster (binlogctl): Pumps, TSOs, dumps, checksums.

The actions themselves are in ``binlake.ctl.actions`` (imported when one runs, so that
building the parser stays cheap); ``binlake.ctl.consumers`` adds the consumer actions,
``binlake.ctl.registry`` the registry group's members.
"""

from __future__ import annotations

import argparse
from typing import Any

from binlake import cli
from binlake.cli.args import add_registry, add_window, registry_addr
from binlake.ctl import consumers
from binlake.ctl import registry as registry_members


def register(sub: Any, bench: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """Add ``binlake ctl`` and its actions (see ``binlake.cli._COMMAND_MODULES``)."""
    ctl = sub.add_parser("ctl", help="operate the cluster (binlogctl)", formatter_class=fmt,
                         description="Operate the cluster: list Pumps, pause or retire them, get a TSO, dump binlogs.")
    csub = ctl.add_subparsers(dest="ctl_command", metavar="ACTION")
    c = csub.add_parser("pumps", help="table of Pumps and their state", formatter_class=fmt,
                        epilog="Example:\n  binlake ctl pumps --registry 127.0.0.1:8230\n")
    add_registry(c)
    c.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    c.add_argument("--sole-copies", action="store_true",
                   help="also count what each Pump holds that no other does (on by default when replicas > 1)")
    for name, help_text in (
        ("pause-pump", "stop a Pump taking new transactions (it finishes pending ones, then reports paused)"),
        ("offline-pump", "retire a Pump: no new writes; it stays readable until GC passes its data"),
    ):
        c = csub.add_parser(name, help=help_text, description=help_text, formatter_class=fmt,
                            epilog=f"Example:\n  binlake ctl {name} pump1 --registry 127.0.0.1:8230\n")
        c.add_argument("node_id", help="the Pump's node id (see `binlake ctl pumps`)")
        add_registry(c)
        if name == "offline-pump":
            c.add_argument("--force", action="store_true",
                           help="retire it even if it holds the only copy of transactions not consumed yet "
                                "(replicas > 1; those transactions are lost if its disk goes)")
    c = csub.add_parser(
        "replication", help="show or change the cluster's replicas (R) and min_acks (W)", formatter_class=fmt,
        description=(
            "Show the history of replication settings (each applies to prewrites from its TSO on), or append\n"
            "one with --replicas: it applies --grace-s from now, so every writer has read it by then. A window\n"
            "is read with the lowest W in force from [client] txn_lookback_s before its start to its end, so a\n"
            "raised W reaches reads txn_lookback_s after it applies; a window may then miss up to W - 1 Pumps."
        ),
        epilog=("Examples:\n  binlake ctl replication --registry 127.0.0.1:8230\n"
                "  binlake ctl replication --replicas 2 --registry 127.0.0.1:8230\n"),
    )
    add_registry(c)
    c.add_argument("--replicas", type=int, help="R: Pumps each prewrite is written to (1-16)")
    c.add_argument("--min-acks", type=int, help="W: Pumps that must fsync before a write is acknowledged (default R)")
    c.add_argument("--grace-s", type=float, default=30.0,
                   help="seconds from now the setting applies from (writers re-read it meanwhile; default 30)")
    c.add_argument("--json", action="store_true", help="JSON lines instead of text")
    c = csub.add_parser("ts", help="a fresh TSO and its datetime")
    add_registry(c)
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
    add_registry(c)
    add_window(c)
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
    c = csub.add_parser(
        "snapshot-progress", help="how far a source's initial snapshot has got", formatter_class=fmt,
        description=(
            "Read the progress a source writes into its --data-dir during --start snapshot (every few\n"
            "seconds): tables done, rows and bytes sent, rows/s and MB/s, and the time left estimated from\n"
            "the upstream's own row estimate (information_schema TABLE_ROWS, pg_class.reltuples). Needs no\n"
            "registry: run it where the source runs."
        ),
        epilog="Example:\n  binlake ctl snapshot-progress --data-dir data/source-mysql\n",
    )
    c.add_argument("--data-dir", required=True, help="the source's --data-dir")
    c.add_argument("--json", action="store_true", help="one JSON object instead of text")
    consumers.add_parsers(csub, fmt)
    registry_members.add_parsers(csub, fmt)
    # The group's handler runs every action above; the consumer actions set their own.
    ctl.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from binlake.ctl import actions

    if args.ctl_command is None:
        cli.build_parser().parse_args(["ctl", "--help"])
    if args.ctl_command in ("checksum", "snapshot-progress"):
        return actions.run(args, None)  # reads a database or a data dir, not the cluster
    return actions.run(args, registry_addr(args))
