"""The commit protocol of a source's initial snapshot: every part of it (one
DDL binlog per table, then the rows as insert transactions) is prewritten
first, then all of them are decided in ONE journal line, then committed.

Why all-or-nothing: a snapshot that is half served would be a silent hole (the
rows of the other half are in neither the snapshot nor the log after its
position). With one decision for the whole group, a crash leaves either

* nothing decided: the journal's load rolls every start_ts back (the Pumps
  learn it through TxnStatus), nothing was ever served, and the source takes
  a new snapshot; or
* everything decided: the ``snapshot`` marker in ``state.json`` names the
  keys, and the restart re-sends their commits with the journaled
  ``(start_ts, commit_ts)`` (copies the reader drops), then streams from the
  marker's position.

The marker is written to the checkpoint just before the decision; a marker
whose keys are not decided is a crash between the two and means "nothing".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.source.emitter import Emitter
from binlake.source.journal import SourceState

# state.json key of the marker. Invariant: present only between the save just
# before the group's decision and the checkpoint that follows its commits; its
# "keys" are the group's [key, start_ts, pump] in commit order, and every other
# field is what the source needs to continue from the snapshot's position.
MARKER = "snapshot"

log = logging.getLogger(__name__)


class SnapshotGroup:
    """The prewritten parts of one snapshot, in the order they will commit."""

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


def decided_marker(state: SourceState) -> dict[str, Any] | None:
    """The marker of a snapshot whose parts were decided (the restart finishes it), else None."""
    marker = state.state.get(MARKER)
    if not marker:
        return None
    keys = marker.get("keys") or []
    # Decided in one journal line: the first key stands for all.
    if keys and state.decision(str(keys[0][0])) is None:
        return None
    return dict(marker)


def resend_commits(emitter: Emitter, marker: dict[str, Any]) -> int:
    """After a restart past the decision: send every part's commit again (same TSOs)."""
    keys = marker.get("keys") or []
    for key, _start, _pump in keys:
        emitter.emit(str(key), binlog_pb2.PrewriteValue())  # decided: re-sends only the commit
    return len(keys)
