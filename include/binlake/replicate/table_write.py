"""Writing one batch's changes to the target, and checking the target against the log.

A table's changes (commit order, or already one final change per key) are
written in the caller's transaction: deletes of the keys that go away or
change, then inserts of the final rows (PostgreSQL and SQLite in normal mode
straight from Arrow; safe mode deletes every touched key, then upserts). A
table without a key takes each change on its own.

Normal mode checks the target: a key the batch deletes or updates must be
there, a key it inserts must not. A mismatch raises ``Mismatch`` inside the
transaction; after the rollback ``diagnose`` looks at the target and names the
table and key in a ``TargetDiverged``. Used by both apply modes (``consistent``
in this process, ``parallel`` in its worker threads).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.replicate import arrowcompact, causality, compactor
from binlake.replicate.compactor import INSERT, Change
from binlake.sql import targets


class TargetDiverged(errors.Conflict):
    """The target does not hold what the log says it must (changed by hand)."""



def key_names(info: binlog_pb2.TableInfo) -> list[str]:
    """The columns a table's changes are keyed by: its primary key, else its first
    unique key of NOT NULL columns, else none (a keyless table)."""
    by_id = {c.id: c.name for c in info.columns}
    pk = [by_id[i] for i in info.primary_key]
    if pk:
        return pk
    for uk in info.unique_keys:
        cols = [c for c in info.columns if c.id in uk.column_ids]
        if cols and all(not c.nullable for c in cols):
            return [by_id[i] for i in uk.column_ids]
    return []


def table_keys(info: binlog_pb2.TableInfo) -> causality.TableKeys:
    """The keys ``causality`` groups a table's changes by."""
    by_id = {c.id: c.name for c in info.columns}
    return causality.TableKeys(tuple(key_names(info)),
                               tuple((k.name, tuple(by_id[i] for i in k.column_ids)) for k in info.unique_keys))


def write_changes(target: targets.Target, conn: Connection, info: binlog_pb2.TableInfo,
                  changes: Sequence[Change] | arrowcompact.Compacted, safe: bool, compacted: bool = False) -> int:
    """Write one table's changes (commit order) in the caller's transaction; rows written.
    ``compacted``: the changes already are one final change per key (``rawcompact``,
    or an ``arrowcompact.Compacted``, which is always final)."""
    if isinstance(changes, arrowcompact.Compacted):
        if not safe and key_names(info):
            return _write_compacted(target, conn, info, changes)
        changes, compacted = changes.changes(), True
    key = key_names(info)
    if not key:
        return _write_keyless(target, conn, info, changes)
    final = list(changes) if compacted else compactor.compact(changes, key)
    gone = [c for c in final if c.op != INSERT]
    rows = [c.after for c in final if c.after is not None]

    def k(image: dict[str, Any] | None) -> tuple[Any, ...]:
        assert image is not None
        return tuple(image[c] for c in key)

    if safe:
        # Every key the batch touches, including those compaction cancels out (an
        # insert then a delete): the target may hold any of them already.
        touched = {k(image): None for c in changes for image in (c.before, c.after) if image is not None}
        keys = list(touched)
        target.delete_keys(conn, info, keys)
        target.upsert_rows(conn, info, rows)
        return len(keys) + len(rows)
    keys = [k(c.before) for c in gone]
    deleted = target.delete_keys(conn, info, keys)
    if deleted != len(keys):
        raise Mismatch(info, keys, [k(c.after) for c in final if c.op == INSERT])
    try:
        target.insert_rows(conn, info, rows)
    except sa.exc.IntegrityError as exc:
        raise Mismatch(info, keys, [k(c.after) for c in final if c.op == INSERT], errors.first_line(exc)) from None
    except Exception as exc:  # psycopg raises its own UniqueViolation from COPY
        if type(exc).__name__ in ("UniqueViolation", "IntegrityError"):
            raise Mismatch(info, keys, [k(c.after) for c in final if c.op == INSERT], str(exc).splitlines()[0]) \
                from None
        raise
    return len(keys) + len(rows)


