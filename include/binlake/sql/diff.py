"""Compare two databases table by table, chunk by chunk, in the manner of
sync-diff-inspector: split each table by ranges of its key, and match each
range's rows on the two sides by key and row hash.

Values are normalised by ``binlake.sql.checksum`` (canonical text per type, the
same row hash), so a SQLite source and a PostgreSQL target holding the same
rows compare equal, and a table is OK here exactly when the table checksums
of both sides agree. Because the checksum must be the same on every dialect,
it is computed by this process over the streamed rows, not by SQL functions.

Chunks are ranges of the key in the source's order: ``[first key of chunk i,
first key of chunk i+1)``; the same range is read from the target. Should the
two databases order keys differently (different collations), a row may fall in
another chunk on one side: keys reported missing on one side and extra on the
other with the same row hash are reconciled at the end, so that never shows as
a difference. Where the two orders disagree so far that a target row falls in two
of the ranges, or in none (a case-insensitive collation against a binary one),
it is reported as extra or missing: compare such tables by a key whose order both
share, or with the same collation on both sides.

Memory holds one chunk of source rows and one batch of target rows, never a
table: the target's rows of a chunk's range are streamed and matched against
the chunk by row hash (which covers the key); a row on one side only goes to a
spill file on disk (SQLite, with the fix statement it needs when ``--fix-sql``
asks), where keys on both sides are told apart from rows that two collations put
in different chunks, once the table is read. The report keeps exact counts and
the first ``keep_keys`` keys of each kind; fix
statements stream from the spill to their file (a table's deletes before its
inserts), and a table missing in the target streams its rows' INSERTs
straight there.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sqlite3
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from binlake import config, errors
from binlake.proto import binlog_pb2
from binlake.sql import checksum, targets
from binlake.sql.url import check_reachable, reader_engine

OK, DIFF, MISSING = "OK", "DIFF", "MISSING"
_SHOW_KEYS = 10
# Target rows fetched at a time while a chunk's range streams in.
_TARGET_BATCH = 2_000


@dataclasses.dataclass
class TableDiff:
    """One table's outcome. Keys are column name -> canonical text of the value."""

    name: str
    status: str  # OK | DIFF | MISSING (the table is on one side only)
    source_rows: int = 0
    target_rows: int = 0
    chunks: int = 0
    chunks_differing: int = 0
    # The first ``keep_keys`` keys of each kind (in key order); the counts are exact.
    only_in_source: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    only_in_target: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    differing: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    missing_count: int = 0
    extra_count: int = 0
    differing_count: int = 0
    note: str = ""

    def line(self) -> str:
        head = f"{self.name:<32} {self.status:<8} source {self.source_rows:>9,} rows  target {self.target_rows:>9,} rows"
        if self.status == MISSING:
            return f"{head}  ({self.note})"
        if self.status == DIFF:
            head += (f"  ({self.missing_count} missing in target, {self.extra_count} extra, "
                     f"{self.differing_count} different; {self.chunks_differing}/{self.chunks} chunks)")
        return head


@dataclasses.dataclass
class DiffReport:
    source: str
    target: str
    tables: list[TableDiff]
    fix_statements: int = 0

    @property
    def ok(self) -> bool:
        return all(t.status == OK for t in self.tables)

    def summary(self) -> str:
        lines = [f"diff {self.source} -> {self.target}"]
        for t in self.tables:
            lines.append("  " + t.line())
            for label, keys, count in (("missing", t.only_in_source, t.missing_count),
                                       ("extra", t.only_in_target, t.extra_count),
                                       ("different", t.differing, t.differing_count)):
                shown = keys[:_SHOW_KEYS]  # fewer when the report kept fewer (keep_keys)
                for k in shown:
                    lines.append(f"      {label:<9} {_show_key(k)}")
                if count > len(shown):
                    lines.append(f"      ... {count - len(shown)} more {label}")
        bad = sum(t.status != OK for t in self.tables)
        lines.append(f"{len(self.tables)} table(s): " + ("all OK" if not bad else f"{bad} differ"))
        if self.fix_statements:
            lines.append(f"{self.fix_statements} fix statement(s) written")
        return "\n".join(lines)


