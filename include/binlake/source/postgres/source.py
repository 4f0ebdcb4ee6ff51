"""The PostgreSQL logical-decoding source: a ``pgoutput`` stream from a
replication slot, each upstream transaction sent to the Pumps as a prewrite +
commit pair (``source.emitter``), the slot's position confirmed to the server
only after the Pump acknowledged.

Why psycopg2: psycopg 3 (binlake's SQL driver) has no replication-protocol
API; psycopg2's ``LogicalReplicationConnection`` streams a slot and sends the
standby status (``send_feedback``), which is exactly what is needed here.

Messages (protocol version 1): BEGIN opens a transaction; RELATION describes a
table (sent before its first change and again after any change to it: a
changed column list becomes a DDL binlog with the resulting TableInfo);
INSERT/UPDATE/DELETE carry text-format tuples; TRUNCATE gives the table a new
table id (as TxnWriter's TRUNCATE); COMMIT closes the transaction, whose key is
its end LSN. Old images need ``REPLICA IDENTITY FULL``; a table without it is
refused with the statement that fixes it.

Crash safety is the MySQL source's (see ``source.journal``): the checkpoint
holds the end LSN of the last acknowledged transaction plus the table
definitions; the slot is confirmed up to it only after the checkpoint is on
disk, so the server re-sends anything after it, and re-sent transactions get
their journaled TSOs (dropped downstream as copies).

Limits: column ids follow names, so a RENAME COLUMN looks like a drop plus an
add (pgoutput says nothing about renames); the primary key of a table is read
from the catalog when its RELATION arrives.
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import select
import struct
import threading
import time
from typing import Any

from binlake import codec, errors
from binlake.config import ClientSettings
from binlake.proto import binlog_pb2
from binlake.source.emitter import Emitter
from binlake.source.journal import SourceState
from binlake.source.mysql.tables import MyColumn, MyTable, assign_ids

log = logging.getLogger(__name__)

FIRST_TABLE_ID = 100
CHECKPOINT_INTERVAL_S = 1.0

# type oid -> binlake type
_TYPES = {16: "bool", 20: "int", 21: "int", 23: "int", 26: "uint", 700: "float", 701: "float", 1700: "decimal",
          25: "string", 1043: "string", 1042: "string", 19: "string", 2950: "string", 17: "bytes",
          1082: "date", 1114: "datetime", 1184: "datetime", 1083: "time", 114: "json", 3802: "json"}


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.d = data
        self.i = 0

    def byte(self) -> str:
        c = chr(self.d[self.i])
        self.i += 1
        return c

    def num(self, n: int) -> int:
        fmt = {1: ">b", 2: ">h", 4: ">i", 8: ">q"}[n]
        v = struct.unpack_from(fmt, self.d, self.i)[0]
        self.i += n
        return int(v)

    def text(self) -> str:
        end = self.d.index(b"\0", self.i)
        s = self.d[self.i:end].decode()
        self.i = end + 1
        return s

    def raw(self, n: int) -> bytes:
        b = self.d[self.i:self.i + n]
        self.i += n
        return b

    def tuple_data(self) -> list[bytes | None | str]:
        out: list[bytes | None | str] = []
        for _ in range(self.num(2)):
            kind = self.byte()
            if kind == "n":
                out.append(None)
            elif kind == "u":
                out.append("unchanged")
            else:
                out.append(self.raw(self.num(4)))
        return out


def convert(text: bytes, oid: int, col: str) -> Any:
    s = text.decode()
    try:
        if oid in (20, 21, 23, 26):
            return int(s)
        if oid == 16:
            return s == "t"
        if oid in (700, 701):
            return float(s)
        if oid == 1700:
            return decimal.Decimal(s)
        if oid == 17:
            return bytes.fromhex(s[2:]) if s.startswith("\\x") else s.encode()
        if oid == 1082:
            return dt.date.fromisoformat(s)
        if oid == 1114:
            return dt.datetime.fromisoformat(s)
        if oid == 1184:
            v = dt.datetime.fromisoformat(s if len(s) < 3 or s[-3] in "+-" and ":" in s[-6:] else s + ":00")
            return v.astimezone(dt.UTC).replace(tzinfo=None)
        if oid == 1083:
            return dt.time.fromisoformat(s)
        if oid in (114, 3802):
            return s
        return s
    except ValueError as exc:
        raise errors.FailedPrecondition(f"{col}: value {s[:40]!r} cannot be carried: {exc}") from None


class PostgresSource:
    def __init__(self, dsn: str, *, slot: str, publication: str, registry: str, data_dir: str,
                 create: bool = False, status_addr: str = "127.0.0.1:0",
                 client_settings: ClientSettings | None = None) -> None:
        for what, v in (("--slot", slot), ("--publication", publication)):
            if not isinstance(v, str) or not v.replace("_", "").isalnum() or not v[:1].isalpha():
                raise errors.InvalidArgument(f"{what} {v!r} must be letters, digits and _ (starting with a letter)")
        if not isinstance(dsn, str) or not dsn.startswith(("postgresql://", "postgres://")):
            raise errors.InvalidArgument(f"--dsn {dsn!r} is not a PostgreSQL URL (postgresql://USER@HOST:PORT/DB)")
        self.dsn = dsn.replace("postgresql+psycopg://", "postgresql://")
        self.slot, self.publication, self.create = slot, publication, create
        self.registry_addr = registry
        self.state = SourceState(data_dir)
        self._status_addr, self._client_settings = status_addr, client_settings
        self._stop = threading.Event()
        self.ready = threading.Event()
        self.emitter: Emitter | None = None
        self.tables: dict[int, MyTable] = {}  # relation oid -> definition
        self.oids: dict[int, list[int]] = {}  # relation oid -> column type oids
        self.lsn = 0
        self.transactions = 0
        self._dirty = False
        self._last_save = 0.0

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------ catalog
    def _sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg2

        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(query, params)
                return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    def _setup(self) -> None:
        import psycopg2

        try:
            level = self._sql("SHOW wal_level")[0][0]
        except psycopg2.OperationalError as exc:
            raise errors.Unavailable(
                f"cannot connect to {self.dsn.split('@')[-1]}: {(str(exc).strip() or type(exc).__name__).splitlines()[0]}"
            ) from None
        if level != "logical":
            raise errors.FailedPrecondition(
                f"wal_level is {level}; logical decoding needs wal_level=logical in postgresql.conf (then restart)"
            )
        pubs = self._sql("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,))
        slots = self._sql("SELECT plugin FROM pg_replication_slots WHERE slot_name = %s", (self.slot,))
        if not pubs:
            if not self.create:
                raise errors.FailedPrecondition(f"publication {self.publication} does not exist; create it "
                                                "(CREATE PUBLICATION ... FOR ALL TABLES) or pass --create")
            self._sql(f'CREATE PUBLICATION "{self.publication}" FOR ALL TABLES')
        if not slots:
            if not self.create:
                raise errors.FailedPrecondition(f"replication slot {self.slot} does not exist; pass --create")
            self._sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot,))
        elif slots[0][0] != "pgoutput":
            raise errors.FailedPrecondition(f"slot {self.slot} uses plugin {slots[0][0]}, not pgoutput")
        rows = self._sql(
            "SELECT c.oid, n.nspname, c.relname, c.relreplident FROM pg_publication_tables p "
            "JOIN pg_namespace n ON n.nspname = p.schemaname JOIN pg_class c ON c.relnamespace = n.oid "
            "AND c.relname = p.tablename WHERE p.pubname = %s", (self.publication,))
        bad = [f"{s}.{t}" for _o, s, t, ident in rows if ident != "f"]
        if bad:
            raise errors.FailedPrecondition(
                f"table(s) {', '.join(bad)} lack REPLICA IDENTITY FULL, so updates and deletes carry no old image; "
                f"run ALTER TABLE {bad[0]} REPLICA IDENTITY FULL (for each)"
            )

    def _primary_key(self, oid: int) -> list[str]:
        rows = self._sql(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary ORDER BY array_position(i.indkey, "
            "a.attnum)", (oid,))
        return [r[0] for r in rows]

    # ------------------------------------------------------------------ main loop
    def run(self) -> None:
        import psycopg2
        import psycopg2.extras

        try:
            self._setup()
            self.emitter = Emitter(self.registry_addr, self.state, kind="postgres", status_addr=self._status_addr,
                                   client_settings=self._client_settings)
        except BaseException:
            self.state.close()
            raise
        try:
            st = self.state.state
            self.lsn = int(st.get("lsn", 0))
            for k, v in st.get("tables", {}).items():
                self.tables[int(k)] = MyTable.from_json(v)
            self.oids = {int(k): v for k, v in st.get("oids", {}).items()}
            st.setdefault("next_table_id", FIRST_TABLE_ID)
            conn = psycopg2.connect(self.dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
            cur = conn.cursor()
            cur.start_replication(slot_name=self.slot, decode=False, start_lsn=self.lsn,
                                  options={"proto_version": "1", "publication_names": self.publication})
            self.ready.set()
            txn: dict[int, binlog_pb2.TableMutation] | None = None
            while not self._stop.is_set():
                msg = cur.read_message()
                if msg is None:
                    self._checkpoint(cur)
                    select.select([cur], [], [], 0.5)
                    continue
                r = _Reader(msg.payload)
                kind = r.byte()
                if kind == "B":
                    txn = {}
                elif kind == "R":
                    self._relation(r)
                elif kind in ("I", "U", "D"):
                    assert txn is not None
                    self._change(kind, r, txn)
                elif kind == "T":
                    n = r.num(4)
                    r.num(1)
                    for _ in range(n):
                        self._truncate(r.num(4), msg.data_start)
                elif kind == "C":
                    r.num(1)
                    r.num(8)
                    end_lsn = r.num(8)
                    if txn:
                        value = binlog_pb2.PrewriteValue(schema_version=int(st.get("schema_version", 0)),
                                                         mutations=list(txn.values()))
                        self.emitter.emit(f"lsn:{end_lsn}", value)
                        self.transactions += 1
                    txn = None
                    self.lsn = end_lsn
                    self._dirty = True
                    self._checkpoint(cur)
            self._checkpoint(cur, force=True)
            conn.close()
        finally:
            self.emitter.close()
            self.state.close()

    def _checkpoint(self, cur: Any, force: bool = False) -> None:
        now = time.monotonic()
        if self._dirty and (force or now - self._last_save >= CHECKPOINT_INTERVAL_S):
            self.state.save(lsn=self.lsn, tables={str(k): v.to_json() for k, v in self.tables.items()},
                            oids={str(k): v for k, v in self.oids.items()})
            self._dirty = False
            self._last_save = now
        # Confirm to the server only what the checkpoint holds (it may then recycle the WAL).
        saved = int(self.state.state.get("lsn", 0))
        if saved:
            cur.send_feedback(write_lsn=saved, flush_lsn=saved, reply=False)

    def _relation(self, r: _Reader) -> None:
        oid = r.num(4)
        ns, name = r.text(), r.text()
        ident = r.byte()
        cols: list[MyColumn] = []
        oids: list[int] = []
        for _ in range(r.num(2)):
            r.num(1)
            cname, toid, typmod = r.text(), r.num(4), r.num(4)
            kind = _TYPES.get(toid)
            if kind is None:
                raise errors.FailedPrecondition(
                    f"column {ns}.{name}.{cname} has a type (oid {toid}) binlake cannot carry; leave the table out "
                    "of the publication or change the column's type"
                )
            c = MyColumn(name=cname, kind=kind)
            if kind == "decimal":
                c.precision, c.scale = ((typmod - 4) >> 16, (typmod - 4) & 0xFFFF) if typmod > 0 else (65, 30)
            if toid in (1043, 1042) and typmod > 0:
                c.length = typmod - 4
            cols.append(c)
            oids.append(toid)
        if ident != "f":
            raise errors.FailedPrecondition(
                f"table {ns}.{name} has REPLICA IDENTITY {ident!r}, not FULL: updates and deletes would carry no "
                f"old image; run ALTER TABLE {ns}.{name} REPLICA IDENTITY FULL"
            )
        old = self.tables.get(oid)
        shape = [(c.name, c.kind, c.precision, c.scale, c.length) for c in cols]
        if old is not None and old.name == name and old.db == ns and shape == [
            (c.name, c.kind, c.precision, c.scale, c.length) for c in old.columns
        ]:
            return
        pk = self._primary_key(oid)
        for c in cols:
            c.nullable = c.name not in pk
        new = MyTable(db=ns, name=name, columns=cols, primary_key=pk, unique_keys={})
        if old is not None:
            new.column_ids = {k: v for k, v in old.column_ids.items() if any(c.name == k for c in cols)}
        what = "CREATE TABLE" if old is None else "ALTER TABLE"
        self._ddl(oid, new, old, f"-- {what} {ns}.{name} ({', '.join(f'{c.name} {c.kind}' for c in cols)})",
                  key=f"rel:{oid}:{len(self.state.state.get('ddl_seen', []))}")
        self.oids[oid] = oids

    def _ddl(self, oid: int, new: MyTable | None, old: MyTable | None, sql: str, key: str,
             truncate: bool = False) -> None:
        assert self.emitter is not None
        st = self.state.state
        version = int(st.get("schema_version", 0)) + 1
        next_id = int(st.get("next_table_id", FIRST_TABLE_ID))
        decided = self.emitter.ddl_decision(key)
        if new is None:
            assert old is not None
            info = old.to_info()
            info.dropped = True
        else:
            tid = old.table_id if old is not None and not truncate else next_id
            if tid == next_id:
                next_id += 1
            assign_ids(new, old, tid, version)
            info = new.to_info()
            if truncate and old is not None:
                info.previous_table_id = old.table_id
        info.schema_version = version
        if decided:
            info = decided[0]
            if new is not None:
                new.table_id, new.schema_version = info.table_id, info.schema_version
                new.column_ids = {c.name: c.id for c in info.columns}
                new.next_column_id = info.next_column_id
            version = info.schema_version
            next_id = max(next_id, info.table_id + 1)
        self.emitter.emit(key, binlog_pb2.PrewriteValue(schema_version=version), ddl=(sql, [info]))
        st["schema_version"], st["next_table_id"] = version, next_id
        st.setdefault("ddl_seen", []).append(key)
        if new is not None:
            self.tables[oid] = new
        self._dirty = True
        log.info("postgres source: DDL v%d %s.%s", version, info.db, info.name)

    def _truncate(self, oid: int, lsn: int) -> None:
        old = self.tables.get(oid)
        if old is None:
            return
        new = MyTable.from_json(old.to_json())
        self._ddl(oid, new, old, f"TRUNCATE TABLE {old.db}.{old.name}", key=f"truncate:{oid}:{lsn}", truncate=True)

    def _change(self, kind: str, r: _Reader, txn: dict[int, binlog_pb2.TableMutation]) -> None:
        oid = r.num(4)
        t = self.tables[oid]
        oids = self.oids[oid]
        info = t.to_info()

        def row(values: list[bytes | None | str]) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for c, toid, v in zip(t.columns, oids, values, strict=True):
                if v == "unchanged":
                    raise errors.FailedPrecondition(f"{t.full_name}.{c.name}: an unchanged TOAST value arrived "
                                                    "without its data; set REPLICA IDENTITY FULL")
                out[c.name] = None if v is None else convert(v, toid, f"{t.full_name}.{c.name}")  # type: ignore[arg-type]
            return out

        m = txn.get(t.table_id)
        if m is None:
            m = txn[t.table_id] = binlog_pb2.TableMutation(table_id=t.table_id)
        try:
            if kind == "I":
                r.byte()
                m.inserted_rows.append(codec.encode_row(row(r.tuple_data()), info))
                m.sequence.append(binlog_pb2.INSERT)
            elif kind == "U":
                k = r.byte()
                if k not in ("O", "K"):
                    raise errors.FailedPrecondition(f"{t.full_name}: an update without its old image; set "
                                                    f"REPLICA IDENTITY FULL")
                old = row(r.tuple_data())
                r.byte()
                m.updated_rows.append(codec.encode_update(old, row(r.tuple_data()), info))
                m.sequence.append(binlog_pb2.UPDATE)
            else:
                r.byte()
                m.deleted_rows.append(codec.encode_row(row(r.tuple_data()), info))
                m.sequence.append(binlog_pb2.DELETE_ROW)
        except (TypeError, ValueError) as exc:
            raise errors.FailedPrecondition(f"{t.full_name}: {exc}") from None

