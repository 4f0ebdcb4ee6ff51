"""The initial snapshot of ``binlake source postgres --start snapshot``: a new
logical slot whose exported snapshot is read, table by table, in one
REPEATABLE READ transaction, so that the rows already in the database reach
the lake before the first change the slot streams.

Why the slot's position matches the snapshot
--------------------------------------------
``CREATE_REPLICATION_SLOT name LOGICAL pgoutput (SNAPSHOT 'export')`` (the
``EXPORT_SNAPSHOT`` keyword before PostgreSQL 15), sent on a replication
connection, returns the slot's *consistent point* (an LSN) and the name of a
snapshot the server exports from that same connection. PostgreSQL builds both
from one state of the decoding snapshot builder: the exported snapshot sees
exactly the transactions that committed before the consistent point, and the
slot decodes exactly the transactions that commit after it (this is how
PostgreSQL's own subscriptions copy a table, and how pg_dump's
``--snapshot`` pairs with a slot). A second connection imports it with
``SET TRANSACTION SNAPSHOT`` as the first statement of a REPEATABLE READ
transaction, while the replication connection stays open and idle (the export
lives only until that connection runs another command). So every transaction
is either in the rows read or in the stream from the consistent point, never
both and never neither.

The table list, column definitions, primary keys and row filters are read in
the same transaction, so they are those of the same instant; every table is
then locked ACCESS SHARE (as pg_dump does), so a DDL after that waits for the
snapshot to end instead of changing a table half read. A DDL between the slot's
creation and the lock is seen by the stream as a changed RELATION: a DDL binlog
after the snapshot's rows, which is where it happened.

What is read mirrors what pgoutput sends: the publication's column list
(PostgreSQL 15), no dropped or generated columns, columns in attribute order,
the publication's row filter, ``ONLY`` for a plain table (its inheritance
children are published on their own) and the whole tree for a partitioned
table published via its root. Values come as each type's text output
(``values``): the same text pgoutput would send for the row.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

from binlake import errors
from binlake.source.postgres.values import SESSION_OPTIONS, TYPES, Attr, convert

log = logging.getLogger(__name__)

# Rows per snapshot transaction: bounds each part's size (a Pump holds one pending at a time).
BATCH_ROWS = 10_000
# How long a slot left by a killed snapshot may stay active (its walsender
# notices the dead client) before the restart gives up dropping it.
DROP_WAIT_S = 30.0


def parse_lsn(text: str) -> int:
    """``'16/B374D848'`` -> the 64-bit LSN."""
    hi, sep, lo = text.partition("/")
    if not sep:
        raise ValueError(f"not an LSN: {text!r}")
    return int(hi, 16) << 32 | int(lo, 16)


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


@dataclasses.dataclass
class PublishedTable:
    """One table of the publication as of the snapshot."""

    oid: int
    ns: str
    name: str
    partitioned: bool
    attrs: list[Attr]
    primary_key: list[str]
    row_filter: str | None
    # column name -> its DEFAULT as ``column_defaults`` reads it
    defaults: dict[str, ColumnDefaultText] = dataclasses.field(default_factory=dict)


class Snapshot:
    """A new slot, and an open transaction reading the snapshot it exported."""

    def __init__(self, dsn: str, slot: str) -> None:
        self.dsn, self.slot = dsn, slot
        self.lsn = 0
        self.created = False  # the slot exists because of this object (and may be dropped by its owner)
        self._repl: Any = None
        self._conn: Any = None

    def open(self) -> Snapshot:
        import psycopg2
        import psycopg2.extensions
        import psycopg2.extras

        try:
            self._repl = psycopg2.connect(self.dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection,
                                          options=SESSION_OPTIONS)
            kw = "(SNAPSHOT 'export')" if self._repl.server_version >= 150000 else "EXPORT_SNAPSHOT"
            with self._repl.cursor() as rcur:
                rcur.execute(f'CREATE_REPLICATION_SLOT "{self.slot}" LOGICAL pgoutput {kw}')
                _slot, point, name, _plugin = rcur.fetchone()
            self.created = True
            self.lsn = parse_lsn(str(point))
            self._conn = psycopg2.connect(self.dsn, options=SESSION_OPTIONS)
            self._conn.set_session(isolation_level=psycopg2.extensions.ISOLATION_LEVEL_REPEATABLE_READ,
                                   readonly=True)
            with self._conn.cursor() as cur:
                # The first statement of the transaction: it reads what the slot's consistent point saw.
                cur.execute("SET TRANSACTION SNAPSHOT %s", (str(name),))
        except psycopg2.errors.DuplicateObject:
            self.close()
            raise errors.InvalidArgument(_exists_message(self.slot)) from None
        except BaseException:
            self.close()
            raise
        log.info("postgres source: slot %s created at %s with an exported snapshot", self.slot, format_lsn(self.lsn))
        return self

    def tables(self, publication: str) -> list[PublishedTable]:
        """The publication's tables with what pgoutput would send of them, as of the snapshot."""
        with self._conn.cursor() as cur:
            pg15 = self._conn.server_version >= 150000
            cur.execute(
                "SELECT c.oid, n.nspname, c.relname, c.relkind, "
                + ("p.attnames::text[], p.rowfilter " if pg15 else "NULL::text[], NULL::text ")
                + "FROM pg_publication_tables p JOIN pg_namespace n ON n.nspname = p.schemaname "
                "JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename "
                "WHERE p.pubname = %s ORDER BY n.nspname, c.relname", (publication,))
            listed = list(cur.fetchall())
            out: list[PublishedTable] = []
            for oid, ns, name, kind, attnames, row_filter in listed:
                cur.execute("SELECT attname, atttypid, atttypmod FROM pg_attribute WHERE attrelid = %s "
                            "AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum", (oid,))
                wanted = set(attnames) if attnames is not None else None
                attrs = [Attr(str(a), int(t), int(m)) for a, t, m in cur.fetchall() if wanted is None or a in wanted]
                out.append(PublishedTable(int(oid), str(ns), str(name), kind == "p", attrs,
                                          primary_key(cur, int(oid)), row_filter, column_defaults(cur, int(oid))))
            return out

    def estimate_rows(self, tables: list[PublishedTable]) -> int:
        """The planner's estimate of the tables' rows (``pg_class.reltuples``, the leaves' for a
        partitioned table; -1, never analyzed, counts 0): what the progress's time left is from."""
        total = 0
        with self._conn.cursor() as cur:
            for t in tables:
                if t.partitioned:
                    cur.execute("SELECT COALESCE(SUM(GREATEST(c.reltuples, 0)), 0) FROM pg_partition_tree(%s) p "
                                "JOIN pg_class c ON c.oid = p.relid WHERE p.isleaf", (t.oid,))
                else:
                    cur.execute("SELECT GREATEST(reltuples, 0) FROM pg_class WHERE oid = %s", (t.oid,))
                row = cur.fetchone()
                total += int(row[0] or 0) if row else 0
        return total

    def lock(self, tables: list[PublishedTable]) -> None:
        """ACCESS SHARE on every table until the snapshot ends: later DDL waits for it."""
        from psycopg2 import sql

        if not tables:
            return
        with self._conn.cursor() as cur:
            cur.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(
                sql.SQL(", ").join(sql.Identifier(t.ns, t.name) for t in tables)))

    def batches(self, t: PublishedTable, rows: int) -> Iterator[list[tuple[str | None, ...]]]:
        """The table's rows, ``rows`` at a time, each value its type's text output (or None)."""
        import psycopg2.extensions
        from psycopg2 import sql

        query = sql.SQL("SELECT {} FROM {}{}{}").format(
            sql.SQL(", ").join(sql.Identifier(a.name) for a in t.attrs),
            sql.SQL("" if t.partitioned else "ONLY "),
            sql.Identifier(t.ns, t.name),
            sql.SQL(f" WHERE ({t.row_filter})" if t.row_filter else ""),
        )
        # Server-side cursor: memory bounded by one batch.
        with self._conn.cursor(name=f"binlake_snapshot_{t.oid}") as cur:
            # Every carried type arrives as its text output, as pgoutput sends it.
            psycopg2.extensions.register_type(_text_caster(), cur)
            cur.itersize = rows
            cur.execute(query)
            while True:
                got = cur.fetchmany(rows)
                if not got:
                    return
                yield [tuple(r) for r in got]

    def copyable(self) -> bool:
        """Whether ``copy_chunks`` may stand in for ``batches``: COPY sends the texts
        in the connection's encoding, which ``copy_line_texts`` reads as UTF-8."""
        return str(getattr(self._conn, "encoding", "")).upper() in ("UTF8", "UNICODE")

    def copy_chunks(self, t: PublishedTable, rows: int) -> Iterator[bytes]:
        """The table's rows as ``COPY ... TO STDOUT`` text lines, ``rows`` lines a chunk:
        the same rows and the same texts as ``batches`` (COPY writes each value with
        its type's output function, in this session's settings), read in a thread
        one chunk ahead of the caller (``readahead``), which encodes and sends.

        Faster than ``batches`` by far: no Python object per value, one call per row
        into this module's writer, and the encoding of a whole chunk in one call
        (``_pgoutc.Plan.copy_rows``)."""
        from psycopg2 import sql

        from binlake.source import readahead

        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
            raise ValueError(f"rows must be a positive integer, got {rows!r}")
        query = sql.SQL("COPY (SELECT {} FROM {}{}{}) TO STDOUT").format(
            sql.SQL(", ").join(sql.Identifier(a.name) for a in t.attrs),
            sql.SQL("" if t.partitioned else "ONLY "),
            sql.Identifier(t.ns, t.name),
            sql.SQL(f" WHERE ({t.row_filter})" if t.row_filter else ""),
        )
        conn = self._conn

        def read(put: Any) -> None:
            out = _ChunkWriter(rows, put)
            with conn.cursor() as cur:
                cur.copy_expert(query.as_string(conn), out)
            out.flush()

        yield from readahead.ahead(read, depth=1, name=f"snapshot-copy-{t.oid}")

    def close(self) -> None:
        """End the snapshot transaction (read only) and the replication connection; the slot stays."""
        for c in (self._conn, self._repl):
            if c is not None:
                try:
                    c.close()
                except Exception:
                    pass  # closing a dead connection: nothing to do
        self._conn = self._repl = None