def _show_key(key: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in key.items())


def diff_databases(source_url: str, target_url: str, tables: Sequence[str] | None = None,
                   chunk_size: int = 10_000, fix_sql: str | None = None, keep_keys: int | None = None
                   ) -> DiffReport:
    """Compare every table (or ``tables``) of ``source_url`` with ``target_url``.
    With ``fix_sql``, write the statements that make the target equal to that file.
    ``keep_keys``: how many differing keys of each kind a table's report lists
    (default ``[memory] diff_keys``; the counts are exact whatever it is)."""
    if keep_keys is None:
        keep_keys = config.memory().diff_keys
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise errors.InvalidArgument(f"chunk size must be a positive integer, got {chunk_size!r}")
    if isinstance(keep_keys, bool) or not isinstance(keep_keys, int) or keep_keys < 0:
        raise errors.InvalidArgument(f"keep_keys must be a count of keys (0 or more), got {keep_keys!r}")
    if tables is not None and (isinstance(tables, str) or not all(isinstance(t, str) and t for t in tables)):
        raise errors.InvalidArgument(f"tables must be a list of table names, got {tables!r}")
    src_engine = _engine(source_url, "source")
    tgt_engine = _engine(target_url, "target")
    fixes = _Fixes(fix_sql, f"-- statements that make {_show(tgt_engine)} equal to {_show(src_engine)}\n")
    try:
        src_schema = _schema(source_url, src_engine)
        tgt_schema = _schema(target_url, tgt_engine)
        with src_engine.connect() as src, tgt_engine.connect() as tgt:
            for c in (src, tgt):
                level = targets.kind(c.dialect.name).snapshot_isolation
                if level is not None:
                    c.execution_options(isolation_level=level)
            src_names = [n for n in sa.inspect(src).get_table_names() if not n.startswith(targets.INTERNAL_PREFIX)]
            tgt_names = [n for n in sa.inspect(tgt).get_table_names() if not n.startswith(targets.INTERNAL_PREFIX)]
            if tables:
                unknown = [t for t in tables if t not in src_names and t not in tgt_names]
                if unknown:
                    raise errors.InvalidArgument(
                        f"no table(s) {', '.join(unknown)} in either database "
                        f"(source has: {', '.join(sorted(src_names)) or 'none'})")
                wanted = list(dict.fromkeys(tables))
            else:
                wanted = sorted(set(src_names) | set(tgt_names))
            results = []
            for name in wanted:
                if name not in tgt_names:
                    results.append(TableDiff(name, MISSING, note="not in the target"))
                    src_t = _typed(src, name, src_schema.get(name))
                    results[-1].source_rows = src.execute(sa.select(sa.func.count()).select_from(src_t)).scalar_one()
                    if name in src_schema and fixes.wanted:
                        for stmt in _kind(tgt_engine).create_table_sql(tgt_engine, src_schema[name]):
                            fixes.write(stmt + ";")
                        rows = src.execution_options(yield_per=chunk_size).execute(sa.select(src_t))
                        for r in rows:
                            fixes.write(_insert_sql(tgt_engine, name, dict(r._mapping)))
                    continue
                if name not in src_names:
                    tgt_t = _typed(tgt, name, tgt_schema.get(name))
                    n = tgt.execute(sa.select(sa.func.count()).select_from(tgt_t)).scalar_one()
                    results.append(TableDiff(name, MISSING, target_rows=n, note="not in the source"))
                    fixes.write(f"DROP TABLE {_q(tgt_engine, name)};")
                    continue
                # A source without binlake's definitions (a MariaDB/PostgreSQL upstream followed by
                # a source) is read with the target's, when its columns are the same: values then
                # compare by type (a JSON document, not its text as the upstream kept it).
                results.append(_diff_table(src, tgt, name, src_schema.get(name) or tgt_schema.get(name),
                                           tgt_schema.get(name), chunk_size, fixes, tgt_engine, keep_keys))
    except sa.exc.OperationalError as exc:
        raise errors.Unavailable(f"diff: {errors.first_line(exc)}") from None
    finally:
        fixes.close()
        src_engine.dispose()
        tgt_engine.dispose()
    return DiffReport(_show(src_engine), _show(tgt_engine), results, fix_statements=fixes.count)