def _write_compacted(target: targets.Target, conn: Connection, info: binlog_pb2.TableInfo,
                 final: arrowcompact.Compacted) -> int:
    """Compacted final changes, normal mode: the deletes of their keys, then the final
    rows straight from Arrow when every column has an Arrow form (``insert_arrow``:
    PostgreSQL one COPY of CSV written by Arrow; SQLite one prepared INSERT over the
    columns' values; DuckDB an insert from the Arrow table; the others their
    multi-row INSERTs); otherwise decoded a slice at a time (``final_rows``), so the
    Python values held are one slice's, never the batch's."""
    rows = final.rows_table()
    write_rows: Callable[[], int] = (
        functools.partial(target.insert_arrow, conn, info, rows) if rows is not None else
        functools.partial(target.insert_rows, conn, info, final.final_rows()))
    return write_final(target, conn, info, final.gone_keys(), final.insert_keys, write_rows)


def write_final(target: targets.Target, conn: Connection, info: binlog_pb2.TableInfo, keys: list[tuple[Any, ...]],
                 insert_keys: Callable[[], list[tuple[Any, ...]]], write_rows: Callable[[], int]) -> int:
    """Final changes of one table (one per key): delete ``keys`` (each must be
    there), then ``write_rows`` (none of ``insert_keys`` may be there); rows written.
    A target that does not match raises ``Mismatch``."""
    deleted = target.delete_keys(conn, info, keys)
    if deleted != len(keys):
        raise Mismatch(info, keys, insert_keys())
    try:
        n = write_rows()
    except sa.exc.IntegrityError as exc:
        raise Mismatch(info, keys, insert_keys(), errors.first_line(exc)) from None
    except Exception as exc:  # psycopg raises its own UniqueViolation from COPY
        if type(exc).__name__ in ("UniqueViolation", "IntegrityError"):
            raise Mismatch(info, keys, insert_keys(), str(exc).splitlines()[0]) from None
        raise
    return len(keys) + n


def _write_keyless(target: targets.Target, conn: Connection, info: binlog_pb2.TableInfo,
                   changes: Sequence[Change]) -> int:
    """A table without a key: each change on its own, in commit order."""
    n = 0
    for c in changes:
        if c.before is not None:
            n += target.delete_one(conn, info, c.before)
        if c.after is not None:
            n += target.insert_rows(conn, info, [c.after])
    return n


class Mismatch(Exception):
    """Normal mode found the target not as the log says (diagnosed after rollback)."""

    def __init__(self, info: binlog_pb2.TableInfo, must_exist: list[tuple[Any, ...]],
                 must_not_exist: list[tuple[Any, ...]], detail: str = "") -> None:
        super().__init__(info.name)
        self.info, self.must_exist, self.must_not_exist, self.detail = info, must_exist, must_not_exist, detail


def diagnose(target: targets.Target, m: Mismatch, where: str,
             kept: str = "nothing of the window was committed") -> TargetDiverged:
    """What ``m`` found, looked up in the target (after the rollback) and named; ``kept`` says
    what of the window stays in the target (consistent mode: nothing; parallel mode: the
    buckets other workers committed, which a rerun skips)."""
    key = key_names(m.info)

    def show(t: tuple[Any, ...]) -> str:
        return ", ".join(f"{c}={v!r}" for c, v in zip(key, t, strict=True))

    with target.engine.connect() as conn:
        have_old = target.existing_keys(conn, m.info, m.must_exist) if m.must_exist else set()
        have_new = target.existing_keys(conn, m.info, m.must_not_exist) if m.must_not_exist else set()
    norm = {tuple(str(v) for v in t) for t in have_old}
    missing = [t for t in m.must_exist if tuple(str(v) for v in t) not in norm]
    norm_new = {tuple(str(v) for v in t) for t in have_new}
    extra = [t for t in m.must_not_exist if tuple(str(v) for v in t) in norm_new]
    if missing:
        what = f"the row with key {show(missing[0])} that {where} updates or deletes is not in the target"
    elif extra:
        what = f"the row with key {show(extra[0])} that {where} inserts is already in the target"
    else:
        what = f"{where} cannot be written: {m.detail or 'row counts differ'}"
    more = len(missing) + len(extra) - 1
    return TargetDiverged(
        f"target table {m.info.name}: {what}" + (f" (and {more} more)" if more > 0 else "") +
        "; the target was changed outside binlake (`binlake diff` shows how); " + kept +
        ". Repair the target (diff --fix-sql), or rerun with safe mode (safe_mode_until_ts)")
