"""Applying one upstream DDL to a target table, idempotently.

The statement is derived from the table definitions before and after the DDL
(from ``ddl_history``), never by replaying the upstream's SQL text, so it is
right for the target's dialect. As TiDB's tools treat "already exists" and
"doesn't exist" outcomes of a replayed DDL as done, each step first looks at
the target: a column already added, a table already dropped or renamed, an
index already there is skipped. Applying a DDL twice (a rerun after a crash
between a MySQL DDL, which commits by itself, and its checkpoint) is therefore
harmless.
"""

from __future__ import annotations

import logging

from sqlalchemy.engine import Connection

from binlake import codec, coldefault
from binlake.proto import binlog_pb2
from binlake.sql import dialect as dl
from binlake.sql.schema import column_def
from binlake.sql.targets import Target

log = logging.getLogger(__name__)


def apply_ddl(target: Target, conn: Connection, kind: str, old: binlog_pb2.TableInfo | None,
              new: binlog_pb2.TableInfo) -> list[str]:
    """Bring the target from ``old`` to ``new`` (target definitions, routes applied);
    the statements run. ``kind`` is ``rules.ddl_kind``'s."""
    engine = target.engine
    run: list[str] = []

    def ex(stmts: list[str]) -> None:
        target.execute_ddl(conn, stmts)
        run.extend(stmts)

    if kind == "drop table":
        name = old.name if old is not None else new.name
        if target.has_table(name, conn):
            ex(dl.drop_table_sql(engine, name))
        target.forget_schema(conn, name)
        return run
    if kind == "create table":
        if target.create_table_in(conn, new, if_exists="skip"):
            run.append(f"CREATE TABLE {new.name}")
        else:
            target.record_schema(conn, new)
        return run
    if kind == "truncate table":
        if target.has_table(new.name, conn):
            ex(dl.truncate_table_sql(engine, new.name))
        else:
            target.create_table_in(conn, new)
        target.record_schema(conn, new)
        return run
    if old is None:
        raise ValueError(f"{kind} of {new.name} needs the previous definition")
    if not target.alter_keeps_indexes:
        # The database cannot alter a table with indexes: drop them here; the end of
        # this function creates the new definition's unique keys again.
        holder = old.name if target.has_table(old.name, conn) else new.name
        if target.has_table(holder, conn):
            for index in sorted(target.index_names(conn, holder)):
                ex(dl.drop_unique_key_sql(engine, holder, index))
    if kind == "rename table":
        if old.name != new.name and target.has_table(old.name, conn) and not target.has_table(new.name, conn):
            ex(dl.rename_table_sql(engine, old.name, new.name))
            target.forget_schema(conn, old.name)
    name = new.name
    if not target.has_table(name, conn):
        target.create_table_in(conn, new)
        return run
    old_cols = {c.id: c for c in old.columns}
    new_cols = {c.id: c for c in new.columns}
    old_uks = {k.name: k for k in old.unique_keys}
    new_uks = {k.name: k for k in new.unique_keys}
    present_idx = target.index_names(conn, name)
    for uk in old_uks:
        if (uk not in new_uks or old_uks[uk] != new_uks[uk]) and uk in present_idx:
            ex(dl.drop_unique_key_sql(engine, name, uk))
    present = set(target.column_names(conn, name))
    for cid, col in old_cols.items():
        if cid not in new_cols and col.name in present:
            ex(dl.drop_column_sql(engine, name, col.name))
    present = set(target.column_names(conn, name))
    for cid, col in new_cols.items():
        was = old_cols.get(cid)
        if was is not None and was.name != col.name and was.name in present and col.name not in present:
            ex(dl.rename_column_sql(engine, name, was.name, col.name))
    present = set(target.column_names(conn, name))
    for cid, col in new_cols.items():
        if cid not in old_cols and col.name not in present:
            # With its DEFAULT, so the target gives the rows it holds what the upstream gave its
            # own (an expression's value as of the upstream's ALTER, when the binlog has it).
            fill = coldefault.fill(col)
            ex(dl.add_column_sql(engine, name, column_def(col),
                                 codec.decode_value(fill, col.type) if fill is not None else None))
    for cid, col in new_cols.items():
        was = old_cols.get(cid)
        if was is not None and (was.type, was.sql_type, was.nullable) != (col.type, col.sql_type, col.nullable):
            ex(dl.change_column_type_sql(engine, name, column_def(col), new))
        elif was is not None and was.default_value != col.default_value:
            ex(dl.set_default_sql(engine, name, column_def(col), new))
    present_idx = target.index_names(conn, name)
    by_id = {c.id: c.name for c in new.columns}
    for uk, key in new_uks.items():
        if uk not in present_idx:
            ex(dl.add_unique_key_sql(engine, name, uk, [by_id[i] for i in key.column_ids]))
    target.record_schema(conn, new)
    return run
