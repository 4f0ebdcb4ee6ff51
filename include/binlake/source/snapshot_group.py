"""The protocol of a source's initial snapshot: rows sent in bounded, ordinary
committed transactions, the tables "snapshot pending" until one all-or-nothing
group of per-table markers completes them.

An attempt (``Attempt``), in order:

1. **Begin**: the attempt record (``ATTEMPT`` in ``state.json``: its number,
   the upstream position P the rows are read at, the table ids it defines) is
   saved. Each table's definition goes out as an ordinary committed DDL binlog
   (``Emitter.emit``) whose TableInfo has ``snapshot_pending`` set.
2. **Rows**: each batch of at most ``snapshot_batch_rows`` rows is an ordinary
   committed transaction, pipelined one deep (``Emitter.step``): one step
   decides and commits the part before and prewrites this one, so a part costs
   one TSO call, one journal line and one Pump batch, not two of each, and the
   last part is decided before the markers (``flush``; a paced snapshot
   commits each part before its pace's wait). The cluster holds at
   most one part pending at a time, so the Pumps' safe ts move, other writers'
   windows are ingested while the snapshot runs, and its parts spread over as
   many windows as it takes. A part prewritten when the snapshot stops or fails
   is rolled back at once (``abandon_parts``); after a kill -9 it is an orphan
   the restart rolls back (``source.journal``).
3. **End**: one DDL binlog per table with the same definition and
   ``snapshot_pending`` unset (the table's "snapshot complete" marker; the
   query is a comment, its definition equal to the table's: the apply has
   nothing to do). The markers are one ``SnapshotGroup``: prewritten, the
   ``MARKER`` saved in ``state.json``, decided in ONE journal line, committed.
   Then the checkpoint moves to P and the attempt record goes, so the stream
   from P commits after every marker.

Invariant (the promise "never served half"): a table whose newest definition at
a ts is snapshot-pending does not exist at that ts for any reader of the lake
(``lake.decoding.schema_history``: ``knows`` is False, yet its rows decode);
it exists from its marker's commit_ts on, when every row of the snapshot is
below (committed before the marker group was prewritten) and every change after
P above (streamed after the markers' commit).

Crash (kill -9 anywhere):

* before the markers' decision: the rows sent are in the lake under table ids
  that never completed. The restart takes the snapshot again as a NEW attempt:
  new table ids, each TableInfo naming the aborted attempt's id of its table
  as ``previous_table_id`` (as TRUNCATE does: the old id is retired at the new
  definition's commit_ts, so its rows never count, and the apply truncates
  the table it made); a table of the aborted attempt that is gone upstream is
  dropped. Table ids and schema versions only grow across attempts.
* after the decision: the ``MARKER`` names the markers' keys; the restart
  re-sends their commits with the journaled ``(start_ts, commit_ts)`` (copies
  the reader drops), then streams from the marker's position.

A marker whose keys are not decided is a crash between its save and the
decision and means "not decided": a new attempt.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from binlake import errors, failpoint
from binlake.proto import binlog_pb2
from binlake.source import prewrite
from binlake.source.emitter import Emitter, Prewritten
from binlake.source.journal import SourceState
from binlake.source.rowpace import RowPace

# state.json key of the marker. Invariant: present only between the save just
# before the markers' decision and the checkpoint that follows their commits; its
# "keys" are the markers' [key, start_ts, pump] in commit order, and every other
# field is what the source needs to continue from the snapshot's position.
MARKER = "snapshot"
# state.json key of the attempt record: {"id": N, "position": P, "tables": {name:
# [table_id, db, table]}, "previous": {name: [table_id, db, table]}} ("previous":
# what aborted attempts defined and no later one replaced). Present from the
# attempt's begin to the checkpoint at P.
ATTEMPT = "snapshot_attempt"
# The progress file in the data dir (``binlake ctl snapshot-progress`` reads it).
PROGRESS = "snapshot_progress.json"
# Progress goes to the log and the progress file at most this often.
PROGRESS_INTERVAL_S = 5.0

log = logging.getLogger(__name__)

def part_value(schema_version: int, table_id: int, rows: list[bytes]) -> bytes:
    """A row part's serialized PrewriteValue: one table's rows (serialized Rows), all
    inserts, written natively when built (``prewrite``: the protobuf message costs
    more than reading and encoding the row)."""
    return prewrite.prewrite_value(schema_version, [(table_id, rows, [], [], bytes([binlog_pb2.INSERT]) * len(rows))],
                                   native=True)


class SnapshotGroup:
    """The prewritten parts of one all-or-nothing group (the markers), in commit order."""

    def __init__(self, emitter: Emitter, state: SourceState) -> None:
        self.emitter = emitter
        self.state = state
        self.items: list[tuple[str, int, str]] = []

    def prewrite(self, key: str, value: binlog_pb2.PrewriteValue,
                 ddl: tuple[str, Sequence[binlog_pb2.TableInfo]] | None = None) -> None:
        """Phase one of part KEY: journaled start_ts, prewrite acknowledged by a Pump."""
        start_ts, pump = self.emitter.prewrite(key, value, ddl)
        self.items.append((key, start_ts, pump))

    def abandon(self) -> None:
        """Before the decision (a stop, a refusal): roll every part back now. Journaled first
        (TxnStatus answers "rolled back" from then on), then a ROLLBACK binlog to each part's
        Pump, so its safe ts moves on without waiting to ask a source that is going away."""
        for _key, start_ts, _pump in self.items:
            self.state.abandon(start_ts)
        for _key, start_ts, pump in self.items:
            try:
                self.emitter.client.write_rollback(binlog_pb2.Binlog(tp=binlog_pb2.ROLLBACK, start_ts=start_ts),
                                                   pump)
            except errors.BinlakeError as exc:  # the Pump asks TxnStatus after its txn timeout instead
                log.warning("snapshot: rollback of start_ts %d not sent to pump %s: %s", start_ts, pump, exc)
        self.items.clear()

    def commit(self, **marker: Any) -> list[int]:
        """Save the marker (with ``marker``'s fields), decide every part at once, commit each.
        Returns the commit_ts in order; the caller then moves its checkpoint and drops the marker."""
        self.state.save(**{MARKER: {**marker, "keys": [list(i) for i in self.items]}})
        return self.emitter.commit_group(self.items)


class Progress:
    """How far a snapshot has got: tables done of total, rows and bytes sent, the rate,
    and the time left from the upstream's estimate of its rows. ``report`` logs it and
    writes it to ``PROGRESS`` in the data dir (atomically) at most every
    ``PROGRESS_INTERVAL_S``."""

    def __init__(self, state: SourceState, kind: str, attempt: int, tables: int, estimate_rows: int,
                 max_rows_per_s: float = 0.0) -> None:
        self.state, self.kind, self.attempt = state, kind, attempt
        self.max_rows_per_s = max_rows_per_s  # the pace in force (``source.rowpace``; 0: none)
        self.tables, self.estimate = tables, max(0, estimate_rows)
        self.tables_done = self.rows = self.bytes = 0
        self.started = time.monotonic()
        self._last = 0.0
        self.done = False

    def add(self, rows: int, nbytes: int) -> None:
        self.rows += rows
        self.bytes += nbytes
        self.report()

    def table_done(self) -> None:
        self.tables_done += 1
        self.report()

    def figures(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.rows / elapsed
        left = max(self.estimate - self.rows, 0)
        eta = None if self.done else (left / rate if rate > 0 and self.estimate else None)
        return {"source": self.kind, "attempt": self.attempt, "state": "done" if self.done else "running",
                "tables_done": self.tables_done, "tables": self.tables, "rows": self.rows,
                "rows_estimate": self.estimate, "bytes": self.bytes, "elapsed_s": round(elapsed, 1),
                "rows_per_s": round(rate, 1), "max_rows_per_s": self.max_rows_per_s,
                "mb_per_s": round(self.bytes / elapsed / 1e6, 2),
                "eta_s": None if eta is None else round(eta, 1), "updated_at": time.time()}

    def report(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < PROGRESS_INTERVAL_S:
            return
        self._last = now
        f = self.figures()
        log.info("%s source: snapshot %s: %d/%d tables, %d of ~%d rows, %.1f MB, %.0f rows/s%s, %.2f MB/s%s",
                 self.kind, f["state"], f["tables_done"], f["tables"], f["rows"], f["rows_estimate"],
                 f["bytes"] / 1e6, f["rows_per_s"],
                 f" (paced at {self.max_rows_per_s:.0f})" if self.max_rows_per_s else "", f["mb_per_s"],
                 f", about {f['eta_s']:.0f}s left" if f["eta_s"] is not None else "")
        path = self.state.dir / PROGRESS
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(f))
        os.replace(tmp, path)


class Attempt:
    """One attempt at a source's initial snapshot (see the module doc): its DDLs and row
    parts go out as ordinary transactions, its markers as one ``SnapshotGroup``."""

    def __init__(self, emitter: Emitter, state: SourceState, kind: str, position: Any, tag: str,
                 pace: RowPace | None = None) -> None:
        self.emitter, self.state, self.kind = emitter, state, kind
        self.pace = pace if pace is not None else RowPace(0)
        # The row part prewritten and not yet decided (at most one): the next step decides it.
        self._inflight: list[Prewritten] = []
        prev = state.state.get(ATTEMPT) or {}
        # What aborted attempts defined: this attempt's table of the same name replaces it.
        self.previous: dict[str, list[Any]] = {**prev.get("previous", {}), **prev.get("tables", {})}
        self.id = int(prev.get("id", 0)) + 1
        _ids_above(state, self.previous)
        self.tables: dict[str, list[Any]] = {}
        self.tag = f"snap{self.id}:{tag}"
        self.progress: Progress | None = None
        # Called after each row part is acknowledged (its rows): tests slow a snapshot with it.
        self.on_part: Callable[[int], None] | None = None
        state.save(**{ATTEMPT: {"id": self.id, "position": position, "tables": {}, "previous": self.previous}})
        if self.previous:
            log.info("%s source: an earlier snapshot attempt was not completed; attempt %d takes it again (its "
                     "%d table(s) replace the unfinished ones)", kind, self.id, len(self.previous))

    def start_progress(self, tables: int, estimate_rows: int) -> Progress:
        self.progress = Progress(self.state, self.kind, self.id, tables, estimate_rows, self.pace.rate)
        self.progress.report(force=True)
        return self.progress

    def pending(self, name: str, info: binlog_pb2.TableInfo) -> binlog_pb2.TableInfo:
        """The TableInfo of table NAME's first DDL in this attempt: ``info`` marked pending,
        replacing the aborted attempts' table of that name. Saved in the attempt record
        BEFORE the caller sends it: a crash after the send leaves an id the retake replaces
        (one never sent is replaced harmlessly: no rows, no table downstream)."""
        out = binlog_pb2.TableInfo()
        out.CopyFrom(info)
        out.snapshot_pending = True
        old = self.previous.get(name)
        if old is not None:
            out.previous_table_id = int(old[0])
        self.tables[name] = [info.table_id, info.db, info.name]
        rec = dict(self.state.state[ATTEMPT])
        rec["tables"] = dict(self.tables)
        self.state.save(**{ATTEMPT: rec})
        return out

    def send_rows(self, key: str, value: bytes, rows: int) -> None:
        """One row part (``part_value``): an ordinary transaction, prewritten (acknowledged) before
        this returns and committed with the next part's step, or by ``flush`` (at once when
        the snapshot is paced)."""
        raw = len(value)
        # Taken first: if the step fails after its journal line decided the part before, that
        # part is decided (never abandoned: a Pump asking is answered "committed").
        inflight, self._inflight = self._inflight, []
        _commit_ts, out = self.emitter.step(inflight, [(key, value)])
        self._inflight = [p for p in out if isinstance(p, Prewritten)]  # not one decided before (re-sent)
        failpoint.hit("source-snapshot-part")
        if self.progress is not None:
            self.progress.add(rows, raw)
        if self.pace.rate or self.on_part is not None:
            # A part waits pending only while the next one is read and encoded: before a
            # pace's wait (or a test's hook, which sees committed parts) it is committed
            # now, so no Pump's safe ts waits for the snapshot's pace.
            self.flush()
        if self.on_part is not None:
            self.on_part(rows)
        self.pace.after(rows)

    def flush(self) -> None:
        """Decide and commit the row part still prewritten, if any (before the drops and markers)."""
        if self._inflight:
            inflight, self._inflight = self._inflight, []
            self.emitter.step(inflight, [])

    def abandon_parts(self) -> None:
        """The snapshot stops or fails before its markers: roll back the part still prewritten
        (journaled first, then a ROLLBACK to its Pump), so no Pump's safe ts waits for it."""
        if self._inflight:
            inflight, self._inflight = self._inflight, []
            self.emitter.abandon(inflight)

    def gone(self, next_version: Callable[[], int]) -> list[tuple[str, binlog_pb2.TableInfo]]:
        """(key, TableInfo) of a drop for each table an aborted attempt defined that this
        one does not (gone upstream since), each with its schema version from ``next_version``.
        Every row part is committed first."""
        self.flush()
        out = []
        for name, (tid, db, tbl) in sorted(self.previous.items()):
            if name not in self.tables:
                info = binlog_pb2.TableInfo(table_id=int(tid), db=str(db), name=str(tbl), dropped=True,
                                            schema_version=next_version())
                out.append((f"{self.tag}:gone:{name}", info))
        return out

    def finish(self, markers: Sequence[tuple[str, binlog_pb2.TableInfo]], **marker: Any) -> int:
        """The end: drops of what is gone (ordinary DDLs), then every table's marker (its
        pending definition unmarked, replacing nothing) decided in one group; returns the
        number of markers. The caller then moves its checkpoint to the position."""
        self.flush()
        group = SnapshotGroup(self.emitter, self.state)
        try:
            for key, info in markers:
                done = binlog_pb2.TableInfo()
                done.CopyFrom(info)
                done.snapshot_pending = False
                done.previous_table_id = 0
                group.prewrite(f"{self.tag}:done:{key}", binlog_pb2.PrewriteValue(schema_version=done.schema_version),
                               ddl=(f"-- binlake: initial snapshot of {done.db}.{done.name} complete", [done]))
        except BaseException:
            group.abandon()
            raise
        group.commit(**marker)
        if self.progress is not None:
            self.progress.done = True
            self.progress.report(force=True)
        return len(group.items)

    def close(self) -> None:
        """After the checkpoint at the position: the attempt and its marker are over."""
        self.state.state.pop(MARKER, None)
        self.state.state.pop(ATTEMPT, None)


