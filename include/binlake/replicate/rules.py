"""A task's rules as decisions about one upstream table: is it replicated
(allow/block lists), which events are ignored, where does it go (routes), and
which expression filters apply to it.

Name patterns: ``*`` matches anything, ``~regex`` matches a name in full
(Python syntax, case-insensitive), anything else is an exact name compared
case-insensitively. A table pattern is ``SCHEMA.TABLE``. As TiDB's table
filter does, the allow list decides first (empty: every table), then the
block list removes tables from what it allowed. Routes are tried in order;
the first whose patterns match renames the table.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from binlake.proto import binlog_pb2
from binlake.replicate.task import ExprFilter, Task

DML = ("insert", "update", "delete")


def name_matches(pattern: str, name: str) -> bool:
    if pattern == "*":
        return True
    if pattern.startswith("~"):
        return re.fullmatch(pattern[1:], name, re.IGNORECASE) is not None
    return pattern.lower() == name.lower()


def table_matches(pattern: str, db: str, tbl: str) -> bool:
    schema, _, table = pattern.partition(".")
    return name_matches(schema, db) and name_matches(table, tbl)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where an upstream table's changes go."""

    table: str  # the target table's name
    schema: str  # the routed schema (informational: a target is one database)
    extract_column: str | None = None  # a column holding the upstream table's name
    extract_value: str | None = None


class Rules:
    """The decisions of one task (cached per table)."""

    def __init__(self, task: Task) -> None:
        self.task = task

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one Rules per task run; bounded
    def replicated(self, db: str, tbl: str) -> bool:
        f = self.task.filter
        if f.allow and not any(table_matches(p, db, tbl) for p in f.allow):
            return False
        return not any(table_matches(p, db, tbl) for p in f.block)

    @functools.lru_cache(maxsize=4096)  # noqa: B019
    def ignored(self, db: str, tbl: str) -> frozenset[str]:
        """The event kinds ignored for this table ("ddl" expands to every DDL kind)."""
        out: set[str] = set()
        for ef in self.task.event_filters:
            if any(table_matches(p, db, tbl) for p in ef.tables):
                out.update(ef.ignore)
        if "ddl" in out:
            out.update(("create table", "drop table", "truncate table", "rename table", "alter table"))
        return frozenset(out)

    @functools.lru_cache(maxsize=4096)  # noqa: B019
    def place(self, db: str, tbl: str) -> Placement:
        for r in self.task.routes:
            if name_matches(r.schema_pattern, db) and name_matches(r.table_pattern, tbl):
                return Placement(r.target_table or tbl, r.target_schema or db, r.extract_table_column,
                                 tbl if r.extract_table_column else None)
        return Placement(tbl, db)

    def expr_filters(self, db: str, tbl: str) -> list[ExprFilter]:
        return [e for e in self.task.expr_filters if table_matches(e.table, db, tbl)]

    def target_info(self, info: binlog_pb2.TableInfo) -> binlog_pb2.TableInfo:
        """The target's definition for upstream table ``info``: renamed by the route,
        with the extract-table column (part of the primary key, since shards may
        hold the same key values) when the route asks for one."""
        place = self.place(info.db, info.name)
        out = binlog_pb2.TableInfo()
        out.CopyFrom(info)
        out.name = place.table
        out.db = place.schema
        if place.extract_column and all(c.name != place.extract_column for c in out.columns):
            col_id = max([c.id for c in out.columns] + [out.next_column_id - 1]) + 1
            out.columns.add(id=col_id, name=place.extract_column, type=binlog_pb2.STRING, nullable=False,
                            sql_type="string(64)")
            out.primary_key.append(col_id)
            out.next_column_id = col_id + 1
        return out


def ddl_kind(previous: binlog_pb2.TableInfo | None, info: binlog_pb2.TableInfo) -> str:
    """The event kind of a DDL, from the definitions before and after it."""
    if info.dropped:
        return "drop table"
    if info.previous_table_id:
        return "truncate table"
    if previous is None:
        return "create table"
    if previous.name != info.name or previous.db != info.db:
        return "rename table"
    return "alter table"
