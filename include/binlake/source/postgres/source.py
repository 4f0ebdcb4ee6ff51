"""The PostgreSQL logical-decoding source: a ``pgoutput`` stream from a
replication slot, each upstream transaction sent to the Pumps as a prewrite +
commit pair (``source.emitter``), the slot's position confirmed to the server
only after the Pump acknowledged. ``PostgresSource`` is a ``source.base.Source``
(which runs it and moves its checkpoint); its position is an LSN.

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

Transactions go to the Pumps in groups through ``source.pipeline`` (a sender
thread; this one reads on), and a changed table definition waits until
everything before it is acknowledged, as the MySQL source's DDL does.

Crash safety is the MySQL source's (see ``source.journal``): the checkpoint
holds the end LSN of the last acknowledged transaction plus the table
definitions; the slot is confirmed up to it only after the checkpoint is on
disk, so the server re-sends anything after it, and re-sent transactions get
their journaled TSOs (dropped downstream as copies).

Start (``--start``, used only while the data dir has no checkpoint): ``now``
streams from the slot (created with ``--create`` if missing); ``snapshot``
creates the slot itself with an exported snapshot and sends the rows already
there first (``postgres.snapshot`` says why its position matches; the commit
protocol is ``source.snapshot_group``'s), then streams from the slot's
consistent point. A slot that already exists is refused with ``--start
snapshot``: its snapshot was exported when it was created, and is gone.

Crash during the snapshot: before its markers' decision no table of it is
restorable (``source.snapshot_group``); the data dir records the slot it
created (``snapshot_slot``) and the restart drops that slot and takes the
snapshot again with a new one and new table ids that replace the unfinished
ones (the rows then are those of the new instant, and the stream starts there:
no hole, no copy). After the decision the restart re-sends the markers'
commits and streams from the consistent point. A checkpoint whose slot has gone is refused: the
changes since the checkpoint cannot be had any more.

Limits: column ids follow names, so a RENAME COLUMN looks like a drop plus an
add (pgoutput says nothing about renames); the primary key of a table is read
from the catalog when its RELATION arrives.

DEFAULTs: RELATION carries none, so they too are read from the catalog when a
RELATION arrives, as the catalog is *then*, not as of the change: a source
running behind sees a later SET DEFAULT early (the definition it sends for an
earlier change already has it), and a default changed twice between two
changes of the table shows only its last value. What the rows existing at an
ADD COLUMN got is read from ``pg_attribute.attmissingval``, which PostgreSQL
keeps for a non-volatile default (a constant, ``now()``: evaluated once at the
ALTER) until the table is rewritten; a volatile default (``clock_timestamp()``,
``nextval(...)``, ``random()``) is evaluated per row in a rewrite logical
decoding does not stream, so those values are unknown (read NULL downstream
until each row changes), as they are once a rewrite cleared the missing value.
"""

from __future__ import annotations

import logging
import select
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

from binlake import codec, errors
from binlake.config import ClientSettings
from binlake.proto import binlog_pb2
from binlake.source.base import FIRST_TABLE_ID, SnapshotStopped, Source
from binlake.source.pipeline import PACE_S, GroupPipeline, Item
from binlake.source.postgres import pgplan, values
from binlake.source.postgres import snapshot as snap
from binlake.source.postgres.values import UNCHANGED, Attr, Unchanged
from binlake.source.readburst import BURST_BYTES
from binlake.source.snapshot_group import (
    ATTEMPT,
    MARKER,
    Attempt,
    decided_marker,
    finished,
    part_value,
    resend_commits,
)
from binlake.source.tables import SourceTable

log = logging.getLogger(__name__)

START_KINDS = ("now", "snapshot")
# state.json key. Invariant: the slot this data dir created for a snapshot that
# has not reached its markers' decision; nothing was streamed from that slot, so a
# restart may drop it and snapshot again. Removed by the checkpoint that ends the
# snapshot (or when the source streams from the slot with --start now).
SNAPSHOT_SLOT = "snapshot_slot"
# state.json keys of the checkpoint. Invariants: ``lsn`` is the end LSN of a
# transaction whose commit a Pump acknowledged, every earlier one acknowledged
# too (the slot is confirmed only up to it); ``tables``/``oids`` are the
# definitions (relation oid -> SourceTable / column type oids) as of ``lsn``.
_CHECKPOINT_KEYS = ("lsn", "tables", "oids")
# What a snapshot attempt leaves in memory (and in a marker nobody decided).
_ATTEMPT_KEYS = (MARKER, "tables", "oids", "ddl_seen")


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

    def tuple_data(self) -> list[bytes | Unchanged | None]:
        out: list[bytes | Unchanged | None] = []
        for _ in range(self.num(2)):
            kind = self.byte()
            if kind == "n":
                out.append(None)
            elif kind == "u":
                out.append(UNCHANGED)
            else:
                out.append(self.raw(self.num(4)))
        return out


