"""Helpers for the source tests: a binlog-enabled MariaDB, a registry and one
Pump, a source run in a thread, and reading back what the Pump serves as the
rows it rebuilds (by replaying the binlogs, keyed by primary key)."""

from __future__ import annotations

import dataclasses
import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import pymysql

from binlake import codec, config, oracle
from binlake.client.reader import pull_window
from binlake.devdb import LocalMariaDB
from binlake.proto import binlog_pb2
from binlake.pump.node import PumpNode
from binlake.registry.client import RegistryClient
from binlake.registry.server import RegistryServer
from binlake.source import schema as sc


@dataclasses.dataclass
class Cluster:
    registry: RegistryServer
    pump: PumpNode

    def binlogs(self, start_ts: int = 0) -> list[binlog_pb2.Binlog]:
        """Every complete transaction the Pump serves, merged and deduplicated as the reader does."""
        with RegistryClient(self.registry.addr) as reg:
            end_ts = reg.get_ts()
        return list(pull_window({"p1": self.pump.addr}, start_ts, end_ts, wait=True, wait_timeout_s=60))

    def raw(self, start_ts: int = 0) -> list[binlog_pb2.Binlog]:
        """The Pump's window *without* the reader's duplicate rule (to count copies)."""
        from binlake.client.reader import pull_pump

        with RegistryClient(self.registry.addr) as reg:
            end_ts = reg.get_ts()
        return list(pull_pump(self.pump.addr, start_ts, end_ts, wait=True, wait_timeout_s=60))


def start_cluster(tmp: pathlib.Path) -> tuple[RegistryServer, PumpNode]:
    reg = RegistryServer(config.load(config.RegistrySettings, data_dir=tmp / "registry",
                                     addr="127.0.0.1:0")).start()
    pump = PumpNode(config.load(
        config.PumpSettings, registry=reg.addr, data_dir=tmp / "p1", addr="127.0.0.1:0", node_id="p1",
        stop_write_at_free_bytes=0, fake_binlog_interval_s=0.2, txn_timeout_s=1,
    )).start()
    return reg, pump


def sql(server: LocalMariaDB, *stmts: str, db: str | None = None) -> list[Any]:
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", autocommit=True, charset="utf8mb4",
                           database=db)
    out: list[Any] = []
    try:
        with conn.cursor() as cur:
            for s in stmts:
                cur.execute(s)
                out = list(cur.fetchall())
    finally:
        conn.close()
    return out


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
                    # Re-key rows under the new definition (renamed/dropped/added columns by id).
                    by_id = {c.id: c.name for c in old.columns}
                    new_names = {c.id: c.name for c in info.columns}
                    rebuilt = {}
                    for r in rows.values():
                        ids = {cid: r[n] for cid, n in by_id.items() if n in r}
                        nr = {new_names[cid]: ids.get(cid) for cid in new_names}
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
                        assert k not in rows, f"insert of an existing key {k} in {info.name}"
                        rows[k] = r
                    elif kind == binlog_pb2.UPDATE:
                        old, new = codec.decode_update(data, info)
                        had = rows.pop(self._key(info, old))
                        assert had == old, f"update before image differs in {info.name}: {had} != {old}"
                        rows[self._key(info, new)] = new
                    else:
                        r = codec.decode_row(data, info)
                        assert rows.pop(self._key(info, r)) == r, f"delete image differs in {info.name}"
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
            acc = oracle._Acc()
            js = [c.name for c in info.columns if c.type == binlog_pb2.JSON]
            for r in self.rows[tid].values():
                acc.add(oracle.row_hash(r, js))
            out[info.name] = (acc.rows, acc.hex())
        return out

    def schema(self) -> dict[str, binlog_pb2.TableInfo]:
        return {i.name: i for i in self.infos.values()}


class SourceThread:
    """A MySQLSource run in a background thread."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.source.run()
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def start(self) -> SourceThread:
        self.thread.start()
        return self

    def stop(self, timeout: float = 30) -> None:
        self.source.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "source did not stop"
        if self.error is not None:
            raise self.error


def iter_rows(server: LocalMariaDB, db: str, table: str) -> Iterator[dict[str, Any]]:
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", charset="utf8mb4", database=db,
                           cursorclass=pymysql.cursors.DictCursor)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM `{table}`")
            yield from cur.fetchall()
    finally:
        conn.close()
