"""Schema history: every table definition with the commit_ts from which it is in force.

Rows in a binlog are column id -> typed datum; turning them into named images
needs the table definition in force when the transaction committed, which is
what ``SchemaHistory`` answers (built from DDL transactions or ``ddl_history`` rows).

Snapshot-pending definitions (``TableInfo.snapshot_pending``): a source's initial
snapshot sends each table's definition marked pending, then the rows as ordinary
transactions, then the same definition unmarked (the "complete" marker). Invariant
kept here: a table whose definition in force at a ts is pending *decodes*
(``table``, ``defined``: its rows were written with it) but does not *exist*
(``knows`` is False, so ``restore.rebuild.tables_at`` and every restore, snapshot,
history, drill and undo that asks it leaves the table out): a half-sent snapshot
is never served. ``pending`` says which case a table is in, and
``restorable_from`` the first ts at which a table of that name exists again.
"""

from __future__ import annotations

import base64
import bisect
import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, cast

from google.protobuf.message import DecodeError

from binlake import errors, tso
from binlake.lake.decoding.rows import check_ts
from binlake.lake.decoding.txn import CorruptBinlogError
from binlake.proto import binlog_pb2


class UnknownTableError(errors.FailedPrecondition):
    """A row change names a table id the schema history has no definition for at
    its commit_ts. Decoding never drops such a change silently."""

    def __init__(self, message: str, table_id: int, commit_ts: int) -> None:
        super().__init__(message)
        self.table_id = table_id
        self.commit_ts = commit_ts


@dataclasses.dataclass(frozen=True)
class _Version:
    commit_ts: int
    info: binlog_pb2.TableInfo | None  # None: the id was retired (TRUNCATE gave the table a new id)
    why: str = ""


