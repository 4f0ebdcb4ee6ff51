"""``binlake source postgres``: the PostgreSQL source's command line (its own
options and checks, and how they make a ``source.PostgresSource``); the options
every source has are ``source.commands``'."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from binlake import errors
from binlake.cli.args import positive_int
from binlake.source.commands import SourceCommand

if TYPE_CHECKING:  # imported when the command runs: the parser stays free of the database drivers
    from binlake.source.postgres.source import PostgresSource


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slot", required=True, help="logical replication slot (pgoutput)")
    p.add_argument("--publication", required=True, help="publication naming the tables to back up")
    p.add_argument("--create", action="store_true",
                   help="create the publication FOR ALL TABLES, and the slot (--start snapshot always creates "
                        "its own), if missing")


def _check(args: argparse.Namespace) -> None:
    for flag, name in (("--slot", args.slot), ("--publication", args.publication)):
        if len(name) > 63:  # PostgreSQL truncates longer identifiers silently
            raise errors.InvalidArgument(f"{flag} {name[:20]}...: at most 63 characters, got {len(name)}")


def _build(args: argparse.Namespace, pace_s: float, max_pace_s: float | None) -> PostgresSource:
    from binlake.source.postgres.source import PostgresSource

    return PostgresSource(args.dsn, slot=args.slot, publication=args.publication, registry=args.registry,
                          data_dir=args.data_dir, create=args.create, start=args.start,
                          snapshot_batch_rows=args.snapshot_batch_rows, status_addr=args.status_addr,
                          pace_s=pace_s, max_pace_s=max_pace_s, snapshot_max_rows_per_s=args.snapshot_max_rows_per_s)


COMMAND = SourceCommand(
    name="postgres",
    help="PostgreSQL logical decoding (pgoutput) -> Pumps",
    epilog=(
        "The server needs wal_level=logical; every published table REPLICA IDENTITY FULL.\n\n"
        "Examples:\n"
        "  binlake source postgres --dsn postgresql://repl@db1:5432/shop --slot binlake --publication binlake \\\n"
        "      --create --registry 127.0.0.1:8230 --data-dir data/source-pg\n"
        "  binlake source postgres --dsn postgresql://repl@db1:5432/shop --slot binlake --publication binlake \\\n"
        "      --start snapshot   # the rows already there first (a new slot's snapshot), then the slot\n"
    ),
    dsn_help="postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE",
    start_help=("where a new --data-dir starts: now (default: stream from the slot) or snapshot (creates "
                "the slot with an exported snapshot, sends the published tables' rows, then streams from "
                "that snapshot; refused if the slot exists); ignored once a checkpoint exists"),
    batch_rows_type=positive_int,
    add_arguments=_add_arguments,
    check=_check,
    build=_build,
)