def _engine(url: str, what: str) -> sa.Engine:
    engine = reader_engine(url)
    check_reachable(engine, f"the {what}")
    return engine


def _show(engine: sa.Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def _q(engine: sa.Engine, name: str) -> str:
    return engine.dialect.identifier_preparer.quote(name)


def _schema(url: str, engine: sa.Engine) -> dict[str, binlog_pb2.TableInfo]:
    """binlake's table definitions in the database (the upstream writer's or the sink's)."""
    return checksum.load_schema(engine.url.render_as_string(hide_password=False))


def _typed(conn: Connection, name: str, info: binlog_pb2.TableInfo | None) -> sa.Table:
    """binlake's Table for ``info`` when the stored table has exactly its columns, else reflected."""
    if info is not None:
        stored = set(targets.kind(conn.dialect.name).column_names(conn, name))
        if stored == {c.name for c in info.columns}:
            renamed = binlog_pb2.TableInfo()
            renamed.CopyFrom(info)
            renamed.name = name
            return targets.kind(conn.dialect.name).sa_table(renamed)
    return targets.kind(conn.dialect.name).reflect(conn, name)


def _key_columns(conn: Connection, table: sa.Table) -> list[str]:
    pk = [c.name for c in table.primary_key.columns]
    if pk:
        return pk
    for cols in targets.kind(conn.dialect.name).unique_keys(conn, table.name):
        if cols and all(not table.c[c].nullable for c in cols):
            return cols
    return [c.name for c in table.columns]  # no key: the whole row is the key


def _diff_table(src: Connection, tgt: Connection, name: str, src_info: binlog_pb2.TableInfo | None,
                tgt_info: binlog_pb2.TableInfo | None, chunk_size: int, fixes: _Fixes,
                tgt_engine: sa.Engine, keep_keys: int) -> TableDiff:
    src_t = _typed(src, name, src_info)
    tgt_t = _typed(tgt, name, tgt_info)
    key = _key_columns(src, src_t)
    missing_cols = [k for k in key if k not in tgt_t.c]
    result = TableDiff(name, OK)
    src_json = [c.name for c in src_t.columns if isinstance(c.type, sa.JSON)]
    tgt_json = [c.name for c in tgt_t.columns if isinstance(c.type, sa.JSON)]
    if missing_cols:
        result.status = DIFF
        result.note = f"target lacks key column(s) {', '.join(missing_cols)}"
        result.source_rows = src.execute(sa.select(sa.func.count()).select_from(src_t)).scalar_one()
        result.target_rows = tgt.execute(sa.select(sa.func.count()).select_from(tgt_t)).scalar_one()
        return result
    src_keys = [src_t.c[k] for k in key]
    tgt_keys = [tgt_t.c[k] for k in key]
    with _Spill(fixes.wanted) as spill:
        for lo, hi, rows in _source_chunks(src, src_t, src_keys, chunk_size):
            result.chunks += 1
            result.source_rows += len(rows)
            q = sa.select(tgt_t)
            if lo is not None:
                q = q.where(sa.tuple_(*tgt_keys) >= sa.tuple_(*lo) if len(key) > 1 else tgt_keys[0] >= lo[0])
            if hi is not None:
                q = q.where(sa.tuple_(*tgt_keys) < sa.tuple_(*hi) if len(key) > 1 else tgt_keys[0] < hi[0])
            # key text -> (row hash, row) of the chunk's source rows not yet met in the target
            # row hash -> the chunk's source rows of that hash not yet met in the target: a
            # target row with a hash here is the same row (its key included), so an equal
            # chunk costs a hash per row and no key text.
            pending: dict[int, list[dict[str, Any]]] = {}
            for r in rows:
                pending.setdefault(checksum.row_hash(r, src_json), []).append(r)
            differs = False
            for tr in tgt.execution_options(yield_per=_TARGET_BATCH).execute(q):
                trow = dict(tr._mapping)
                result.target_rows += 1
                h = checksum.row_hash(trow, tgt_json)
                same = pending.get(h)
                if same:
                    same.pop()
                    if not same:
                        del pending[h]
                    continue
                differs = True
                spill.add(_TGT, _key_text(trow, key, tgt_json), h, key,
                          functools.partial(_delete_sql, tgt_engine, name, key, trow))
            for h, left in pending.items():
                for r in left:
                    differs = True
                    spill.add(_SRC, _key_text(r, key, src_json), h, key,
                              functools.partial(_insert_sql, tgt_engine, name, r))
            result.chunks_differing += differs
        # Rows that fell into different chunks on the two sides (collation order) meet here.
        spill.reconcile()
        result.missing_count, result.extra_count, result.differing_count = spill.counts()
        result.only_in_source, result.only_in_target, result.differing = spill.first_keys(keep_keys)
        for stmt in spill.statements():
            fixes.write(stmt)
    if result.missing_count or result.extra_count or result.differing_count:
        result.status = DIFF
    return result


_SRC, _TGT = 0, 1


class _Spill:
    """The keys of one table found on one side only (or differing), on disk: a SQLite
    file in a temporary directory, so a table that differs everywhere (an empty target)
    costs disk, not memory. With ``statements``, each row keeps the fix statement it
    needs (an INSERT of a source row, a DELETE of a target row's key)."""

    def __init__(self, statements: bool) -> None:
        self.statements_wanted = statements
        self._dir = tempfile.TemporaryDirectory(prefix="binlake-diff-")
        self._db = sqlite3.connect(os.path.join(self._dir.name, "spill.db"), isolation_level=None)
        self._db.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;"
                               "CREATE TABLE p (side INTEGER, k TEXT, h INTEGER, shown TEXT, stmt TEXT,"
                               " same INTEGER DEFAULT 0, other INTEGER DEFAULT 0); BEGIN")
        self._batch: list[tuple[int, str, int, str, str | None]] = []

    def __enter__(self) -> _Spill:
        return self

    def __exit__(self, *exc: object) -> None:
        self._db.close()
        self._dir.cleanup()

    def add(self, side: int, k: tuple[str | None, ...], h: int, key: Sequence[str],
            stmt: Callable[[], str]) -> None:
        text = json.dumps(k)
        shown = json.dumps(dict(zip(key, k, strict=True)))
        # SQLite integers are signed 64-bit: the hash is stored shifted into that range.
        self._batch.append((side, text, h - (1 << 63), shown, stmt() if self.statements_wanted else None))
        if len(self._batch) >= 1_000:
            self._flush()

    def _flush(self) -> None:
        self._db.executemany("INSERT INTO p (side, k, h, shown, stmt) VALUES (?, ?, ?, ?, ?)", self._batch)
        self._batch = []

    def reconcile(self) -> None:
        """Mark each row whose key is on the other side too (``other``), and with the same
        hash there (``same``: the same row, met in another chunk: no difference)."""
        self._flush()
        self._db.executescript(
            "CREATE INDEX p_k ON p (k, side, h);"
            "UPDATE p SET other = EXISTS (SELECT 1 FROM p q WHERE q.k = p.k AND q.side <> p.side),"
            " same = EXISTS (SELECT 1 FROM p q WHERE q.k = p.k AND q.side <> p.side AND q.h = p.h);")

    def counts(self) -> tuple[int, int, int]:
        """(missing in the target, extra in the target, differing) keys."""
        row = self._db.execute(
            "SELECT coalesce(sum(side = 0 AND NOT other), 0), coalesce(sum(side = 1 AND NOT other), 0),"
            " count(DISTINCT CASE WHEN other AND NOT same THEN k END) FROM p").fetchone()
        return int(row[0]), int(row[1]), int(row[2])

    def first_keys(self, n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        def keys(where: str) -> list[dict[str, Any]]:
            rows = self._db.execute(f"SELECT DISTINCT k, shown FROM p WHERE {where} ORDER BY k LIMIT ?", (n,))
            return [json.loads(shown) for _k, shown in rows]

        return (keys("side = 0 AND NOT other"), keys("side = 1 AND NOT other"), keys("other AND NOT same"))

    def statements(self) -> Iterator[str]:
        """The fix statements, the target's deletes before the source's inserts (a key that
        differs is deleted, then inserted as the source has it)."""
        for side in (_TGT, _SRC):
            for (stmt,) in self._db.execute(
                    "SELECT stmt FROM p WHERE side = ? AND NOT same AND stmt IS NOT NULL ORDER BY k", (side,)):
                yield str(stmt)


class _Fixes:
    """The fix SQL file, written as statements are found (none kept in memory); with no
    file asked for, nothing is built or written."""

    def __init__(self, path: str | None, header: str) -> None:
        self.wanted = path is not None
        self.count = 0
        self._out = open(path, "w", encoding="utf-8") if path is not None else None
        if self._out is not None:
            self._out.write(header)

    def write(self, stmt: str) -> None:
        if self._out is not None:
            self._out.write(stmt + "\n")
            self.count += 1

    def close(self) -> None:
        if self._out is not None:
            self._out.close()


def _key_text(row: Mapping[str, Any], key: Sequence[str], json_cols: Sequence[str]) -> tuple[str | None, ...]:
    return tuple(checksum.canonical(row[k], k in json_cols) for k in key)


def _source_chunks(conn: Connection, table: sa.Table, keys: Sequence[sa.ColumnElement[Any]], size: int
                   ) -> Iterator[tuple[tuple[Any, ...] | None, tuple[Any, ...] | None, list[dict[str, Any]]]]:
    """(low key or None, high key (exclusive) or None, rows) per chunk of ``size`` rows in key order.
    The first chunk has no low bound and the last no high bound, so the target's rows
    outside the source's key range are compared too."""
    result = conn.execution_options(yield_per=size).execute(sa.select(table).order_by(*keys))
    names = [k.name for k in keys]
    lo: tuple[Any, ...] | None = None
    chunk: list[dict[str, Any]] = []
    emitted = False
    for r in result:
        row = dict(r._mapping)
        if len(chunk) >= size:
            hi = tuple(row[n] for n in names)
            if hi != tuple(chunk[-1][n] for n in names):  # never split rows of one key value
                yield lo, hi, chunk
                emitted = True
                lo, chunk = hi, []
        chunk.append(row)
    if chunk or not emitted:
        yield lo, None, chunk


# ---------------------------------------------------------------- fix statements
def _kind(engine: sa.Engine) -> type[targets.Target]:
    return targets.kind(engine.dialect.name)


def _insert_sql(engine: sa.Engine, table: str, row: Mapping[str, Any]) -> str:
    cols = ", ".join(_q(engine, c) for c in row)
    vals = ", ".join(_kind(engine).literal(v) for v in row.values())
    return f"INSERT INTO {_q(engine, table)} ({cols}) VALUES ({vals});"


def _delete_sql(engine: sa.Engine, table: str, key: Sequence[str], row: Mapping[str, Any]) -> str:
    cond = " AND ".join(f"{_q(engine, k)} IS NULL" if row[k] is None else f"{_q(engine, k)} = {_kind(engine).literal(row[k])}"
                        for k in key)
    return f"DELETE FROM {_q(engine, table)} WHERE {cond};"
