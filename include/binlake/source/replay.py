"""Rows rebuilt from binlogs alone, in memory: table -> {primary key: row},
each change decoded with the table definition of its DDL binlog (as the lake's
schema history does). Used to check a source end to end (tests, the demo):
its checksums (``binlake.sql.checksum`` row hashes) must equal the upstream's.
An insert of a key already there, or an update/delete whose before image
differs from the row held, raises AssertionError: either means a transaction
was served twice or out of order."""

from __future__ import annotations

from typing import Any

from binlake import codec, coldefault
from binlake.proto import binlog_pb2
from binlake.sql import checksum
from binlake.sql import schema as sc


class Replay:
    """Rows rebuilt from binlogs alone: table name -> {primary key: row}, via each
    DDL binlog's TableInfo (as the lake's schema history decodes them)."""

    def __init__(self) -> None:
        self.infos: dict[int, binlog_pb2.TableInfo] = {}
        self.rows: dict[int, dict[tuple[Any, ...], dict[str, Any]]] = {}
        self.ddls = 0
        self.changes = 0

    def apply(self, binlogs: list[binlog_pb2.Binlog]) -> Replay:
        for b in binlogs:
            if b.ddl_query:
                info = b.ddl_table
                self.ddls += 1
                if info.previous_table_id:
                    self.infos.pop(info.previous_table_id, None)
                    self.rows.pop(info.previous_table_id, None)
                if info.dropped:
                    self.infos.pop(info.table_id, None)
                    self.rows.pop(info.table_id, None)
                    continue
                old = self.infos.get(info.table_id)
                self.infos[info.table_id] = info
                rows = self.rows.setdefault(info.table_id, {})
                if old is not None:
                    # Re-key rows under the new definition (renamed/dropped/added columns by id);
                    # an added column holds what the upstream gave the rows it had (``coldefault.fill``).
                    by_id = {c.id: c.name for c in old.columns}
                    new_names = {c.id: c.name for c in info.columns}
                    fills = {}
                    for c in info.columns:
                        fill = coldefault.fill(c) if c.id not in by_id else None
                        fills[c.id] = codec.decode_value(fill, c.type) if fill is not None else None
                    rebuilt = {}
                    for r in rows.values():
                        ids = {cid: r[n] for cid, n in by_id.items() if n in r}
                        nr = {new_names[cid]: ids[cid] if cid in ids else fills[cid] for cid in new_names}
                        rebuilt[self._key(info, nr)] = nr
                    self.rows[info.table_id] = rebuilt
                continue
            for m in binlog_pb2.PrewriteValue.FromString(b.prewrite_value).mutations:
                info = self.infos[m.table_id]
                rows = self.rows[m.table_id]
                it = {binlog_pb2.INSERT: iter(m.inserted_rows), binlog_pb2.UPDATE: iter(m.updated_rows),
                      binlog_pb2.DELETE_ROW: iter(m.deleted_rows)}
                for kind in m.sequence:
                    data = next(it[kind])
                    self.changes += 1
                    if kind == binlog_pb2.INSERT:
                        r = codec.decode_row(data, info)
                        k = self._key(info, r)
                        if k in rows:
                            raise AssertionError(f"insert of an existing key {k} in {info.name}")
                        rows[k] = r
                    elif kind == binlog_pb2.UPDATE:
                        before, after = codec.decode_update(data, info)
                        had = rows.pop(self._key(info, before))
                        if had != before:
                            raise AssertionError(f"update before image differs in {info.name}: {had} != {before}")
                        rows[self._key(info, after)] = after
                    else:
                        r = codec.decode_row(data, info)
                        if rows.pop(self._key(info, r)) != r:
                            raise AssertionError(f"delete image differs in {info.name}")
        return self

    @staticmethod
    def _key(info: binlog_pb2.TableInfo, row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(row[k] for k in sc.key_columns(info))

    def table(self, name: str) -> tuple[binlog_pb2.TableInfo, list[dict[str, Any]]]:
        for tid, info in self.infos.items():
            if info.name == name:
                return info, list(self.rows[tid].values())
        raise KeyError(name)

    def checksums(self) -> dict[str, tuple[int, str]]:
        out = {}
        for tid, info in self.infos.items():
            acc = checksum._Acc()
            js = [c.name for c in info.columns if c.type == binlog_pb2.JSON]
            for r in self.rows[tid].values():
                acc.add(checksum.row_hash(r, js))
            out[info.name] = (acc.rows, acc.hex())
        return out

    def schema(self) -> dict[str, binlog_pb2.TableInfo]:
        return {i.name: i for i in self.infos.values()}
