"""Compare two databases table by table, chunk by chunk, in the manner of
sync-diff-inspector: split each table by ranges of its key, compare one
checksum per chunk, and look at single rows only inside chunks that differ.

Values are normalised by ``binlake.oracle`` (canonical text per type, the
same row hash), so a SQLite source and a PostgreSQL target holding the same
rows compare equal, and a table is OK here exactly when the oracle's checksums
of both sides agree. Because the checksum must be the same on every dialect,
it is computed by this process over the streamed rows, not by SQL functions.

Chunks are ranges of the key in the source's order: ``[first key of chunk i,
first key of chunk i+1)``; the same range is read from the target. Should the
two databases order keys differently (different collations), a row may fall in
another chunk on one side: keys reported missing on one side and extra on the
other with the same row hash are reconciled at the end, so that never shows as
a difference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.sql import checksum, targets
from binlake.sql.url import reader_engine

OK, DIFF, MISSING = "OK", "DIFF", "MISSING"
_SHOW_KEYS = 10


@dataclasses.dataclass
class TableDiff:
    """One table's outcome. Keys are column name -> canonical text of the value."""

    name: str
    status: str  # OK | DIFF | MISSING (the table is on one side only)
    source_rows: int = 0
    target_rows: int = 0
    chunks: int = 0
    chunks_differing: int = 0
    only_in_source: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    only_in_target: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    differing: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    note: str = ""

    @property
    def differing_keys(self) -> list[dict[str, Any]]:
        return self.only_in_source + self.only_in_target + self.differing

    def line(self) -> str:
        head = f"{self.name:<32} {self.status:<8} source {self.source_rows:>9,} rows  target {self.target_rows:>9,} rows"
        if self.status == MISSING:
            return f"{head}  ({self.note})"
        if self.status == DIFF:
            head += (f"  ({len(self.only_in_source)} missing in target, {len(self.only_in_target)} extra, "
                     f"{len(self.differing)} different; {self.chunks_differing}/{self.chunks} chunks)")
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
            for label, keys in (("missing", t.only_in_source), ("extra", t.only_in_target),
                                ("different", t.differing)):
                for k in keys[:_SHOW_KEYS]:
                    lines.append(f"      {label:<9} {_show_key(k)}")
                if len(keys) > _SHOW_KEYS:
                    lines.append(f"      ... {len(keys) - _SHOW_KEYS} more {label}")
        bad = sum(t.status != OK for t in self.tables)
        lines.append(f"{len(self.tables)} table(s): " + ("all OK" if not bad else f"{bad} differ"))
        if self.fix_statements:
            lines.append(f"{self.fix_statements} fix statement(s) written")
        return "\n".join(lines)


def _show_key(key: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in key.items())


