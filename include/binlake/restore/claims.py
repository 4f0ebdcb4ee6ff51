"""Which restore run made each table of a target database.

A restore into a ``target`` must never overwrite tables another run (or a
person) made there, yet a retry of the same run must be able to replace what
its earlier try created. So every table a restore creates in a target is
claimed, in the target itself, by the run that created it: the table
``_binlake_restore_claims`` (name -> run id, T). ``binlake diff`` and the
checksums skip ``_binlake_*`` tables, so the claims never show up as a
difference.

Invariant: a claim names a table only after that run created it. The claim is
written in the same transaction as the table's DDL where the dialect's DDL is
transactional (SQLite, PostgreSQL), right after it on MySQL/MariaDB (whose DDL
commits by itself). A crash between the two on MySQL leaves a table without
its claim: the retry then refuses it, naming it, instead of replacing it, so
the error is always on the side of never overwriting someone else's table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from binlake import errors
from binlake.proto import binlog_pb2

CLAIMS_TABLE = "_binlake_restore_claims"

_md = sa.MetaData()
_claims = sa.Table(CLAIMS_TABLE, _md, sa.Column("name", sa.String(128), primary_key=True),
                   sa.Column("run_id", sa.String(250), nullable=False),
                   sa.Column("ts", sa.BigInteger, nullable=False))


def _check_run(run_id: str) -> None:
    if not isinstance(run_id, str) or not run_id.strip():
        raise ValueError(f"run_id must be a non-empty string, got {run_id!r}")


def _owner(target: Any, conn: Connection, name: str) -> str | None:
    if not target.has_table(CLAIMS_TABLE, conn):
        return None
    row = conn.execute(sa.select(_claims.c.run_id).where(_claims.c.name == name)).first()
    return str(row[0]) if row is not None else None


def foreign_tables(target: Any, names: Sequence[str], run_id: str) -> list[str]:
    """The tables of ``names`` the target already holds that run ``run_id`` did not create."""
    _check_run(run_id)
    with target.engine.connect() as conn:
        return [n for n in names if target.has_table(n, conn) and _owner(target, conn, n) != run_id]


def foreign_owners(target: Any, names: Sequence[str], run_id: str) -> dict[str, str | None]:
    """``foreign_tables`` with the run that made each (None: not a restore's)."""
    _check_run(run_id)
    with target.engine.connect() as conn:
        owners = {n: _owner(target, conn, n) for n in names if target.has_table(n, conn)}
    return {n: owner for n, owner in owners.items() if owner != run_id}


def refuse_foreign(target: Any, names: Sequence[str], run_id: str, replace: bool) -> None:
    """Refuse (``errors.AlreadyExists``, naming them) tables another run or a person made,
    unless ``replace``."""
    if replace:
        return
    taken = foreign_tables(target, names, run_id)
    if taken:
        raise errors.AlreadyExists(
            f"target {target} already holds table(s) {', '.join(taken)} that this run did not create: "
            "restore into another database, drop them, or set replace")


def create(target: Any, info: binlog_pb2.TableInfo, run_id: str, ts: int, replace: bool) -> None:
    """Create ``info.name`` in the target for run ``run_id`` and claim it (see the invariant above);
    an existing table is replaced only when this run created it or ``replace`` is set."""
    with target.engine.connect() as conn:
        conn.begin()
        create_in(target, conn, info, run_id, ts, replace)
        conn.commit()


def create_in(target: Any, conn: Connection, info: binlog_pb2.TableInfo, run_id: str, ts: int,
              replace: bool) -> None:
    """``create`` in the caller's transaction ``conn`` (its rows can then join it, so where DDL
    is transactional a crash leaves no table rather than an empty one)."""
    _check_run(run_id)
    if target.has_table(info.name, conn) and not replace and _owner(target, conn, info.name) != run_id:
        raise errors.AlreadyExists(
            f"target {target} already holds table {info.name}, which this run did not create: "
            "restore into another database, drop it, or set replace")
    target.create_table_in(conn, info, if_exists="replace")
    _claims.create(conn, checkfirst=True)
    conn.execute(_claims.delete().where(_claims.c.name == info.name))
    conn.execute(_claims.insert().values(name=info.name, run_id=run_id, ts=int(ts)))


def ensure_table(target: Any) -> None:
    """Create the claims table now if missing, so tables created at once (a restore's
    parallel loads) do not race to create it."""
    with target.engine.connect() as conn:
        conn.begin()
        _claims.create(conn, checkfirst=True)
        conn.commit()