class SchemaHistory:
    """Every table definition with the commit_ts from which it is in force.

    ``table(table_id, commit_ts)`` is the definition a transaction committed at
    ``commit_ts`` was written with: the newest one whose DDL committed strictly
    before it. Definitions added without a commit_ts (``from_tables``) count as
    in force since 0. DDLs may be added in any order; lookups always see them in
    commit_ts order.
    """

    def __init__(self) -> None:
        self._versions: dict[int, list[_Version]] = {}
        self._ts: dict[int, list[int]] = {}

    # -- building
    @classmethod
    def from_tables(cls, tables: Iterable[binlog_pb2.TableInfo], commit_ts: int = 0) -> SchemaHistory:
        """A history holding ``tables`` as in force since ``commit_ts`` (default 0)."""
        history = cls()
        for info in tables:
            history.add(commit_ts, info)
        return history

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any] | Any]) -> SchemaHistory:
        """A history from ``ddl_history`` rows (mappings or Spark Rows with
        ``commit_ts`` and ``table_info``); rows without a table definition are skipped."""
        history = cls()
        for row in rows:
            get = row.get if isinstance(row, Mapping) else row.__getitem__
            raw = get("table_info")
            if raw:
                history.add(cast(int, get("commit_ts")), _parse_table(bytes(raw), f"ddl_history row at {get('commit_ts')}"))
        return history

    def apply(self, ddl: binlog_pb2.Binlog) -> None:
        """Add the table definition a DDL transaction carries (as of its commit_ts).
        A DDL without a definition changes nothing."""
        if not isinstance(ddl, binlog_pb2.Binlog):
            raise TypeError(f"apply takes a Binlog, got {type(ddl).__name__}")
        if not ddl.ddl_query:
            raise ValueError(f"transaction start_ts {ddl.start_ts} is not a DDL (no ddl_query)")
        if ddl.HasField("ddl_table"):
            self.add(ddl.commit_ts, ddl.ddl_table)

    def add(self, commit_ts: int, info: binlog_pb2.TableInfo) -> None:
        """Record ``info`` as in force from ``commit_ts`` on (TRUNCATE also retires
        the id it replaced; a dropped table resolves to an error afterwards)."""
        check_ts("commit_ts", commit_ts)
        if not isinstance(info, binlog_pb2.TableInfo):
            raise TypeError(f"expected a TableInfo, got {type(info).__name__}")
        if info.table_id <= 0:
            raise ValueError(f"table definition {info.db}.{info.name} has no table id")
        copy = binlog_pb2.TableInfo()
        copy.CopyFrom(info)
        self._insert(info.table_id, _Version(commit_ts, copy))
        if info.previous_table_id:
            why = f"replaced by table id {info.table_id} (TRUNCATE {info.db}.{info.name})"
            self._insert(info.previous_table_id, _Version(commit_ts, None, why))

    def _insert(self, table_id: int, version: _Version) -> None:
        stamps = self._ts.setdefault(table_id, [])
        versions = self._versions.setdefault(table_id, [])
        # After any equal commit_ts, so re-adding the same DDL keeps the later copy.
        pos = bisect.bisect_right(stamps, version.commit_ts)
        if pos and stamps[pos - 1] == version.commit_ts and versions[pos - 1].info == version.info:
            return  # the same definition again (a DDL read twice): nothing new
        stamps.insert(pos, version.commit_ts)
        versions.insert(pos, version)

    # -- lookups
    def table(self, table_id: int, commit_ts: int | None = None) -> binlog_pb2.TableInfo:
        """The definition of ``table_id`` a transaction committed at ``commit_ts`` used
        (the newest when ``commit_ts`` is None). Raises UnknownTableError naming the
        table when there is none, it was dropped, or TRUNCATE retired the id."""
        if isinstance(table_id, bool) or not isinstance(table_id, int):
            raise TypeError(f"table_id must be an integer, got {type(table_id).__name__}")
        at = tso.MAX_TS if commit_ts is None else check_ts("commit_ts", commit_ts)
        stamps = self._ts.get(table_id)
        # Formatted only for an error (a lazy text): the lookup is on every change's path.
        when = _When(commit_ts)
        if not stamps:
            raise UnknownTableError(
                f"table id {table_id}{when} has no definition in the schema history "
                "(its CREATE TABLE is in no DDL the history holds)", table_id, at)
        # Definitions whose DDL committed strictly before ``at`` (a DDL is alone in its transaction).
        pos = bisect.bisect_left(stamps, at) if commit_ts is not None else len(stamps)
        if pos == 0:
            first = self._versions[table_id][0]
            raise UnknownTableError(
                f"table id {table_id}{when} has no definition yet: its first DDL in the history "
                f"committed later, at {tso.format_ts(first.commit_ts)}", table_id, at)
        version = self._versions[table_id][pos - 1]
        if version.info is None:
            raise UnknownTableError(
                f"table id {table_id}{when} no longer exists: {version.why} at {tso.format_ts(version.commit_ts)}",
                table_id, at)
        if version.info.dropped:
            raise UnknownTableError(
                f"table id {table_id} ({version.info.db}.{version.info.name}){when} was dropped at "
                f"{tso.format_ts(version.commit_ts)}", table_id, at)
        return version.info

    def defined(self, table_id: int, commit_ts: int | None = None) -> bool:
        """Whether ``table`` has a definition to decode ``table_id``'s rows at ``commit_ts``
        with (a snapshot-pending one included)."""
        try:
            self.table(table_id, commit_ts)
        except UnknownTableError:
            return False
        return True

    def knows(self, table_id: int, commit_ts: int | None = None) -> bool:
        """Whether the table exists at ``commit_ts``: defined, and not while its initial
        snapshot is still being sent (see the module doc)."""
        try:
            return not self.table(table_id, commit_ts).snapshot_pending
        except UnknownTableError:
            return False

    def pending(self, table_id: int, commit_ts: int | None = None) -> bool:
        """Whether ``table_id``'s definition at ``commit_ts`` is snapshot-pending."""
        try:
            return self.table(table_id, commit_ts).snapshot_pending
        except UnknownTableError:
            return False

    def restorable_from(self, db: str, name: str, after_ts: int) -> int | None:
        """The first commit_ts above ``after_ts`` of a definition of table ``db.name`` that is
        neither pending nor a drop (its snapshot's marker, when the history holds it)."""
        found = [v.commit_ts for versions in self._versions.values() for v in versions
                 if v.info is not None and v.commit_ts > after_ts and v.info.db == db and v.info.name == name
                 and not v.info.snapshot_pending and not v.info.dropped]
        return min(found) if found else None

    def table_ids(self) -> list[int]:
        return sorted(self._versions)

    def entries(self) -> Iterator[tuple[int, binlog_pb2.TableInfo]]:
        """Every (commit_ts, definition) added, in commit_ts order per table id."""
        for table_id in sorted(self._versions):
            for v in self._versions[table_id]:
                if v.info is not None and v.info.table_id == table_id:
                    yield v.commit_ts, v.info

    def entries_of(self, table_id: int) -> list[tuple[int, binlog_pb2.TableInfo]]:
        """``entries()`` of one table id (without walking every table: restores of
        thousands of tables ask this per table)."""
        return [(v.commit_ts, v.info) for v in self._versions.get(table_id, ())
                if v.info is not None and v.info.table_id == table_id]

    def snapshot(self, at_ts: int) -> SchemaHistory:
        """A smaller history that answers every lookup at ``commit_ts >= at_ts`` the
        same: per table, the definition in force at ``at_ts`` plus everything later."""
        check_ts("at_ts", at_ts)
        out = SchemaHistory()
        for table_id in self._versions:
            stamps, versions = self._ts[table_id], self._versions[table_id]
            pos = bisect.bisect_left(stamps, at_ts)
            keep = versions[max(0, pos - 1):]
            out._versions[table_id] = list(keep)
            out._ts[table_id] = [v.commit_ts for v in keep]
        return out

    def __len__(self) -> int:
        return sum(len(v) for v in self._versions.values())

    # -- transport (the data source receives the history as an option string)
    def to_json(self) -> str:
        """Text form: a JSON list of ``[commit_ts, base64(TableInfo)]``."""
        return json.dumps([[ts, base64.b64encode(info.SerializeToString()).decode()] for ts, info in self.entries()],
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> SchemaHistory:
        if not isinstance(text, str):
            raise TypeError(f"schema history text must be a str, got {type(text).__name__}")
        try:
            items = json.loads(text) if text.strip() else []
            pairs = [(int(ts), base64.b64decode(raw, validate=True)) for ts, raw in items]
        except (ValueError, TypeError) as exc:
            raise errors.InvalidArgument(
                f"schema history is not a JSON list of [commit_ts, base64 TableInfo]: {exc}") from None
        history = cls()
        for ts, raw in pairs:
            history.add(ts, _parse_table(raw, f"schema history entry at {ts}"))
        return history


class _When:
    """`` at commit_ts ...`` for an error message, formatted only when shown."""

    __slots__ = ("commit_ts",)

    def __init__(self, commit_ts: int | None) -> None:
        self.commit_ts = commit_ts

    def __format__(self, spec: str) -> str:
        return "" if self.commit_ts is None else f" at commit_ts {tso.format_ts(self.commit_ts)}"


def _parse_table(raw: bytes, what: str) -> binlog_pb2.TableInfo:
    try:
        info: binlog_pb2.TableInfo = binlog_pb2.TableInfo.FromString(raw)
    except DecodeError as exc:
        raise CorruptBinlogError(f"{what}: not a serialized TableInfo: {exc}") from None
    return info