class _ChunkWriter:
    """The file COPY writes to (psycopg2 calls ``write`` once per row): ``rows`` lines
    joined into one chunk and handed to ``put``."""

    def __init__(self, rows: int, put: Any) -> None:
        self.rows, self.put = rows, put
        self.lines: list[bytes] = []

    def write(self, line: bytes) -> None:
        self.lines.append(line)
        if len(self.lines) >= self.rows:
            self.flush()

    def flush(self) -> None:
        if self.lines:
            chunk, self.lines = b"".join(self.lines), []
            self.put(chunk)


# COPY's text-format escapes (what follows a backslash), as COPY FROM reads them.
_COPY_ESCAPES = {ord("b"): b"\b", ord("f"): b"\f", ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t",
                 ord("v"): b"\v"}
_COPY_ESCAPE = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|(.))", re.S)


def _unescape(m: re.Match[bytes]) -> bytes:
    octal, hexa, other = m.groups()
    if octal is not None:
        return bytes([int(octal, 8) & 0xFF])
    if hexa is not None:
        return bytes([int(hexa, 16)])
    return _COPY_ESCAPES.get(other[0], other)


def copy_line_texts(chunk: bytes) -> list[tuple[str | None, ...]]:
    """The rows of whole ``COPY ... TO STDOUT`` text lines as ``batches`` gives them:
    each value its text (UTF-8), None for ``\\N``."""
    out = []
    lines = chunk.split(b"\n")
    for line in lines[:-1] if chunk.endswith(b"\n") else lines:
        out.append(tuple(None if f == b"\\N" else _COPY_ESCAPE.sub(_unescape, f).decode("utf-8")
                         for f in line.split(b"\t")))
    return out