def decided_marker(state: SourceState) -> dict[str, Any] | None:
    """The marker of a snapshot whose markers were decided (the restart finishes it), else None."""
    marker = state.state.get(MARKER)
    if not marker:
        return None
    keys = marker.get("keys") or []
    # Decided in one journal line: the first key stands for all.
    if keys and state.decision(str(keys[0][0])) is None:
        return None
    return dict(marker)


def resend_commits(emitter: Emitter, marker: dict[str, Any]) -> int:
    """After a restart past the decision: send every marker's commit again (same TSOs)."""
    keys = marker.get("keys") or []
    for key, _start, _pump in keys:
        emitter.emit(str(key), binlog_pb2.PrewriteValue())  # decided: re-sends only the commit
    return len(keys)


def finished(state: SourceState) -> None:
    """A snapshot finished (or given up for a start without one): the attempt record and
    marker go with the checkpoint the caller saves next."""
    state.state.pop(MARKER, None)
    state.state.pop(ATTEMPT, None)


def unfinished(state: SourceState) -> dict[str, int]:
    """A start without a snapshot on a data dir whose snapshot attempt never completed:
    name -> table id of each table it left pending (the caller's first definition of
    that name replaces it, as a TRUNCATE does). The caller drops the record
    (``finished``) with the checkpoint it saves once those definitions are sent."""
    rec = state.state.get(ATTEMPT) or {}
    left = {**rec.get("previous", {}), **rec.get("tables", {})}
    _ids_above(state, left)
    return {name: int(v[0]) for name, v in left.items()}


def _ids_above(state: SourceState, tables: dict[str, list[Any]]) -> None:
    """Table ids only grow: the next one is above every id an unfinished attempt took (its
    record is saved before each DDL, the source's ``next_table_id`` only after some)."""
    if tables:
        state.state["next_table_id"] = max(int(state.state.get("next_table_id", 0)),
                                           max(int(v[0]) for v in tables.values()) + 1)


def read_progress(data_dir: str) -> dict[str, Any]:
    """The progress file of a source's data dir (``binlake ctl snapshot-progress``)."""
    path = os.path.join(data_dir, PROGRESS)
    try:
        with open(path, encoding="utf-8") as f:
            return dict(json.load(f))
    except FileNotFoundError:
        raise errors.NotFound(f"no snapshot progress in {data_dir}: the source there never took a snapshot "
                              "(--start snapshot), or this is not its --data-dir") from None
    except (OSError, ValueError) as exc:
        raise errors.FailedPrecondition(f"{path} is unreadable: {exc}") from None