def diff_databases(source_url: str, target_url: str, tables: Sequence[str] | None = None,
                   chunk_size: int = 10_000, fix_sql: str | None = None) -> DiffReport:
    """Compare every table (or ``tables``) of ``source_url`` with ``target_url``.
    With ``fix_sql``, write the statements that make the target equal to that file."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise errors.InvalidArgument(f"chunk size must be a positive integer, got {chunk_size!r}")
    if tables is not None and (isinstance(tables, str) or not all(isinstance(t, str) and t for t in tables)):
        raise errors.InvalidArgument(f"tables must be a list of table names, got {tables!r}")
    src_engine = _engine(source_url, "source")
    tgt_engine = _engine(target_url, "target")
    fixes: list[str] = []
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
                    if name in src_schema:
                        fixes.extend(s + ";" for s in _kind(tgt_engine).create_table_sql(tgt_engine, src_schema[name]))
                        fixes.extend(_insert_sql(tgt_engine, name, dict(r._mapping))
                                     for r in src.execute(sa.select(src_t)))
                    continue
                if name not in src_names:
                    tgt_t = _typed(tgt, name, tgt_schema.get(name))
                    n = tgt.execute(sa.select(sa.func.count()).select_from(tgt_t)).scalar_one()
                    results.append(TableDiff(name, MISSING, target_rows=n, note="not in the source"))
                    fixes.append(f"DROP TABLE {_q(tgt_engine, name)};")
                    continue
                # A source without binlake's definitions (a MariaDB/PostgreSQL upstream followed by
                # a source) is read with the target's, when its columns are the same: values then
                # compare by type (a JSON document, not its text as the upstream kept it).
                results.append(_diff_table(src, tgt, name, src_schema.get(name) or tgt_schema.get(name),
                                           tgt_schema.get(name), chunk_size, fixes, tgt_engine))
    except sa.exc.OperationalError as exc:
        raise errors.Unavailable(f"diff: {errors.first_line(exc)}") from None
    finally:
        src_engine.dispose()
        tgt_engine.dispose()
    report = DiffReport(_show(src_engine), _show(tgt_engine), results)
    if fix_sql is not None:
        with open(fix_sql, "w", encoding="utf-8") as f:
            f.write(f"-- statements that make {report.target} equal to {report.source}\n")
            for stmt in fixes:
                f.write(stmt + "\n")
        report.fix_statements = len(fixes)
    return report


def _engine(url: str, what: str) -> sa.Engine:
    engine = reader_engine(url)
    try:
        with engine.connect():
            pass
    except sa.exc.DBAPIError as exc:
        engine.dispose()
        raise errors.Unavailable(f"cannot reach the {what} {_show(engine)}: {errors.first_line(exc)}") from None
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
                tgt_info: binlog_pb2.TableInfo | None, chunk_size: int, fixes: list[str],
                tgt_engine: sa.Engine) -> TableDiff:
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
    # key text -> (row hash, row) of rows seen on one side only (or differing), across chunks
    only_src: dict[tuple[str | None, ...], tuple[int, dict[str, Any]]] = {}
    only_tgt: dict[tuple[str | None, ...], tuple[int, dict[str, Any]]] = {}
    src_keys = [src_t.c[k] for k in key]
    for lo, hi, rows in _source_chunks(src, src_t, src_keys, chunk_size):
        result.chunks += 1
        tgt_keys = [tgt_t.c[k] for k in key]
        q = sa.select(tgt_t)
        if lo is not None:
            q = q.where(sa.tuple_(*tgt_keys) >= sa.tuple_(*lo) if len(key) > 1 else tgt_keys[0] >= lo[0])
        if hi is not None:
            q = q.where(sa.tuple_(*tgt_keys) < sa.tuple_(*hi) if len(key) > 1 else tgt_keys[0] < hi[0])
        trows = [dict(r._mapping) for r in tgt.execute(q)]
        result.source_rows += len(rows)
        result.target_rows += len(trows)
        shash = [checksum.row_hash(r, src_json) for r in rows]
        thash = [checksum.row_hash(r, tgt_json) for r in trows]
        if len(rows) == len(trows) and _fold(shash) == _fold(thash):
            continue
        result.chunks_differing += 1
        s_map = {_key_text(r, key, src_json): (h, r) for r, h in zip(rows, shash, strict=True)}
        t_map = {_key_text(r, key, tgt_json): (h, r) for r, h in zip(trows, thash, strict=True)}
        for k, v in s_map.items():
            if t_map.get(k, (None,))[0] != v[0]:
                only_src[k] = v
        for k, v in t_map.items():
            if s_map.get(k, (None,))[0] != v[0]:
                only_tgt[k] = v
    # Reconcile rows that fell into different chunks on the two sides (collation order).
    for k in list(only_src):
        if k in only_tgt and only_tgt[k][0] == only_src[k][0]:
            del only_src[k], only_tgt[k]
    for k in sorted(set(only_src) | set(only_tgt), key=lambda t: tuple("" if v is None else v for v in t)):
        shown = dict(zip(key, k, strict=True))
        if k in only_src and k in only_tgt:
            result.differing.append(shown)
        elif k in only_src:
            result.only_in_source.append(shown)
        else:
            result.only_in_target.append(shown)
        if k in only_tgt:
            fixes.append(_delete_sql(tgt_engine, name, key, only_tgt[k][1]))
        if k in only_src:
            fixes.append(_insert_sql(tgt_engine, name, only_src[k][1]))
    if only_src or only_tgt:
        result.status = DIFF
    return result


def _fold(hashes: Sequence[int]) -> tuple[int, int]:
    total = xor = 0
    for h in hashes:
        total = (total + h) & 0xFFFFFFFFFFFFFFFF
        xor ^= h
    return total, xor


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