def _text_caster() -> Any:
    import psycopg2.extensions

    return psycopg2.extensions.new_type(tuple(TYPES), "BINLAKE_TEXT", lambda value, _cur: value)


@dataclasses.dataclass(frozen=True)
class ColumnDefaultText:
    """A column's DEFAULT as the catalog has it: ``default`` a constant's value (text
    ``SourceColumn.typed`` reads) or an expression's SQL (``is_expr``), None for none;
    ``existing`` what the rows that existed when the column was added hold
    (``pg_attribute.attmissingval``), when the catalog still has it."""

    default: str | None
    is_expr: bool
    existing: str | None


# pg_get_expr's text of a constant: a number, a quoted literal (with a cast), a boolean.
_CONSTANT = re.compile(
    r"^\(?\s*-?\d+(\.\d+)?([eE][-+]?\d+)?\s*\)?(::[\w \"]+(\(\d+(,\d+)?\))?)?$"
    r"|^'(?:[^']|'')*'(::[\w \"]+(\(\d+(,\d+)?\))?)?$|^(true|false)$")


def column_defaults(conn_cur: Any, oid: int) -> dict[str, ColumnDefaultText]:
    """Every column's DEFAULT of table ``oid`` from the catalog *now* (``pg_attrdef``), and
    the value the rows existing when it was added got (``attmissingval``: PostgreSQL keeps
    it for a non-volatile default until the table is rewritten). A constant is evaluated
    (a literal and its cast: nothing with side effects) and read back as its type's text
    output, the text the stream carries; a volatile default PostgreSQL evaluated per row
    at the ALTER leaves no trace: ``existing`` is None."""
    import psycopg2.extensions
    from psycopg2 import sql

    cur = conn_cur.connection.cursor()  # its own: the text caster below stays on it
    cur.execute(
        "SELECT a.attname, a.atttypid, pg_get_expr(d.adbin, d.adrelid), a.atthasmissing, "
        "format_type(a.atttypid, a.atttypmod), a.attnum FROM pg_attribute a LEFT JOIN pg_attrdef d "
        "ON d.adrelid = a.attrelid AND d.adnum = a.attnum WHERE a.attrelid = %s AND a.attnum > 0 "
        "AND NOT a.attisdropped ORDER BY a.attnum", (oid,))
    rows = list(cur.fetchall())
    psycopg2.extensions.register_type(_text_caster(), cur)  # values as their text output, as streamed
    out: dict[str, ColumnDefaultText] = {}
    for name, type_oid, expr, has_missing, ftype, attnum in rows:
        kind = TYPES.get(int(type_oid))
        if kind is None:
            continue
        default: str | None = None
        is_expr = False
        if expr is not None:
            text = str(expr)
            if _CONSTANT.match(text.strip()):
                cur.execute(sql.SQL("SELECT ({})::{}").format(sql.SQL(text), sql.SQL(ftype)))
                value = cur.fetchone()[0]
                default = None if value is None else canonical_text(value, int(type_oid), kind)
            else:
                default, is_expr = text, True
        existing = None
        if has_missing:
            cur.execute(sql.SQL("SELECT (attmissingval::text::{}[])[1] FROM pg_attribute WHERE attrelid = %s "
                                "AND attnum = %s").format(sql.SQL(ftype)), (oid, attnum))
            value = cur.fetchone()[0]
            existing = None if value is None else canonical_text(value, int(type_oid), kind)
        out[str(name)] = ColumnDefaultText(default, is_expr, existing)
    cur.close()
    return out