class PostgresSource(Source[int]):
    """One source process: ``run()`` until ``stop()`` (or an error); its position is
    an LSN (the end of a transaction)."""

    kind = "postgres"

    def __init__(self, dsn: str, *, slot: str, publication: str, registry: str, data_dir: str,
                 create: bool = False, start: str | None = None, snapshot_batch_rows: int = snap.BATCH_ROWS,
                 status_addr: str = "127.0.0.1:0", client_settings: ClientSettings | None = None,
                 pace_s: float = PACE_S, max_pace_s: float | None = None,
                 snapshot_max_rows_per_s: float = 0.0) -> None:
        for what, v in (("--slot", slot), ("--publication", publication)):
            if not isinstance(v, str) or not v.replace("_", "").isalnum() or not v[:1].isalpha():
                raise errors.InvalidArgument(f"{what} {v!r} must be letters, digits and _ (starting with a letter)")
        if not isinstance(dsn, str) or not dsn.startswith(("postgresql://", "postgres://")):
            raise errors.InvalidArgument(f"--dsn {dsn!r} is not a PostgreSQL URL (postgresql://USER@HOST:PORT/DB)")
        if start is not None and start not in START_KINDS:
            raise errors.InvalidArgument(f"--start {start!r}: expected now (stream from the slot) or snapshot "
                                         "(the published tables' rows first, then the slot from that snapshot)")
        self.dsn = dsn.replace("postgresql+psycopg://", "postgresql://")
        self.slot, self.publication, self.create = slot, publication, create
        self.start = start or "now"
        super().__init__(registry=registry, data_dir=data_dir, status_addr=status_addr,
                         client_settings=client_settings, snapshot_batch_rows=snapshot_batch_rows, pace_s=pace_s,
                         max_pace_s=max_pace_s, snapshot_max_rows_per_s=snapshot_max_rows_per_s)
        self.tables: dict[int, SourceTable] = {}  # relation oid -> definition
        self.oids: dict[int, list[int]] = {}  # relation oid -> column type oids
        # relation oid -> (the table version, its (table_id, schema_version), its TableInfo)
        # Per table: (version, its (table_id, schema_version), TableInfo, native plan or None).
        self._infos: dict[int, tuple[SourceTable, tuple[int, int], binlog_pb2.TableInfo, Any]] = {}
        self.native = pgplan.enabled()
        self.native_changes = 0  # row changes decoded natively / on the Python path
        self.python_changes = 0
        # The end LSN of the last acknowledged transaction (the reader is ahead by the groups in flight).
        self.lsn = 0
        self.snapshot_rows = 0
        self.on_snapshot_part: Callable[[int], None] | None = None  # (rows) after each snapshot part, for tests

    @property
    def position(self) -> int:
        return self.lsn

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

    def check_upstream(self) -> None:
        """wal_level, the slot and the publication (created when asked), REPLICA IDENTITY FULL."""
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
        has_slot = self._check_slot()  # a refusal before anything is created
        pubs = self._sql("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,))
        if not pubs:
            if not self.create:
                raise errors.FailedPrecondition(f"publication {self.publication} does not exist; create it "
                                                "(CREATE PUBLICATION ... FOR ALL TABLES) or pass --create")
            self._sql(f'CREATE PUBLICATION "{self.publication}" FOR ALL TABLES')
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
        if self._continuing():
            return
        if self.start == "snapshot":
            own = self.state.state.get(SNAPSHOT_SLOT)
            if own:  # an unfinished snapshot of this data dir: its slot served nothing
                snap.drop_own_slot(self.dsn, str(own))
            return  # the snapshot creates the slot
        if not has_slot:
            self._sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot,))

    def _continuing(self) -> bool:
        """A checkpoint (or a decided snapshot) exists: --start no longer matters."""
        return "lsn" in self.state.state or decided_marker(self.state) is not None

    def _check_slot(self) -> bool:
        """Whether the slot exists; refuses what cannot work with the slot as it is."""
        st = self.state.state
        slots = self._sql("SELECT plugin FROM pg_replication_slots WHERE slot_name = %s", (self.slot,))
        if slots and slots[0][0] != "pgoutput":
            raise errors.FailedPrecondition(f"slot {self.slot} uses plugin {slots[0][0]}, not pgoutput")
        if self._continuing():
            # The slot must be the one the checkpoint (or the snapshot) is a position in.
            if not slots:
                raise errors.FailedPrecondition(
                    f"replication slot {self.slot} is gone, but the checkpoint in {self.state.dir} continues from "
                    f"it (at {snap.format_lsn(int(st.get('lsn') or (st.get(MARKER) or {}).get('lsn', 0)))}): the "
                    "changes since then cannot be read any more; start a new --data-dir with --start snapshot")
        elif self.start == "snapshot":
            if slots and st.get(SNAPSHOT_SLOT) != self.slot:
                raise snap.refuse_existing(self.slot)
        elif not slots and not self.create:
            raise errors.FailedPrecondition(f"replication slot {self.slot} does not exist; pass --create "
                                            "(or --start snapshot to copy the rows already there first)")
        return bool(slots)

    # ------------------------------------------------------------------ main loop
    def start_position(self) -> None:
        st = self.state.state
        marker = decided_marker(self.state)
        if "lsn" not in st:
            if marker is not None:
                self._finish_snapshot(marker)
            elif self.start == "snapshot":
                self._take_snapshot()
            elif st.get(SNAPSHOT_SLOT) or st.get(MARKER) or st.get(ATTEMPT):
                # An unfinished snapshot, and now a plain start: stream from the slot as it is
                # (the unfinished tables stay pending, never restorable; ids keep growing).
                for k in (*_ATTEMPT_KEYS, SNAPSHOT_SLOT):
                    st.pop(k, None)
                finished(self.state)
                self.state.save()

    def stream(self) -> None:
        import psycopg2
        import psycopg2.extras

        st = self.state.state
        self.lsn = int(st.get("lsn", 0))
        for k, v in st.get("tables", {}).items():
            self.tables[int(k)] = SourceTable.from_json(v)
        self.oids = {int(k): v for k, v in st.get("oids", {}).items()}
        st.setdefault("next_table_id", FIRST_TABLE_ID)
        assert self.emitter is not None
        conn = psycopg2.connect(self.dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection,
                                options=values.SESSION_OPTIONS)
        cur = conn.cursor()
        cur.start_replication(slot_name=self.slot, decode=False, start_lsn=self.lsn,
                              options={"proto_version": "1", "publication_names": self.publication})
        self.ready.set()
        txn: dict[int, binlog_pb2.TableMutation] | None = None
        pipeline = GroupPipeline(self.emitter, self.acked, self.idle, pace_s=self.pace_s,
                                 max_pace_s=self.max_pace_s, name="postgres-source-sender")
        burst = 0  # bytes read since the reader last ran out (source.readburst)
        burst_s = self.burst_s
        try:
            while not self._stop.is_set():
                pipeline.check()
                msg = cur.read_message()
                if msg is None:
                    self._feedback(cur)
                    if 0 < burst < BURST_BYTES and burst_s:
                        burst = 0
                        time.sleep(burst_s)
                    else:
                        burst = 0
                        select.select([cur], [], [], 0.5)
                    continue
                burst += len(msg.payload)
                r = _Reader(msg.payload)
                kind = r.byte()
                if kind == "B":
                    txn = {}
                elif kind == "R":
                    self._relation(r, pipeline)
                elif kind in ("I", "U", "D"):
                    assert txn is not None
                    self._change(kind, r, txn)
                elif kind == "T":
                    n = r.num(4)
                    r.num(1)
                    for _ in range(n):
                        oid = r.num(4)
                        pipeline.drain()  # the new table id's DDL takes its TSOs after everything before
                        with self._lock:
                            self._truncate(oid, msg.data_start)
                elif kind == "C":
                    r.num(1)
                    r.num(8)
                    end_lsn = r.num(8)
                    if txn:
                        value = binlog_pb2.PrewriteValue(schema_version=int(st.get("schema_version", 0)),
                                                         mutations=list(txn.values()))
                        pipeline.submit(Item(f"lsn:{end_lsn}", value, end_lsn))
                    else:
                        pipeline.submit(Item(None, None, end_lsn))
                    txn = None
            pipeline.drain()
        finally:
            pipeline.close()
        with self._lock:
            self.checkpoint(force=True)
        self._feedback(cur)
        conn.close()

    def acknowledged(self, items: list[Item], results: list[tuple[int, int]]) -> None:
        self.transactions += sum(1 for it in items if it.key is not None)
        self.lsn = int(items[-1].position)

    def checkpoint_fields(self) -> dict[str, Any]:
        return {"lsn": self.lsn, "tables": {str(k): v.to_json() for k, v in self.tables.items()},
                "oids": {str(k): v for k, v in self.oids.items()}}

    def _feedback(self, cur: Any) -> None:
        # Confirm to the server only what the checkpoint holds (it may then recycle the WAL).
        saved = int(self.state.state.get("lsn", 0))
        if saved:
            cur.send_feedback(write_lsn=saved, flush_lsn=saved, reply=False)

    # ------------------------------------------------------------------ snapshot
    def _take_snapshot(self) -> None:
        """The published tables' rows as of a new slot's consistent point, by the protocol of
        ``snapshot_group`` (pending definitions, rows in ordinary transactions, one group of
        markers); then the checkpoint is that point."""
        assert self.emitter is not None
        st = self.state.state
        for k in _ATTEMPT_KEYS:  # what an earlier attempt that never reached its markers left
            st.pop(k, None)
        # Table ids and schema versions only grow, across attempts too (a retake's ids
        # replace the unfinished attempt's, which the lake keeps as retired).
        st.setdefault("next_table_id", FIRST_TABLE_ID)
        self.tables, self.oids = {}, {}
        # Recorded before the slot exists: a crash from here on leaves a slot the restart may drop.
        self.state.save(**{SNAPSHOT_SLOT: self.slot})
        reading = snap.Snapshot(self.dsn, self.slot)
        attempt: Attempt | None = None
        try:
            reading.open()
            try:
                published = reading.tables(self.publication)
                reading.lock(published)
                attempt = Attempt(self.emitter, self.state, self.kind, reading.lsn, snap.format_lsn(reading.lsn),
                                  pace=self.snapshot_pace())
                attempt.on_part = self.on_snapshot_part
                progress = attempt.start_progress(len(published), reading.estimate_rows(published))
                for pt in published:
                    cols = values.columns(pt.ns, pt.name, pt.attrs)
                    values.set_defaults(cols, pt.defaults, None)
                    self._define(pt.oid, pt.ns, pt.name, cols, [a.type_oid for a in pt.attrs], pt.primary_key,
                                 key=f"{attempt.tag}:ddl:{pt.oid}", snapshot=attempt)
                for pt in published:
                    self._snapshot_table(reading, pt, attempt)
                    progress.table_done()
            finally:
                reading.close()  # ends the snapshot transaction (read only)
        except BaseException:
            if attempt is not None:
                attempt.abandon_parts()
            self._abandon_snapshot(reading.created)
            raise
        assert attempt is not None
        # From here a failure keeps the slot (recorded in snapshot_slot): after the markers'
        # decision the restart streams from it; before, it drops it and takes the snapshot again.
        for key, gone in attempt.gone(lambda: int(st["schema_version"]) + 1):
            self.emitter.emit(key, binlog_pb2.PrewriteValue(schema_version=gone.schema_version), ddl=(
                f"-- binlake: {gone.db}.{gone.name} is gone since an unfinished snapshot", [gone]))
            st["schema_version"] = gone.schema_version
        markers = [(f"{pt.ns}.{pt.name}", self.tables[pt.oid].to_info()) for pt in published]
        n = attempt.finish(markers, lsn=reading.lsn, tables={str(k): v.to_json() for k, v in self.tables.items()},
                           oids={str(k): v for k, v in self.oids.items()})
        self.transactions += n
        log.info("postgres source: snapshot of %d tables, %d rows at %s complete (attempt %d)", len(published),
                 self.snapshot_rows, snap.format_lsn(reading.lsn), attempt.id)
        attempt.close()
        st.pop(SNAPSHOT_SLOT, None)
        self.lsn = reading.lsn
        self.checkpoint(force=True)

    def _abandon_snapshot(self, created: bool) -> None:
        """Before the markers' decision the snapshot's tables are pending (none restorable):
        drop the slot this attempt created, so a refused or stopped start holds no WAL. The
        attempt record stays: the next snapshot replaces its tables."""
        try:
            if created:
                snap.drop_own_slot(self.dsn, self.slot, wait_s=5.0)
            # Not created (e.g. someone else's slot of that name): never ours to drop later either.
            self.state.state.pop(SNAPSHOT_SLOT, None)
            self.state.save()
        except Exception as exc:  # the restart drops it: still recorded in snapshot_slot
            log.warning("postgres source: slot %s of the unfinished snapshot left for the next start: %s",
                        self.slot, exc)

    def _snapshot_table(self, reading: snap.Snapshot, pt: snap.PublishedTable, attempt: Attempt) -> None:
        t, oids = self.tables[pt.oid], self.oids[pt.oid]
        info = t.to_info()
        # COPY's lines, encoded a chunk at a time by the native decoder, when it has a plan
        # for the table; else (or for a chunk it declines) the rows the stream's Python
        # path decodes. Either way: the same row, the same bytes.
        plan = pgplan.build_plan(t, oids, info) if self.native and reading.copyable() else None
        parts: Iterator[list[bytes]] = (
            (self._copy_part(plan, t, oids, info, chunk) for chunk in reading.copy_chunks(pt, self.snapshot_batch_rows))
            if plan is not None else
            (self._encode_part(t, oids, info, batch) for batch in reading.batches(pt, self.snapshot_batch_rows)))
        for n, rows in enumerate(parts):
            send = part_value(int(self.state.state["schema_version"]), t.table_id, rows)
            attempt.send_rows(f"{attempt.tag}:{pt.oid}:{n}", send, len(rows))
            self.snapshot_rows += len(rows)
            self.transactions += 1
            if self._stop.is_set():
                raise SnapshotStopped

    def _copy_part(self, plan: Any, t: SourceTable, oids: list[int], info: binlog_pb2.TableInfo,
                   chunk: bytes) -> list[bytes]:
        rows: list[bytes] | None = plan.copy_rows(chunk)
        if rows is None:  # a value the decoder does not reproduce: the Python path decides
            return self._encode_part(t, oids, info, snap.copy_line_texts(chunk))
        return rows

    @staticmethod
    def _encode_part(t: SourceTable, oids: list[int], info: binlog_pb2.TableInfo,
                     batch: list[tuple[str | None, ...]]) -> list[bytes]:
        try:
            # The very functions the stream decodes a tuple with: the same row, the same bytes.
            return [codec.encode_row(values.decode_row(t, oids, r), info) for r in batch]
        except (TypeError, ValueError) as exc:
            raise errors.FailedPrecondition(f"{t.full_name}: {exc}") from None

    def _finish_snapshot(self, marker: dict[str, Any]) -> None:
        """Restart after the markers' decision: re-send their commits with the journaled TSOs."""
        assert self.emitter is not None
        n = resend_commits(self.emitter, marker)
        st = self.state.state
        finished(self.state)
        st.pop(SNAPSHOT_SLOT, None)
        self.state.save(**{k: marker[k] for k in _CHECKPOINT_KEYS})
        log.info("postgres source: snapshot at %s completed after a restart (%d commits re-sent)",
                 snap.format_lsn(int(marker["lsn"])), n)

    # ------------------------------------------------------------------ messages
    def _relation(self, r: _Reader, pipeline: GroupPipeline | None = None) -> None:
        oid = r.num(4)
        ns, name = r.text(), r.text()
        ident = r.byte()
        attrs: list[Attr] = []
        for _ in range(r.num(2)):
            r.num(1)
            attrs.append(Attr(r.text(), r.num(4), r.num(4)))
        cols = values.columns(ns, name, attrs)
        if ident != "f":
            raise errors.FailedPrecondition(
                f"table {ns}.{name} has REPLICA IDENTITY {ident!r}, not FULL: updates and deletes would carry no "
                f"old image; run ALTER TABLE {ns}.{name} REPLICA IDENTITY FULL"
            )
        old = self.tables.get(oid)
        # Read on every RELATION (sent once per table per session, and again after a change to
        # the table): SET DEFAULT changes no column, and only the catalog tells it.
        pk, defaults = self._catalog(oid)
        values.set_defaults(cols, defaults, old)
        if old is not None and old.name == name and old.db == ns and values.shape(cols) == values.shape(old.columns) \
                and values.default_shape(cols) == values.default_shape(old.columns):
            return  # re-sent unchanged (a new session, or a change that does not touch the columns)
        if pipeline is not None:
            pipeline.drain()  # the DDL binlog takes its TSOs after everything before it
        with self._lock:
            self._define(oid, ns, name, cols, [a.type_oid for a in attrs], pk,
                         key=f"rel:{oid}:{len(self.state.state.get('ddl_seen', []))}")

    def _catalog(self, oid: int) -> tuple[list[str], dict[str, snap.ColumnDefaultText]]:
        """The table's primary key and column DEFAULTs, from the catalog as it is now
        (RELATION carries neither; see the module doc for what that cannot know)."""
        import psycopg2

        conn = psycopg2.connect(self.dsn, options=values.SESSION_OPTIONS)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                return snap.primary_key(cur, oid), snap.column_defaults(cur, oid)
        finally:
            conn.close()

    def _define(self, oid: int, ns: str, name: str, cols: list[Any], oids: list[int], pk: list[str], key: str,
                snapshot: Attempt | None = None) -> None:
        """A table's (new) definition: its DDL binlog, then the source decodes its rows with it."""
        new = values.table(ns, name, cols, pk)
        old = self.tables.get(oid)
        if old is not None:
            new.column_ids = {k: v for k, v in old.column_ids.items() if any(c.name == k for c in cols)}
        what = "CREATE TABLE" if old is None else "ALTER TABLE"
        self._ddl(oid, new, old, f"-- {what} {ns}.{name} ({', '.join(f'{c.name} {c.kind}' for c in cols)})",
                  key=key, snapshot=snapshot)
        self.oids[oid] = oids

    def _ddl(self, oid: int, new: SourceTable | None, old: SourceTable | None, sql: str, key: str,
             truncate: bool = False, snapshot: Attempt | None = None) -> None:
        assert self.emitter is not None
        st = self.state.state
        info, version, next_id = self.table_definition(key, old, new, truncate)
        if snapshot is not None:  # a table's first definition in a snapshot attempt: pending
            info = snapshot.pending(f"{info.db}.{info.name}", info)
        self.emitter.emit(key, binlog_pb2.PrewriteValue(schema_version=version), ddl=(sql, [info]))
        st["schema_version"], st["next_table_id"] = version, next_id
        st.setdefault("ddl_seen", []).append(key)
        if new is not None:
            self.tables[oid] = new
        self._dirty = True
        log.info("postgres source: DDL v%d %s.%s", version, info.db, info.name)

    @staticmethod
    def _native_change(kind: str, r: _Reader, m: binlog_pb2.TableMutation, plan: Any) -> bool:
        """The change's tuple(s) through the native decoder (``pgplan``); False, with
        ``r`` where it was, when the decoder declines them (the Python path reads them)."""
        at = r.i
        k = r.d[at:at + 1]
        if kind == "U":
            if k not in (b"O", b"K"):
                return False  # the Python path refuses an update without its old image
            got = plan.update(r.d, at + 1)
            if got is None:
                return False
            m.updated_rows.append(got[0])
            m.sequence.append(binlog_pb2.UPDATE)
        else:
            got = plan.row(r.d, at + 1)
            if got is None:
                return False
            if kind == "I":
                m.inserted_rows.append(got[0])
                m.sequence.append(binlog_pb2.INSERT)
            else:
                m.deleted_rows.append(got[0])
                m.sequence.append(binlog_pb2.DELETE_ROW)
        r.i = got[1]
        return True

    def _truncate(self, oid: int, lsn: int) -> None:
        old = self.tables.get(oid)
        if old is None:
            return
        new = SourceTable.from_json(old.to_json())
        self._ddl(oid, new, old, f"TRUNCATE TABLE {old.db}.{old.name}", key=f"truncate:{oid}:{lsn}", truncate=True)

    def _change(self, kind: str, r: _Reader, txn: dict[int, binlog_pb2.TableMutation]) -> None:
        oid = r.num(4)
        t = self.tables[oid]
        oids = self.oids[oid]
        # The TableInfo the rows are encoded against, built once per table version (a DDL
        # puts a new SourceTable in self.tables), not once per row change (measured: a tenth
        # of the source's CPU on small transactions).
        cached = self._infos.get(oid)
        if cached is None or cached[0] is not t or cached[1] != (t.table_id, t.schema_version):
            info = t.to_info()
            plan = pgplan.build_plan(t, oids, info) if self.native else None
            cached = self._infos[oid] = (t, (t.table_id, t.schema_version), info, plan)
        info, plan = cached[2], cached[3]

        def row(vals: list[bytes | Unchanged | None]) -> dict[str, Any]:
            return values.decode_row(t, oids, vals)

        m = txn.get(t.table_id)
        if m is None:
            m = txn[t.table_id] = binlog_pb2.TableMutation(table_id=t.table_id)
        if plan is not None and self._native_change(kind, r, m, plan):
            self.native_changes += 1
            return
        self.python_changes += 1
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
