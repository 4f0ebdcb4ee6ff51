"""The MySQL/MariaDB row-binlog source (the Syncer role): registers as a
replica, reads ROW events, and sends every upstream transaction to the Pumps
as a prewrite + commit pair with TSOs taken in binlog order. ``MySQLSource``
is a ``source.base.Source`` (which runs it and moves its checkpoint); its
position is a binlog (file, offset).

The stream is read through ``framing``: mysql-replication connects and
registers as a replica, the C framer (``_framec``) reads the events after
that, and mysql-replication parses only what the framer leaves to it; both
readers give the same event tuples, so one loop below handles either.

Event handling (MariaDB and MySQL flavours):

* GTID / ``BEGIN`` open a transaction; TABLE_MAP names a table for the rows
  that follow (typed from the tracked definition, ``values.prepare_table_map``);
  WRITE/UPDATE/DELETE_ROWS (v1/v2) add row changes with full images (decoded
  by the native ``_rowsc`` when the table has a plan, ``rowsplan``; else, or
  when it declines an event, by mysql-replication + ``values.RowEncoder``,
  with byte-identical results);
  XID (or ``COMMIT`` for non-transactional tables) closes it: it goes to the
  group pipeline (``source.pipeline``), which sends it with the transactions
  around it as one group while this thread reads on; once the group's commits
  are acknowledged, its end becomes the position to checkpoint.
* A DDL ``QUERY`` is its own transaction: everything before it is sent and
  acknowledged first (its TSOs must follow theirs), then it is applied to the
  tracked definitions (``tables.Catalog``), sent as one DDL binlog per changed
  table with the resulting TableInfo, exactly as TxnWriter's, then
  checkpointed at once.
* ROTATE moves to the next binlog file (``FLUSH BINARY LOGS``); heartbeats
  give control back while the server is idle.

Crash safety: the checkpoint (``journal.SourceState``) holds the end of the
last transaction a Pump acknowledged, plus the table definitions at that
point; it is never taken inside a TABLE_MAP/ROWS group. A restart resumes
there; transactions re-read after it are re-sent with their journaled TSOs
(equal ``(commit_ts, start_ts)``, dropped downstream as copies), or, if they
had no commit_ts yet, sent afresh after rolling the old start_ts back. The
journal module states the argument in full.

A lost connection (server restart) is retried with backoff from the last
acknowledged transaction; a purged start position, a server whose identity
changed, or a binlog setting binlake cannot use stop the source with the
setting or the way out in one line.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants import NONE_SOURCE
from pymysqlreplication.row_event import UpdateRowsEvent, WriteRowsEvent

from binlake import errors
from binlake.config import ClientSettings
from binlake.proto import binlog_pb2
from binlake.source import prewrite
from binlake.source.base import FIRST_TABLE_ID, SnapshotStopped, Source
from binlake.source.mysql import framing, rowsplan, snapshot
from binlake.source.mysql import server as srv
from binlake.source.mysql.tables import Catalog, DdlChange, TableFilter
from binlake.source.mysql.values import RowEncoder, prepare_table_map
from binlake.source.pipeline import PACE_S, GroupPipeline, Item
from binlake.source.snapshot_group import (
    Attempt,
    decided_marker,
    finished,
    part_value,
    resend_commits,
    unfinished,
)
from binlake.source.tables import SourceTable

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 10.0
# A row change's MutationType as one byte of a TableMutation's packed sequence.
_INSERTS, _UPDATES, _DELETES = bytes([binlog_pb2.INSERT]), bytes([binlog_pb2.UPDATE]), bytes([binlog_pb2.DELETE_ROW])

def parse_start(start: str | None) -> tuple[str, Any]:
    """``now`` | ``snapshot`` | ``FILE:POS`` | ``gtid:SET`` -> (kind, value)."""
    if start is None or start == "now":
        return "now", None
    if start.startswith("gtid:"):
        gtid = start[5:].strip()
        if not gtid:
            raise errors.InvalidArgument("--start gtid: needs a GTID set, e.g. gtid:0-1-42")
        return "gtid", gtid
    if start == "snapshot":
        return "snapshot", None
    file, sep, pos = start.rpartition(":")
    if not sep or not file or not pos.isdigit() or int(pos) < 4:
        raise errors.InvalidArgument(
            f"--start {start!r}: expected now, FILE:POS (e.g. binlog.000003:1234, POS >= 4), gtid:SET or snapshot"
        )
    return "pos", (file, int(pos))


class _Mutation:
    """One table's row changes in a transaction, in the order of TableMutation's fields
    (``sequence``: one MutationType value per row change, in execution order)."""

    __slots__ = ("deleted_rows", "inserted_rows", "sequence", "table_id", "updated_rows")

    def __init__(self, table_id: int) -> None:
        self.table_id = table_id
        self.inserted_rows: list[bytes] = []
        self.updated_rows: list[bytes] = []
        self.deleted_rows: list[bytes] = []
        self.sequence = bytearray()


class _Txn:
    """An upstream transaction being read: its tables' row changes (first seen first),
    serialized into its PrewriteValue once, at its end (``value``)."""

    def __init__(self) -> None:
        self.mutations: dict[int, _Mutation] = {}
        self.rows = 0

    def mut(self, table_id: int) -> _Mutation:
        m = self.mutations.get(table_id)
        if m is None:
            m = self.mutations[table_id] = _Mutation(table_id)
        return m

    def value(self, schema_version: int, native: bool) -> bytes:
        """The serialized PrewriteValue (``prewrite.prewrite_value``: natively, each row
        copied once, or through the protobuf message: the same bytes)."""
        return prewrite.prewrite_value(schema_version, [
            (m.table_id, m.inserted_rows, m.updated_rows, m.deleted_rows, bytes(m.sequence))
            for m in self.mutations.values()], native)


class MySQLSource(Source[tuple[str, int]]):
    """One source process: ``run()`` until ``stop()`` (or an error); its position is
    a binlog (file, offset)."""

    kind = "mysql"

    def __init__(self, dsn: str, *, server_id: int, registry: str, data_dir: str, start: str | None = None,
                 tables: str | None = None, status_addr: str = "127.0.0.1:0",
                 client_settings: ClientSettings | None = None, heartbeat_s: float = 1.0,
                 snapshot_batch_rows: int = snapshot.BATCH_ROWS, pace_s: float = PACE_S, max_pace_s: float | None = None,
                 snapshot_max_rows_per_s: float = 0.0) -> None:
        if not isinstance(server_id, int) or not 1 <= server_id < 2**32:
            raise errors.InvalidArgument(f"--server-id must be in 1..4294967295, got {server_id!r}")
        self.dsn = srv.parse_dsn(dsn)
        self.server_id = server_id
        self.start_kind, self.start_value = parse_start(start)
        self.filter = TableFilter(tables)
        self.heartbeat_s = heartbeat_s
        super().__init__(registry=registry, data_dir=data_dir, status_addr=status_addr,
                         client_settings=client_settings, snapshot_batch_rows=snapshot_batch_rows, pace_s=pace_s,
                         max_pace_s=max_pace_s, snapshot_max_rows_per_s=snapshot_max_rows_per_s)
        self.catalog = Catalog()
        # The acknowledged position: the end of the last transaction whose commit a
        # Pump acknowledged (every earlier one too); the checkpoint saves it, and a
        # reconnect reads on from it. The reader is ahead of it by the groups in flight.
        self.file = ""
        self.pos = 0
        self.pipeline: GroupPipeline | None = None
        self.row_changes = 0
        self.events = 0
        self.lag_s = 0.0
        self._info: srv.ServerInfo | None = None  # the server, as start_position found it
        self._encoders: dict[tuple[int, int], RowEncoder] = {}
        # Rows events decoded by the native decoder / by mysql-replication + RowEncoder.
        self.native = rowsplan.enabled()
        # Packets and event headers framed natively (``framing``); else mysql-replication reads them.
        self.native_framing = framing.enabled()
        self.native_events = 0
        self.python_events = 0
        self.on_transaction: Callable[[int, int], None] | None = None  # (start_ts, commit_ts), for tests/bench
        self.on_snapshot_part: Callable[[int], None] | None = None  # (rows) after each snapshot part, for tests

    @property
    def position(self) -> tuple[str, int]:
        return self.file, self.pos

    # ------------------------------------------------------------------ start-up
    def start_position(self) -> None:
        self._info = self._open()

    def _open(self) -> srv.ServerInfo:
        conn = self.dsn.connect()
        try:
            info = srv.check_server(conn, self.server_id)
            st = self.state.state
            if "position" in st:
                if st.get("server") != info.identity:
                    raise errors.FailedPrecondition(
                        f"the server's identity changed ({st.get('server')} -> {info.identity}) since the checkpoint "
                        f"in {self.state.dir}: its binlog positions mean something else now; start a new --data-dir "
                        "(with --start snapshot or now)"
                    )
                self.file, self.pos = st["position"]
                srv.check_position(conn, self.file, self.pos)
                self.catalog = Catalog.from_json(st["schema"])
            elif (marker := decided_marker(self.state)) is not None:
                if st.get("server") != info.identity:
                    raise errors.FailedPrecondition(
                        f"the server's identity changed ({st.get('server')} -> {info.identity}) during the snapshot "
                        f"in {self.state.dir}; start a new --data-dir"
                    )
                self._finish_snapshot(conn, marker)
            else:
                self._first_start(conn, info)
        finally:
            conn.close()
        return info

    def _first_start(self, conn: Any, info: srv.ServerInfo) -> None:
        if self.start_kind == "snapshot":
            self._take_snapshot(info)
            return
        if self.start_kind == "pos":
            self.file, self.pos = self.start_value
            srv.check_position(conn, self.file, self.pos)
        elif self.start_kind == "gtid":
            self.file, self.pos = "", 0  # learnt from the first ROTATE
        else:
            self.file, self.pos = srv.current_position(conn)
        self.catalog = load_catalog(conn, self.filter)
        st = self.state.state
        # An unfinished snapshot attempt of this data dir: ids keep growing, and its tables are replaced.
        replaced = unfinished(self.state)
        self.state.save(server=info.identity, next_table_id=int(st.get("next_table_id", FIRST_TABLE_ID)),
                        schema_version=int(st.get("schema_version", 0)))
        # Each table that exists at the start position gets a DDL binlog with its
        # definition, so schema history can decode its rows like TxnWriter's.
        assert self.emitter is not None
        for name in sorted(self.catalog.tables):
            t = self.catalog.tables[name]
            with conn.cursor() as cur:
                cur.execute(f"SHOW CREATE TABLE `{t.db}`.`{t.name}`")
                ddl = str(cur.fetchone()[1])
            self.catalog.remove(t.db, t.name)
            self._send_ddl(f"init:{self.file}:{self.pos}:{name}", ddl, DdlChange(t.db, t.name, t, None),
                           replaces=replaced.get(name))
        finished(self.state)
        self.checkpoint(force=True)

    # ------------------------------------------------------------------ snapshot
    # The protocol (``source.snapshot_group``, where its invariant is stated): each
    # table's definition marked "snapshot pending", then the rows as ordinary
    # committed transactions of at most ``snapshot_batch_rows`` rows (the lake keeps
    # flowing), then one all-or-nothing group of per-table "complete" markers, then
    # the checkpoint at the snapshot's position. A crash before the markers' decision
    # means a new attempt whose tables replace the unfinished ones (the rows read at
    # a new position); after it, the restart re-sends the markers' commits and
    # streams from the marker's position.

    def _take_snapshot(self, info: srv.ServerInfo) -> None:
        assert self.emitter is not None
        conn, self.file, self.pos = snapshot.open_snapshot(self.dsn, info.mariadb)
        attempt: Attempt | None = None
        try:
            self.catalog = load_catalog(conn, self.filter)
            ddls: dict[str, str] = {}
            with conn.cursor() as cur:
                for name, t in self.catalog.tables.items():
                    cur.execute(f"SHOW CREATE TABLE `{t.db}`.`{t.name}`")
                    ddls[name] = str(cur.fetchone()[1])
            estimate = snapshot.estimate_rows(conn, list(self.catalog.tables.values()))
            snapshot.raw_results(conn)
            st = self.state.state
            # Table ids and schema versions only grow, across attempts too (a retake's ids
            # replace the unfinished attempt's, which the lake keeps as retired).
            self.state.save(server=info.identity, next_table_id=int(st.get("next_table_id", FIRST_TABLE_ID)),
                            schema_version=int(st.get("schema_version", 0)))
            attempt = Attempt(self.emitter, self.state, self.kind, [self.file, self.pos], f"{self.file}:{self.pos}",
                              pace=self.snapshot_pace())
            attempt.on_part = self.on_snapshot_part
            progress = attempt.start_progress(len(ddls), estimate)
            for name in sorted(ddls):
                t = self.catalog.tables[name]
                self.catalog.remove(t.db, t.name)
                self._send_ddl(f"{attempt.tag}:ddl:{name}", ddls[name], DdlChange(t.db, t.name, t, None),
                               snapshot=(attempt, name))
            rows = 0
            for name in sorted(ddls):
                t = self.catalog.tables[name]
                enc = self._encoder(t)
                # The row packets encoded a batch at a time by the native encoder when it has
                # a plan for the table; else (or for a batch it declines) the Python path's
                # rows. Either way: the same row, the same bytes.
                plan = snapshot.text_plan(t, enc) if self.native else None
                parts: Iterator[list[bytes]] = (
                    (self._raw_part(plan, t, enc, raw) for raw in snapshot.raw_batches(conn, t, self.snapshot_batch_rows))
                    if plan is not None else
                    (_encode_part(t, enc, batch) for batch in snapshot.batches(conn, t, self.snapshot_batch_rows)))
                for n, encoded in enumerate(parts):
                    value = part_value(int(st["schema_version"]), t.table_id, encoded)
                    attempt.send_rows(f"{attempt.tag}:{name}:{n}", value, len(encoded))
                    rows += len(encoded)
                    self.transactions += 1
                    if self._stop.is_set():
                        # Before the markers: the tables stay pending; the next start takes them again.
                        raise SnapshotStopped
                progress.table_done()
        except BaseException:
            if attempt is not None:
                attempt.abandon_parts()
            raise
        finally:
            conn.close()  # ends the snapshot transaction (read only)
        assert attempt is not None
        for key, gone in attempt.gone(lambda: int(st["schema_version"]) + 1):
            self.emitter.emit(key, binlog_pb2.PrewriteValue(schema_version=gone.schema_version),
                              ddl=(f"-- binlake: {gone.db}.{gone.name} is gone since an unfinished snapshot", [gone]))
            st["schema_version"] = gone.schema_version
        # The markers; the snapshot marker holds the position, the definitions there.
        markers = [(name, self.catalog.tables[name].to_info()) for name in sorted(ddls)]
        n = attempt.finish(markers, position=[self.file, self.pos], schema=self.catalog.to_json(), rows=rows)
        self.transactions += n
        self.row_changes += rows
        log.info("mysql source: snapshot of %d tables, %d rows at %s:%d complete (attempt %d)", len(ddls), rows,
                 self.file, self.pos, attempt.id)
        attempt.close()
        self.checkpoint(force=True)

    @staticmethod
    def _raw_part(plan: Any, t: SourceTable, enc: RowEncoder, raw: snapshot.RawBatch) -> list[bytes]:
        encoded: list[bytes] | None = plan.rows(snapshot.payloads(raw))
        if encoded is None:  # a value the encoder does not reproduce: the Python path decides
            return _encode_part(t, enc, snapshot.packets_rows(raw, t))
        return encoded

    def _finish_snapshot(self, conn: Any, marker: dict[str, Any]) -> None:
        """Restart after the markers' decision: re-send their commits with the journaled TSOs."""
        assert self.emitter is not None
        n = resend_commits(self.emitter, marker)
        self.file, self.pos = str(marker["position"][0]), int(marker["position"][1])
        srv.check_position(conn, self.file, self.pos)
        self.catalog = Catalog.from_json(marker["schema"])
        finished(self.state)
        log.info("mysql source: snapshot at %s:%d completed after a restart (%d commits re-sent)", self.file,
                 self.pos, n)
        self.checkpoint(force=True)

    # ------------------------------------------------------------------ main loop
    def stream(self) -> None:
        info = self._info
        assert info is not None and self.emitter is not None
        log.info("mysql source %s: %s %s from %s:%d, %d tables, writer %s", self.dsn, "MariaDB" if info.mariadb
                 else "MySQL", info.version, self.file or f"gtid {self.start_value}", self.pos,
                 len(self.catalog.tables), self.emitter.writer_id)
        self.ready.set()
        backoff = 0.5
        while not self._stop.is_set():
            try:
                self._stream_once(info)
                backoff = 0.5
            except (pymysql.err.OperationalError, pymysql.err.InterfaceError, ConnectionError, OSError,
                    errors.Unavailable) as exc:
                if self._stop.is_set():
                    break
                log.warning("mysql source: connection lost (%s); reconnecting from %s:%d in %.1fs",
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__, self.file, self.pos,
                            backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                if self._stop.is_set():
                    break
                try:
                    info = self._reconnect_check()
                except errors.Unavailable:
                    continue
        with self._lock:
            self.checkpoint(force=True)

    def _reconnect_check(self) -> srv.ServerInfo:
        conn = self.dsn.connect()
        try:
            info = srv.check_server(conn, self.server_id)
            if info.identity != self.state.state.get("server"):
                raise errors.FailedPrecondition(
                    f"the server's identity changed ({self.state.state.get('server')} -> {info.identity}) while "
                    "the source was reading it; start a new --data-dir"
                )
            if self.file:
                srv.check_position(conn, self.file, self.pos)
            return info
        finally:
            conn.close()

    def _stream_once(self, info: srv.ServerInfo) -> None:
        """One replication connection, read until ``stop()`` or until it is lost."""
        kwargs: dict[str, Any] = {}
        if self.file:
            kwargs.update(log_file=self.file, log_pos=self.pos, resume_stream=True)
        else:
            kwargs.update(auto_position=self.start_value)
        stream = BinLogStreamReader(
            connection_settings=self.dsn.settings(), server_id=self.server_id, blocking=True,
            # is_mariadb only for a GTID start: with it, mysql-replication 1.0 ignores
            # log_file/log_pos and streams from the server's first binlog.
            only_events=framing.EVENTS, freeze_schema=True, is_mariadb=info.mariadb and not self.file,
            slave_heartbeat=self.heartbeat_s,
            enable_logging=False, **kwargs,
        )
        reader = framing.NativeReader(stream, burst_s=self.burst_s) if self.native_framing else None
        events = iter(reader) if reader is not None else framing.library_events(stream)
        txn: _Txn | None = None
        tables: dict[int, SourceTable | None] = {}
        plans: dict[int, Any] = {}  # binlog table id -> native plan (absent: Python path)
        # A TABLE_MAP's body -> (table, plan, mysql-replication's table): a table's maps repeat
        # byte for byte in every transaction, so each is parsed once (until a DDL or ROTATE).
        maps: dict[bytes, tuple[SourceTable | None, Any, Any]] = {}
        file = self.file
        last_progress = time.monotonic()
        events_at = 0
        assert self.emitter is not None
        pipeline = self.pipeline = GroupPipeline(self.emitter, self.acked, self.idle, pace_s=self.pace_s,
                                                 max_pace_s=self.max_pace_s, name="mysql-source-sender")
        try:
            for ev in events:
                self.events += 1
                pipeline.check()
                kind = ev[0]
                if kind in framing.ROWS:
                    t = tables.get(ev[3])
                    if t is not None:
                        txn = txn or _Txn()
                        plan = plans.get(ev[3])
                        rows = None
                        if plan is not None and ev[7] == plan.columns():
                            update = kind in framing.UPDATES
                            rows = plan.decode(ev[4], ev[5], ev[6], update, ev[8], ev[9])
                        if rows is not None:
                            self._add_rows(txn, t, kind, rows)
                            self.native_events += 1
                        else:
                            assert reader is not None
                            lib = reader.event(ev[4])
                            if lib is not None:
                                self._rows(txn, t, lib)
                elif kind == framing.TABLE_MAP or kind == framing.LIB_TABLE_MAP:
                    table_id = ev[3]
                    cached = maps.get(ev[4]) if kind == framing.TABLE_MAP else None
                    if cached is None:
                        lib = ev[4] if kind == framing.LIB_TABLE_MAP else (reader and reader.event(ev[5]))
                        if lib is None:
                            continue
                        cached = self._table_map(lib)
                        if kind == framing.TABLE_MAP:
                            maps[ev[4]] = cached
                    elif reader is not None:
                        stream.table_map[table_id] = cached[2]  # for a rows event mysql-replication parses
                    tables[table_id] = cached[0]
                    if cached[1] is None:
                        plans.pop(table_id, None)
                    else:
                        plans[table_id] = cached[1]
                elif kind == framing.LIB_ROWS:
                    t = tables.get(ev[3])
                    if t is not None:
                        txn = txn or _Txn()
                        self._rows(txn, t, ev[4], plans.get(ev[3]))
                elif kind == framing.XID:
                    self._end_txn(txn, file, ev[2], ev[1])
                    txn = None
                elif kind == framing.GTID or kind == framing.MARIADB_GTID:
                    txn = _Txn()
                elif kind == framing.QUERY:
                    q = ev[4].strip()
                    head = q.split(None, 1)[0].upper() if q else ""
                    if head == "BEGIN" or head == "XA":
                        txn = txn or _Txn()
                    elif head in ("SAVEPOINT", "RELEASE") or (head == "ROLLBACK" and " TO " in q.upper()):
                        # Inside a transaction (the rows logged are what stayed): never a checkpoint here.
                        continue
                    elif head in ("COMMIT", "ROLLBACK"):
                        # ROLLBACK ends a group whose logged rows (non-transactional tables) stay applied.
                        self._end_txn(txn, file, ev[2], ev[1])
                        txn = None
                    else:
                        txn = None  # a DDL commits implicitly
                        pipeline.drain()
                        with self._lock:
                            self._ddl(q, ev[3], file, ev[2], float(ev[1]))
                        tables.clear()
                        plans.clear()
                        maps.clear()
                elif kind == framing.ROTATE:
                    file = ev[4]
                    maps.clear()
                    if txn is None:
                        pipeline.submit(Item(None, None, (ev[4], ev[3])))
                now = time.monotonic()
                if now - last_progress >= PROGRESS_INTERVAL_S:
                    rate = (self.events - events_at) / (now - last_progress)
                    log.info("mysql source: %.0f events/s, %d transactions, %d row changes, lag %.1fs, at %s:%d, "
                             "%.1f transactions per group", rate, self.transactions, self.row_changes, self.lag_s,
                             self.file, self.pos, pipeline.grouped / max(pipeline.groups, 1))
                    last_progress, events_at = now, self.events
                if self._stop.is_set() and txn is None:
                    break
            pipeline.drain()  # a stop: what was read is sent before the final checkpoint
        finally:
            pipeline.close()
            stream.close()

    def _table_map(self, ev: Any) -> tuple[SourceTable | None, Any, Any]:
        """A TABLE_MAP (mysql-replication's event): the tracked table it names (None: not
        wanted), its native plan (None: the Python path), mysql-replication's table."""
        t = self.catalog.get(ev.schema, ev.table)
        if t is None:
            if self.filter(ev.schema, ev.table):
                raise errors.FailedPrecondition(
                    f"rows for {ev.schema}.{ev.table}, which the source has no definition of (created "
                    "with the binlog off, or before the start position without existing at start)"
                )
            return None, None, ev.get_table()
        prepare_table_map(ev, t)
        plan = rowsplan.build_plan(ev.columns, t, self._encoder(t)) if self.native else None
        return t, plan, ev.get_table()

    # ------------------------------------------------------------------ transactions
    def _add_rows(self, txn: _Txn, t: SourceTable, kind: int, rows: list[bytes]) -> None:
        m = txn.mut(t.table_id)
        if kind in framing.WRITES:
            m.inserted_rows += rows
            m.sequence += _INSERTS * len(rows)
        elif kind in framing.UPDATES:
            m.updated_rows += rows
            m.sequence += _UPDATES * len(rows)
        else:
            m.deleted_rows += rows
            m.sequence += _DELETES * len(rows)
        txn.rows += len(rows)

    def _rows(self, txn: _Txn, t: SourceTable, ev: Any, plan: Any = None) -> None:
        if plan is not None:
            rows = rowsplan.decode(plan, ev)
            if rows is not None:
                kind = (framing.WRITE_V2 if isinstance(ev, WriteRowsEvent) else
                        framing.UPDATE_V2 if isinstance(ev, UpdateRowsEvent) else framing.DELETE_V2)
                self._add_rows(txn, t, kind, rows)
                self.native_events += 1
                return
        m = txn.mut(t.table_id)
        self.python_events += 1
        enc = self._encoder(t)
        try:
            if isinstance(ev, WriteRowsEvent):
                for row in ev.rows:
                    m.inserted_rows.append(enc.encode(_values(row, "values", "none_sources")))
                    m.sequence.append(binlog_pb2.INSERT)
            elif isinstance(ev, UpdateRowsEvent):
                for row in ev.rows:
                    m.updated_rows.append(enc.encode_update(_values(row, "before_values", "before_none_sources"),
                                                            _values(row, "after_values", "after_none_sources")))
                    m.sequence.append(binlog_pb2.UPDATE)
            else:
                for row in ev.rows:
                    m.deleted_rows.append(enc.encode(_values(row, "values", "none_sources")))
                    m.sequence.append(binlog_pb2.DELETE_ROW)
            txn.rows += len(ev.rows)
        except (TypeError, ValueError) as exc:
            raise errors.FailedPrecondition(f"{t.full_name}: a value binlake cannot carry: {exc}") from None

    def _encoder(self, t: SourceTable) -> RowEncoder:
        key = (t.table_id, t.schema_version)
        enc = self._encoders.get(key)
        if enc is None:
            enc = self._encoders[key] = RowEncoder(t, t.to_info())
        return enc

    def _end_txn(self, txn: _Txn | None, file: str, pos: int, event_ts: float) -> None:
        """The transaction ends at ``file:pos`` (its XID's or COMMIT's end)."""
        assert self.pipeline is not None
        if txn is not None and txn.mutations:
            value = txn.value(int(self.state.state.get("schema_version", 0)), self.native)
            self.pipeline.submit(Item(f"{file}:{pos}", value, (file, pos), float(event_ts), txn.rows))
        else:  # nothing tracked in it: only the position moves (in order with the rest)
            self.pipeline.submit(Item(None, None, (file, pos), float(event_ts)))

    def acknowledged(self, items: list[Item], results: list[tuple[int, int]]) -> None:
        for it, (start_ts, commit_ts) in zip(items, results, strict=True):
            if it.key is None:
                continue
            self.transactions += 1
            self.row_changes += it.rows
            if self.on_transaction is not None:
                self.on_transaction(start_ts, commit_ts)
        last = items[-1]
        self.file, self.pos = last.position
        if last.event_ts:
            self.lag_s = max(0.0, time.time() - last.event_ts)

    def _ddl(self, sql: str, default_db: str, file: str, pos: int, event_ts: float | None = None) -> None:
        # The statement's start (whole seconds: a QUERY event's header has no fraction).
        when = dt.datetime.fromtimestamp(event_ts, dt.UTC).replace(tzinfo=None) if event_ts else None
        for i, change in enumerate(self.catalog.apply(sql, default_db, self.filter, when)):
            self._send_ddl(f"{file}:{pos}#{i}", sql, change)
        self.file, self.pos = file, pos
        self._dirty = True
        self.checkpoint(force=True)

    def _send_ddl(self, key: str, sql: str, ch: DdlChange, snapshot: tuple[Attempt, str] | None = None,
                  replaces: int | None = None) -> None:
        assert self.emitter is not None
        st = self.state.state
        info, version, next_id = self.table_definition(key, ch.before, ch.after, ch.truncated)
        if snapshot is not None:  # a table's first definition in a snapshot attempt: pending
            info = snapshot[0].pending(snapshot[1], info)
        elif replaces:  # the table of an unfinished snapshot attempt, replaced as by a TRUNCATE
            info.previous_table_id = replaces
        self.emitter.emit(key, binlog_pb2.PrewriteValue(schema_version=version), ddl=(sql, [info]))
        if ch.before is not None:
            self.catalog.remove(ch.before.db, ch.before.name)
        if ch.after is not None:
            self.catalog.put(ch.after)
        st["schema_version"], st["next_table_id"] = version, next_id
        self.transactions += 1
        log.info("mysql source: DDL v%d %s.%s: %s", version, info.db, info.name, sql[:120])

    def checkpoint_fields(self) -> dict[str, Any] | None:
        if not self.file:
            return None  # a GTID start before its first ROTATE: no position yet
        return {"position": [self.file, self.pos], "schema": self.catalog.to_json()}


def _values(row: dict[str, Any], key: str, nones: str) -> dict[str, Any]:
    """The row image, with an empty SET as the empty set (mysql-replication reports it
    as None, telling it apart from NULL only in the row's none-sources)."""
    values: dict[str, Any] = row[key]
    empty = [k for k, why in (row.get(nones) or {}).items() if why == NONE_SOURCE.EMPTY_SET]
    if not empty:
        return values
    return {**values, **dict.fromkeys(empty, frozenset())}


def _encode_part(t: SourceTable, enc: RowEncoder, batch: list[dict[str, Any]]) -> list[bytes]:
    """A snapshot batch's rows through the Python path."""
    try:
        return [enc.encode(r) for r in batch]
    except (TypeError, ValueError) as exc:
        raise errors.FailedPrecondition(f"{t.full_name}: a value binlake cannot carry: {exc}") from None


def load_catalog(conn: Any, wanted: TableFilter) -> Catalog:
    """The definitions of every wanted table, from ``SHOW CREATE TABLE`` (parsed like any DDL)."""
    import sqlglot

    catalog = Catalog()
    with conn.cursor() as cur:
        cur.execute("SELECT SCHEMA_NAME, DEFAULT_CHARACTER_SET_NAME FROM information_schema.SCHEMATA")
        for db, cs in cur.fetchall():
            catalog.db_charsets[str(db).lower()] = str(cs).lower()
        cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE='BASE TABLE'")
        names = [(str(d), str(n)) for d, n in cur.fetchall() if wanted(str(d), str(n))]
        for db, name in sorted(names):
            cur.execute(f"SHOW CREATE TABLE `{db}`.`{name}`")
            ddl = str(cur.fetchone()[1])
            t = catalog.create_table(sqlglot.parse_one(ddl, read="mysql"), db)  # type: ignore[arg-type]
            t.db = db
            catalog.put(t)
    return catalog