def canonical_text(output: str, type_oid: int, kind: str) -> str:
    """A type's text output as the text ``SourceColumn.typed`` reads for ``kind``."""
    import datetime as dt

    value = convert(output, type_oid, "default")
    if kind == "bool":
        return "1" if value else "0"
    if kind == "bytes":
        return "0x" + bytes(value).hex()
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, float):
        return repr(value)
    return str(value)


def primary_key(cur: Any, oid: int) -> list[str]:
    """The table's primary key columns, in key order."""
    cur.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary ORDER BY array_position(i.indkey, "
        "a.attnum)", (oid,))
    return [str(r[0]) for r in cur.fetchall()]


def _exists_message(slot: str) -> str:
    return (f"replication slot {slot} already exists, and a snapshot can only be taken when its slot is created; "
            f"drop it first (SELECT pg_drop_replication_slot('{slot}')), or use another --slot, or leave out "
            "--start snapshot to stream from the existing slot")


def refuse_existing(slot: str) -> errors.InvalidArgument:
    return errors.InvalidArgument(_exists_message(slot))


def drop_own_slot(dsn: str, slot: str, wait_s: float = DROP_WAIT_S) -> None:
    """Drop SLOT, left by a snapshot of this data dir that never reached its commit
    point (so nothing was served from it); waits while a dead client's walsender
    still holds it."""
    import psycopg2

    deadline = time.monotonic() + wait_s
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            while True:
                cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))
                row = cur.fetchone()
                if row is None:
                    return
                if row[0] is None:
                    try:
                        cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                    except psycopg2.errors.ObjectInUse:
                        pass  # taken again in between: wait as for any holder
                    else:
                        log.info("postgres source: dropped slot %s of an unfinished snapshot", slot)
                        return
                if time.monotonic() > deadline:
                    raise errors.FailedPrecondition(
                        f"slot {slot} (left by an unfinished snapshot) is in use by process {row[0]}; stop that "
                        f"client, or drop the slot by hand (SELECT pg_drop_replication_slot('{slot}')), then restart")
                time.sleep(0.2)
    finally:
        conn.close()
