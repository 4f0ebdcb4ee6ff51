"""A table at T loaded into a database as its snapshot's rows, then patched with the
changes made since.

A point-in-time restore is most often a snapshot plus the changes of part of a day
(the maintenance DAG takes one a day). Rebuilding such a table in Spark groups every
one of its rows by key with the few changed ones: the whole table goes through a
shuffle, then through the driver, for the sake of a few keys. Here the snapshot's
Parquet files are copied into the target as they are (``stream.base_tables``: one
``COPY`` on PostgreSQL; ``stream.base_rows`` for bytes, JSON and times), then, in the same transaction, every key changed in
``(snapshot ts, T]`` is deleted and the keys' rows at T inserted. Spark types only
the changed keys: the one-pass result (``onepass.last_changes``) already holds one
row per changed key, its last change, so this is a projection, with no aggregation.

For a table with a unique key besides its primary key, every delete comes before
the inserts (two passes over the changed keys, both reading the one-pass result's
checkpoint, so the lake is not read again): a row at T may take a unique value that
another changed key's base row held. Any other table takes one pass, each batch's
keys deleted then its rows inserted.

Eligible (``eligible``) when the base is a snapshot read from its files, and the
table's definition did not change in ``(snapshot ts, T]`` (its change rows then
decode with the definition at T, one text per key). Otherwise the table takes the
Spark rebuild as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from binlake import tso
from binlake.proto import binlog_pb2
from binlake.restore import columns as C
from binlake.restore import fills as fill_mod
from binlake.restore import onepass, rebuild, stream
from binlake.restore.tables import Plan, TablePlan
from binlake.sql import targets


def eligible(p: Plan, t: TablePlan) -> bool:
    """Whether ``t`` may be loaded as its snapshot then patched: a snapshot base with
    rows and files, and no new definition of the table in ``(base ts, T]``."""
    base = t.base
    if base.kind != "snapshot" or base.frame is None or not base.path or base.ts >= p.ts:
        return False
    return not any(base.ts < ets <= p.ts + 1 for ets, _info in p.schema.entries_of(t.table_id))


@dataclasses.dataclass(frozen=True)
class Changed:
    """The keys of one table changed in ``(base ts, T]``, from the one-pass result:
    ``events`` (``rebuild.events``) of their last changes, typed with the definition
    at T, one per key; ``_del`` marks a key absent at T."""

    info: binlog_pb2.TableInfo
    events: Any

    def keys(self) -> Iterator[list[tuple[Any, ...]]]:
        """Every changed key (present at T or not), in batches of at most ``[memory]
        batch_rows``, as the Python values a target's ``delete_keys`` binds."""
        key = self._key_columns()
        for table in stream.arrow_batches(self.events, [c.name for c in key]):
            yield _key_tuples(table, key)

    def _key_columns(self) -> list[C.Column]:
        by_name = {c.name: c for c in C.columns_of(self.info)}
        return [by_name[n] for n in C.key_names(self.info)]

    def apply(self, target: targets.Target, conn: Any) -> int:
        """Delete every changed key from the loaded table, then insert the keys' rows at
        T, in ``conn``'s transaction; the change in the table's row count. A table with
        no unique key but its primary key takes one pass, batch by batch (a row can then
        only collide with its own key, deleted just before); otherwise every delete comes
        first, in a pass of its own."""
        from pyspark.sql import functions as F

        if not self.info.unique_keys:
            return self._apply_in_one_pass(target, conn)
        gone = sum(target.delete_keys(conn, self.info, batch) for batch in self.keys())
        present = self.events.where(~F.col("_del"))
        if stream.arrow_ready(self.info):
            added = target.insert_arrow_stream(conn, self.info, stream.arrow_tables(present, self.info))
        else:
            added = target.insert_rows(conn, self.info, stream.python_rows(present, self.info))
        return int(added) - int(gone)

    def _apply_in_one_pass(self, target: targets.Target, conn: Any) -> int:
        import pyarrow.compute as pc

        cols = C.columns_of(self.info)
        names = [c.name for c in cols]
        key = self._key_columns()
        ready = stream.arrow_ready(self.info)
        n = 0
        for table in stream.arrow_batches(self.events, [*names, "_del"]):
            n -= int(target.delete_keys(conn, self.info, _key_tuples(table, key)))
            present = table.filter(pc.invert(table.column("_del"))).select(names)
            if not present.num_rows:
                continue
            if ready:
                n += int(target.insert_arrow(conn, self.info, stream.as_inserted(present)))
            else:
                n += int(target.insert_rows(conn, self.info, stream.python_rows_of(present, cols)))
        return n


def _key_tuples(table: Any, key: list[C.Column]) -> list[tuple[Any, ...]]:
    """The key of each row of ``table``, as the Python values a target's ``delete_keys`` binds."""
    return [tuple(row[c.name] for c in key) for row in stream.python_rows_of(table, key)]


def changed(p: Plan, t: TablePlan, shared: Any, into: binlog_pb2.TableInfo) -> Changed:
    """``t``'s changed keys (``eligible`` tables only), read from ``shared``
    (``tables.shared_changes``, which holds the table's slice when it has changes), for
    the table ``into`` (its definition at T as placed in the target)."""
    schema = p.schema
    at = schema.table(t.table_id, min(p.ts + 1, tso.MAX_TS))
    out = C.columns_of(at)
    events = rebuild.events(onepass.of_table(shared, t.table_id), rebuild.versions(schema, t.table_id), out,
                            C.key_names(at), fill_mod.version_fills(schema, t.table_id))
    return Changed(into, events)
