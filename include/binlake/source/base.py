"""The Source interface: what a source that reads an existing database's change
log implements, and the run every source shares.

A source backs up a database without touching its application: it reads the
database's own log (the MySQL/MariaDB row binlog, PostgreSQL's logical
decoding) and sends each upstream transaction to the Pumps as a prewrite +
commit pair with TSOs taken in log order. What is the same for every source
lives in the framework beside this module:

* ``emitter.Emitter``: the two binlogs of a transaction through the PumpClient,
  its registration as a ``writer``, and the TxnStatus service the Pumps ask
  about a prewrite whose commit never came (answered from the journal);
* ``journal.SourceState``: the ``--data-dir`` (the TSO journal, so a re-read
  transaction is sent with the same timestamps, and the checkpoint,
  ``state.json``);
* ``pipeline.GroupPipeline``: the reader thread hands finished transactions to
  a sender thread, which sends them in groups and calls back once a group's
  commits are acknowledged;
* ``snapshot_group``: the protocol of an initial snapshot (rows in ordinary
  transactions, tables pending until one all-or-nothing group of markers);
* ``tables``: the table definitions (``SourceTable``) a source tracks and sends
  as DDL binlogs;
* ``Source`` below: the process's life (``run`` until ``stop``), the
  checkpoint moved as groups are acknowledged, and the identity (table id,
  schema version, column ids) of each definition a DDL binlog carries.

A new source is one module with a subclass of ``Source`` and one with its
command line (``commands.SourceCommand``), listed in ``commands.SOURCES``.
The subclass sets ``kind`` (its name: the command ``binlake source KIND``, its
writer id's prefix, its log lines) and implements:

* ``start_position()``: fix where the stream starts. With a checkpoint in
  ``self.state`` (or a snapshot whose markers were decided: finish it,
  ``snapshot_group.resend_commits``), continue there; on a first start,
  ``--start``: the log from now, or an initial snapshot (the rows already
  there, sent through ``snapshot_group``, then the log from the snapshot's
  position; ``SnapshotStopped`` when ``stop()`` interrupts it before its
  markers);
* ``stream()``: read the log from the acknowledged position until ``stop()``,
  handing each finished transaction (its key: its position in the log, which
  never changes) to a ``GroupPipeline`` made with ``self.acked`` and
  ``self.idle``; a definition change waits until everything before it is
  acknowledged (``pipeline.drain``) and is sent as a DDL binlog with the
  resulting TableInfo (``table_definition`` gives it its identity); set
  ``self.ready`` once streaming;
* ``acknowledged(items, results)``: a group's commits are acknowledged: move
  the acknowledged position to the end of its last item;
* ``checkpoint_fields()``: what ``state.json`` holds at the acknowledged
  position (the position, the definitions as of it);
* ``position``: the acknowledged position (the source's own type: a binlog
  file and offset, an LSN).

and may implement ``check_upstream()``: checks and set-up on the upstream
before the source registers with the registry and the Pumps.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from typing import Any, ClassVar, Generic, TypeVar

from binlake import errors
from binlake.config import ClientSettings
from binlake.proto import binlog_pb2
from binlake.source import rowpace
from binlake.source.emitter import Emitter
from binlake.source.journal import SourceState
from binlake.source.pipeline import PACE_S, Item, check_steps
from binlake.source.readburst import read_burst_s
from binlake.source.tables import SourceTable, assign_ids

# The table id of the first table a source defines (TxnWriter starts at the same).
FIRST_TABLE_ID = 100
# Checkpoint at least this often while transactions flow (and at every DDL):
# a longer gap only means more transactions re-read (and deduplicated) after a crash.
CHECKPOINT_INTERVAL_S = 1.0

P = TypeVar("P")


class SnapshotStopped(Exception):
    """stop() during the snapshot, before its markers."""


class Source(abc.ABC, Generic[P]):
    """One source process: ``run()`` until ``stop()`` (or an error). ``P``: the type
    of a position in the upstream log. See the module doc for what a subclass implements."""

    kind: ClassVar[str]

    def __init__(self, *, registry: str, data_dir: str, status_addr: str = "127.0.0.1:0",
                 client_settings: ClientSettings | None = None, snapshot_batch_rows: int,
                 pace_s: float = PACE_S, max_pace_s: float | None = None,
                 snapshot_max_rows_per_s: float = 0.0) -> None:
        # A subclass checks its own arguments first: the data dir is locked last.
        if isinstance(snapshot_batch_rows, bool) or not isinstance(snapshot_batch_rows, int) or snapshot_batch_rows < 1:
            raise errors.InvalidArgument(f"--snapshot-batch-rows must be a positive number, got {snapshot_batch_rows!r}")
        self.snapshot_batch_rows = snapshot_batch_rows
        self.snapshot_max_rows_per_s = rowpace.check_rate(snapshot_max_rows_per_s)
        self.pace_s, self.max_pace_s = check_steps(pace_s, max_pace_s)
        self.burst_s = read_burst_s()  # source.readburst; a bad BINLAKE_READ_BURST_MS is refused here
        self.registry_addr = registry
        self._status_addr, self._client_settings = status_addr, client_settings
        self._stop = threading.Event()
        # Set once the start position is fixed (the snapshot, if any, sent) and the log streams.
        self.ready = threading.Event()
        self.emitter: Emitter | None = None
        # Held while the checkpoint is written (sender thread) and while a definition
        # changes (reader thread), so a checkpoint never sees half a change.
        self._lock = threading.Lock()
        self.transactions = 0
        self._dirty = False
        self._last_save = 0.0
        self._log = logging.getLogger(type(self).__module__)
        self.state = SourceState(data_dir)

    def stop(self) -> None:
        self._stop.set()

    def snapshot_pace(self) -> rowpace.RowPace:
        """The pace of a snapshot attempt's row parts (``--snapshot-max-rows-per-s``); a stop ends its waits."""
        return rowpace.RowPace(self.snapshot_max_rows_per_s, self._stop)

    # ------------------------------------------------------------------ what a source implements
    def check_upstream(self) -> None:
        """Checks and set-up on the upstream before registering (default: none)."""

    @abc.abstractmethod
    def start_position(self) -> None:
        """Fix where the stream starts: the checkpoint, a decided snapshot finished, or
        ``--start`` on a first start (an initial snapshot raises ``SnapshotStopped`` on stop)."""

    @abc.abstractmethod
    def stream(self) -> None:
        """Read the log from the acknowledged position until ``stop()``; set ``ready``."""

    @abc.abstractmethod
    def acknowledged(self, items: list[Item], results: list[tuple[int, int]]) -> None:
        """Sender thread, under the lock: a group's commits are acknowledged (``results``:
        each item's (start_ts, commit_ts)); move the acknowledged position past it."""

    @abc.abstractmethod
    def checkpoint_fields(self) -> dict[str, Any] | None:
        """The ``state.json`` fields at the acknowledged position (None: no position yet)."""

    @property
    @abc.abstractmethod
    def position(self) -> P:
        """The acknowledged position: the end of the last transaction whose commit a Pump
        acknowledged (every earlier one too)."""

    # ------------------------------------------------------------------ the run every source shares
    def run(self) -> None:
        try:
            self.check_upstream()
            self.emitter = Emitter(self.registry_addr, self.state, kind=self.kind, status_addr=self._status_addr,
                                   client_settings=self._client_settings)
        except BaseException:
            self.state.close()
            raise
        try:
            try:
                self.start_position()
            except SnapshotStopped:
                self._log.info("%s source: stopped during the snapshot; no table of it is restorable yet, the "
                               "next start takes it again", self.kind)
                return
            self.stream()
        finally:
            self.emitter.close()
            self.state.close()

    def acked(self, items: list[Item], results: list[tuple[int, int]]) -> None:
        """Sender thread: a group's commits are acknowledged; the position moves past it."""
        with self._lock:
            self.acknowledged(items, results)
            self._dirty = True
            self.checkpoint()

    def idle(self) -> None:
        """Sender thread, nothing to send for a moment: save a checkpoint still due."""
        with self._lock:
            self.checkpoint(force=self._dirty)

    def table_definition(self, key: str, before: SourceTable | None, after: SourceTable | None,
                         truncated: bool = False) -> tuple[binlog_pb2.TableInfo, int, int]:
        """The TableInfo the DDL binlog KEY carries for a table going from ``before`` to
        ``after`` (None: created, dropped; ``truncated``: a new table id whose previous is
        the old one), with the schema version and the next table id after it; ``after``
        gets its identity (``tables.assign_ids``). The caller sends it and then saves the
        two numbers in ``self.state``."""
        assert self.emitter is not None
        st = self.state.state
        version = int(st.get("schema_version", 0)) + 1
        next_id = int(st.get("next_table_id", FIRST_TABLE_ID))
        decided = self.emitter.ddl_decision(key)
        if after is None:
            assert before is not None
            info = before.to_info()
            info.dropped = True
            info.schema_version = version
        else:
            if before is None or truncated:
                tid, next_id = next_id, next_id + 1
            else:
                tid = before.table_id
            assign_ids(after, before, tid, version)
            info = after.to_info()
            if truncated and before is not None:
                info.previous_table_id = before.table_id
        if decided:
            # Sent before a crash: the copy downstream has these definitions; keep them.
            info = decided[0]
            version = info.schema_version
            next_id = max(next_id, info.table_id + 1)
            if after is not None:
                after.table_id, after.schema_version = info.table_id, info.schema_version
                after.column_ids = {c.name: c.id for c in info.columns}
                after.next_column_id = info.next_column_id
        return info, version, next_id

    def checkpoint(self, force: bool = False) -> None:
        """Save the checkpoint: when ``force``d, else when something moved and
        CHECKPOINT_INTERVAL_S passed since the last save. The caller holds the lock
        (or is the only thread)."""
        now = time.monotonic()
        if not force and (not self._dirty or now - self._last_save < CHECKPOINT_INTERVAL_S):
            return
        fields = self.checkpoint_fields()
        if fields is None:
            return
        self.state.save(**fields)
        self._last_save = now
        self._dirty = False
