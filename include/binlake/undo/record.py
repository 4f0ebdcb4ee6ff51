"""``_binlake_undo`` in a target: one row per undo committed there.

Invariant: a row with ``id`` = a selection's digest exists iff the reverts of
that selection were committed in this database; it is written in the same
target transaction as the reverts, so a run killed before its commit leaves
neither, and a rerun of a committed one finds the row and writes nothing.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from binlake.sql import targets

UNDO_TABLE = "_binlake_undo"

_md = sa.MetaData()
table = sa.Table(
    UNDO_TABLE, _md,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("undone_at", sa.String(40), nullable=False),
    sa.Column("selection", sa.Text, nullable=False),
    sa.Column("rows", sa.BigInteger, nullable=False),
)


def ensure(target: targets.Target) -> None:
    """Create the table on its own (MariaDB commits DDL at once: never inside the undo's transaction)."""
    with target.engine.begin() as conn:
        table.create(conn, checkfirst=True)


def find(conn: Connection, digest: str) -> tuple[str, int] | None:
    """(undone_at, rows) of the selection's record, None when it was never undone here."""
    if not sa.inspect(conn).has_table(UNDO_TABLE):
        return None
    row = conn.execute(sa.select(table.c.undone_at, table.c.rows).where(table.c.id == digest)).first()
    return (str(row[0]), int(row[1])) if row else None


def values(digest: str, selection: str, rows: int) -> dict[str, object]:
    return {"id": digest, "undone_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "selection": selection, "rows": rows}


def write(conn: Connection, digest: str, selection: str, rows: int) -> None:
    conn.execute(table.insert().values(**values(digest, selection, rows)))


def create_sql(engine: sa.Engine) -> str:
    """The table's CREATE statement in the target's dialect (for ``--sql`` files)."""
    return str(sa.schema.CreateTable(table, if_not_exists=True).compile(engine)).strip() + ";"
