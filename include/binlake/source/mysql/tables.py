"""MySQL/MariaDB table definitions as the row-binlog source tracks them, kept up
to date by parsing each DDL statement of the binlog with sqlglot.

A row event carries values by column position only, so decoding it needs the
definition in force *at that point of the binlog*, not the server's current
one (the source may lag behind later DDL). The source therefore reads the
definitions once at its start position (``SHOW CREATE TABLE``, parsed by the
same code) and then applies every DDL of the binlog to its own copy.

The definitions are ``source.tables``' ``SourceTable``/``SourceColumn`` (shared
with the PostgreSQL source), each with its binlake ``TableInfo`` (``to_info``);
this module holds what is MySQL's own: the type mapping below, DDL applied to
the tracked ``Catalog``, and the ``--tables`` filter.

Type mapping (MySQL -> binlake codec):

=====================================  ========  ==================================
MySQL                                  binlake   note
=====================================  ========  ==================================
TINYINT..BIGINT, YEAR, BOOL            int       UNSIGNED -> uint (to 2^64-1)
DECIMAL/NUMERIC(p,s)                   decimal   full precision
FLOAT, DOUBLE                          float     FLOAT at its 6 significant digits
CHAR, VARCHAR, *TEXT, ENUM, SET        string    decoded in the column's charset;
                                                 SET as 'a,b' in definition order
BINARY, VARBINARY, *BLOB, BIT          bytes     BINARY padded to its length;
                                                 BIT big-endian, as the server gives it
DATE / DATETIME, TIMESTAMP / TIME      date / datetime / time (fractions kept)
JSON (MariaDB: LONGTEXT + json_valid)  json
=====================================  ========  ==================================

Anything else (spatial types, ...) is refused naming the table and column.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import fnmatch
import functools
import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from binlake import coldefault, errors
from binlake.source.tables import SourceColumn, SourceTable

if TYPE_CHECKING:
    import sqlglot
    from sqlglot import TokenType, exp
else:
    class _Lazy:
        """A module (or a module's attribute) imported at its first use. Why: sqlglot is
        about a third of the source's import time, and a source restarted from its
        checkpoint (which holds the table definitions) needs it only at the first DDL
        in the binlog; a fresh start parses SHOW CREATE TABLE and loads it then."""

        def __init__(self, module: str, attr: str | None = None) -> None:
            self._module, self._attr = module, attr

        @functools.cached_property
        def _target(self) -> Any:
            mod = importlib.import_module(self._module)
            return getattr(mod, self._attr) if self._attr else mod

        def __getattr__(self, name: str) -> Any:
            return getattr(self._target, name)

    sqlglot = _Lazy("sqlglot")
    exp = _Lazy("sqlglot", "exp")
    TokenType = _Lazy("sqlglot", "TokenType")

SYSTEM_DBS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})


@functools.cache
def _type_sets() -> tuple[Any, ...]:
    """sqlglot's data types by the binlake type family they map to (built at the first
    parsed column: sqlglot is imported lazily, see ``_Lazy``)."""
    t = exp.DataType.Type
    return (
        t,
        {t.TINYINT, t.SMALLINT, t.MEDIUMINT, t.INT, t.BIGINT, t.YEAR, t.BOOLEAN},
        {t.UTINYINT, t.USMALLINT, t.UMEDIUMINT, t.UINT, t.UBIGINT},
        {t.CHAR, t.VARCHAR, t.NCHAR, t.NVARCHAR, t.TEXT, t.TINYTEXT, t.MEDIUMTEXT, t.LONGTEXT, t.ENUM, t.SET},
        {t.BINARY, t.VARBINARY, t.BLOB, t.TINYBLOB, t.MEDIUMBLOB, t.LONGBLOB, t.BIT},
        {t.FLOAT, t.DOUBLE},
        {t.DECIMAL, t.UDECIMAL},
        {t.DATE: "date", t.DATETIME: "datetime", t.DATETIME64: "datetime", t.TIMESTAMP: "datetime",
         t.TIMESTAMPTZ: "datetime", t.TIMESTAMPLTZ: "datetime", t.TIME: "time", t.JSON: "json"},
    )


# ---------------------------------------------------------------------------- filter


class TableFilter:
    """``--tables``: comma-separated DB.TABLE glob patterns (``app.*,shop.orders``);
    empty means every table outside the system databases."""

    def __init__(self, spec: str | None) -> None:
        self.patterns: list[str] = []
        for part in (spec or "").split(","):
            part = part.strip()
            if not part:
                continue
            if "." not in part:
                raise errors.InvalidArgument(f"--tables pattern {part!r} must be DB.TABLE (globs allowed, e.g. app.*)")
            self.patterns.append(part.lower())

    def __call__(self, db: str, table: str) -> bool:
        if db.lower() in SYSTEM_DBS:
            return False
        if not self.patterns:
            return True
        name = f"{db}.{table}".lower()
        return any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def dbs(self) -> list[str] | None:
        return None if not self.patterns else sorted({p.split(".", 1)[0] for p in self.patterns})


# ---------------------------------------------------------------------------- column types


def _literal_int(node: exp.Expression | None) -> int | None:
    if node is None:
        return None
    text = node.this.name if isinstance(node, exp.DataTypeParam) else node.name
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def column_from_def(table: str, cd: exp.ColumnDef, table_charset: str | None) -> SourceColumn:
    """A ``SourceColumn`` from a parsed column definition; refuses a type the codec cannot carry."""
    _T, _INTS, _UINTS, _TEXTS, _BINS, _FLOATS, _DECIMALS, _OTHER = _type_sets()
    name = cd.name
    dtype = cd.args.get("kind")
    if not isinstance(dtype, exp.DataType):
        raise errors.FailedPrecondition(f"column {table}.{name}: no type in its definition")
    t = dtype.this
    params = [p for p in dtype.expressions]
    mysql_type = dtype.sql("mysql").lower()
    nullable = True
    charset: str | None = None
    is_json_check = False
    for cons in cd.constraints:
        kind = cons.args.get("kind")
        if isinstance(kind, exp.NotNullColumnConstraint):
            nullable = bool(kind.args.get("allow_null"))
        elif isinstance(kind, exp.PrimaryKeyColumnConstraint):
            nullable = False
        elif isinstance(kind, exp.CharacterSetColumnConstraint):
            charset = kind.this.name.lower()
        elif isinstance(kind, exp.CollateColumnConstraint):
            charset = charset or kind.this.name.lower().split("_", 1)[0]
        elif isinstance(kind, exp.CheckColumnConstraint) and "json_valid" in kind.sql("mysql").lower():
            is_json_check = True
    default, default_expr = None, False
    for cons in cd.constraints:
        kind = cons.args.get("kind")
        if isinstance(kind, exp.DefaultColumnConstraint):
            default, default_expr = default_text(kind.this)
    col = SourceColumn(name=name, kind="", nullable=nullable, mysql_type=mysql_type, default=default,
                   default_expr=default_expr)
    if t in _INTS:
        col.kind = "int"
        if t == _T.BOOLEAN:
            col.mysql_type = "tinyint(1)"
    elif t in _UINTS:
        col.kind = "uint"
    elif t in _DECIMALS:
        col.kind = "decimal"
        col.precision = _literal_int(params[0]) if params else 10
        col.scale = _literal_int(params[1]) if len(params) > 1 else 0
        if col.precision is None or col.scale is None:
            raise errors.FailedPrecondition(f"column {table}.{name}: cannot read the precision of {mysql_type}")
    elif t in _FLOATS:
        col.kind = "float"
    elif t in _TEXTS:
        if charset == "binary":
            col.kind = "bytes"
        elif is_json_check and t == _T.LONGTEXT:
            col.kind = "json"
        else:
            col.kind = "string"
            col.charset = charset or table_charset or "utf8mb4"
        if t in (_T.ENUM, _T.SET):
            col.values = [p.name for p in params]
        elif params and t in (_T.CHAR, _T.VARCHAR, _T.NCHAR, _T.NVARCHAR):
            col.length = _literal_int(params[0])
    elif t in _BINS:
        col.kind = "bytes"
        if params and t in (_T.BINARY, _T.VARBINARY):
            col.length = _literal_int(params[0])
        elif t == _T.BINARY:
            col.length = 1
        if t == _T.BIT:
            col.length = (_literal_int(params[0]) if params else 1)
    elif t in _OTHER:
        col.kind = _OTHER[t]
    else:
        raise errors.FailedPrecondition(
            f"column {table}.{name} has type {mysql_type}, which binlake cannot carry; exclude the table with "
            "--tables or change the column's type"
        )
    return col


def default_text(node: exp.Expression) -> tuple[str | None, bool]:
    """A parsed DEFAULT as (text, is_expression): a literal's value (a string's
    unescaped text, a number's digits, a hex literal as ``0x..``), NULL as (None,
    False), anything else (CURRENT_TIMESTAMP, uuid(), (expr)) as its MySQL SQL."""
    if isinstance(node, exp.Paren) and isinstance(node.this, exp.Literal):
        node = node.this  # DEFAULT ('x'): MySQL 8's expression form of a literal
    if isinstance(node, exp.Null):
        return None, False
    if isinstance(node, exp.Literal):
        return str(node.this), False
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        return "-" + str(node.this.this), False
    if isinstance(node, exp.Boolean):
        return ("1" if node.this else "0"), False
    if isinstance(node, exp.HexString):
        return "0x" + str(node.this), False
    return node.sql("mysql"), True


def implicit_default(col: SourceColumn) -> str | None:
    """The value MySQL/MariaDB give existing rows for an added NOT NULL column declared
    without a DEFAULT (the type's implicit default); None where binlake's type has no
    such value (zero dates) or it is not one value (TIMESTAMP)."""
    if col.kind in ("int", "uint", "float", "decimal"):
        return "0"
    if col.kind == "string":
        return col.values[0] if col.is_enum and col.values else ""
    if col.kind == "bytes":
        return ""
    if col.kind == "time":
        return "00:00:00"
    return None


# ---------------------------------------------------------------------------- DDL


@dataclasses.dataclass
class DdlChange:
    """What one DDL statement did to one table: its definition after (None if
    dropped), its name before (None if created), and whether it got a new id."""

    db: str
    name: str
    after: SourceTable | None
    before: SourceTable | None
    truncated: bool = False


def _table_ref(t: exp.Table, default_db: str) -> tuple[str, str]:
    return (t.db or default_db), t.name


def _key_names(node: exp.Expression) -> list[str]:
    out = []
    for e in node.expressions:
        inner = e.this if isinstance(e, exp.Ordered) else e
        out.append(inner.name)
    return out


def _unique_name(existing: Iterable[str], cols: list[str]) -> str:
    taken = set(existing)
    base = cols[0]
    name, i = base, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    return name


class Catalog:
    """The tracked tables (``db.name`` -> SourceTable) and the per-database default charsets."""

    def __init__(self, tables: dict[str, SourceTable] | None = None, db_charsets: dict[str, str] | None = None) -> None:
        self.tables: dict[str, SourceTable] = tables or {}
        self.db_charsets: dict[str, str] = db_charsets or {}

    def get(self, db: str, name: str) -> SourceTable | None:
        return self.tables.get(f"{db}.{name}".lower())

    def put(self, t: SourceTable) -> None:
        self.tables[t.full_name.lower()] = t

    def remove(self, db: str, name: str) -> None:
        self.tables.pop(f"{db}.{name}".lower(), None)

    def to_json(self) -> dict[str, Any]:
        return {"tables": {k: v.to_json() for k, v in self.tables.items()}, "db_charsets": self.db_charsets}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Catalog:
        return cls({k: SourceTable.from_json(v) for k, v in d.get("tables", {}).items()}, dict(d.get("db_charsets", {})))

    # -- parsing
    def create_table(self, stmt: exp.Create, default_db: str) -> SourceTable:
        schema = stmt.this
        if not isinstance(schema, exp.Schema):
            raise errors.FailedPrecondition("CREATE TABLE ... AS SELECT / LIKE is not supported by the source")
        db, name = _table_ref(schema.this, default_db)
        charset = self.db_charsets.get(db.lower())
        props = stmt.args.get("properties")
        if props is not None:
            for p in props.expressions:
                if isinstance(p, exp.CharacterSetProperty):
                    charset = p.this.name.lower()
                elif isinstance(p, exp.CollateProperty) and charset is None:
                    charset = p.this.name.lower().split("_", 1)[0]
        cols: list[SourceColumn] = []
        pk: list[str] = []
        uniques: dict[str, list[str]] = {}
        for e in schema.expressions:
            if isinstance(e, exp.ColumnDef):
                col = column_from_def(f"{db}.{name}", e, charset)
                cols.append(col)
                for cons in e.constraints:
                    kind = cons.args.get("kind")
                    if isinstance(kind, exp.PrimaryKeyColumnConstraint):
                        pk = [col.name]
                    elif isinstance(kind, exp.UniqueColumnConstraint):
                        uniques[_unique_name(uniques, [col.name])] = [col.name]
            elif isinstance(e, exp.PrimaryKey):
                pk = _key_names(e)
            elif isinstance(e, exp.UniqueColumnConstraint):
                key_cols = _key_names(e.this) if isinstance(e.this, exp.Schema) else _key_names(e)
                key_name = e.this.name if isinstance(e.this, exp.Schema) and e.this.this else ""
                uniques[key_name or _unique_name(uniques, key_cols)] = key_cols
            elif isinstance(e, exp.Constraint):
                for c in e.expressions:
                    if isinstance(c, exp.PrimaryKey):
                        pk = _key_names(c)
        names = {c.name.lower(): c.name for c in cols}
        pk = [names.get(k.lower(), k) for k in pk]
        for c in cols:
            if c.name in pk:
                c.nullable = False
        uniques = {k: [names.get(c.lower(), c) for c in v] for k, v in uniques.items()}
        return SourceTable(db=db, name=name, columns=cols, primary_key=pk, unique_keys=uniques, charset=charset)

    def apply(self, sql: str, default_db: str, wanted: TableFilter, when: dt.datetime | None = None
              ) -> list[DdlChange]:
        """Apply one DDL statement to the catalog; return the changes to tracked tables.

        Statements that touch no tracked table (users, grants, views, other
        databases) return nothing. A statement that does touch one but that the
        parser cannot follow is refused with the statement in the message: a
        silently wrong definition would decode every later row wrongly. ``when``: the
        statement's time (naive UTC), what an added column's CURRENT_TIMESTAMP gave the
        rows that existed."""
        try:
            stmt = sqlglot.parse_one(sql, read="mysql")
        except sqlglot.errors.ParseError as exc:
            return self._unparsed(sql, default_db, wanted, str(exc).splitlines()[0])
        if isinstance(stmt, exp.Create):
            kind = (stmt.args.get("kind") or "").upper()
            if kind == "TABLE":
                t = self.create_table(stmt, default_db)
                if not wanted(t.db, t.name) or self.get(t.db, t.name) is not None:
                    # Untracked, or CREATE TABLE IF NOT EXISTS of a table we have.
                    return []
                return [DdlChange(t.db, t.name, t, None)]
            if kind in ("DATABASE", "SCHEMA"):
                charset = "utf8mb4"
                props = stmt.args.get("properties")
                for p in props.expressions if props is not None else []:
                    if isinstance(p, exp.CharacterSetProperty):
                        charset = p.this.name.lower()
                self.db_charsets[stmt.this.name.lower()] = charset
                return []
            if kind == "INDEX":
                index = stmt.this
                db, name = _table_ref(index.args["table"], default_db)
                old = self.get(db, name)
                if old is None or not wanted(db, name) or not stmt.args.get("unique"):
                    return []
                new = _copy(old)
                params = index.args.get("params")
                new.unique_keys[index.name] = [_col_name(new, c) for c in _key_names(params)] if params else []
                return [DdlChange(db, name, new, old)]
            return []
        if isinstance(stmt, exp.Drop):
            kind = (stmt.args.get("kind") or "").upper()
            if kind == "TABLE":
                out = []
                for t in stmt.args.get("tables") or []:
                    db, name = _table_ref(t, default_db)
                    old = self.get(db, name)
                    if old is not None and wanted(db, name):
                        out.append(DdlChange(db, name, None, old))
                return out
            if kind in ("DATABASE", "SCHEMA"):
                db = stmt.this.name if stmt.this is not None else ""
                return [DdlChange(t.db, t.name, None, t) for t in list(self.tables.values())
                        if t.db.lower() == db.lower()]
            if kind == "INDEX":
                on = stmt.args.get("cluster")
                table = on.this if on is not None else None
                if not isinstance(table, exp.Table):
                    return []
                db, name = _table_ref(table, default_db)
                old = self.get(db, name)
                if old is None or not wanted(db, name):
                    return []
                key = stmt.args["tables"][0].name
                new = _copy(old)
                if key.upper() == "PRIMARY":
                    new.primary_key = []
                new.unique_keys.pop(key, None)
                return [DdlChange(db, name, new, old)]
            return []
        if isinstance(stmt, exp.TruncateTable):
            out = []
            for t in stmt.expressions:
                db, name = _table_ref(t, default_db)
                old = self.get(db, name)
                if old is not None and wanted(db, name):
                    out.append(DdlChange(db, name, _copy(old), old, truncated=True))
            return out
        if isinstance(stmt, exp.Alter):
            if (stmt.args.get("kind") or "").upper() != "TABLE":
                return []
            db, name = _table_ref(stmt.this, default_db)
            old = self.get(db, name)
            if old is None or not wanted(db, name):
                return []
            return [self._alter(old, stmt, sql, when)]
        if isinstance(stmt, exp.Command) and stmt.name.upper() == "RENAME":
            return self._rename(str(stmt.expression.name), default_db, wanted, sql)
        return self._unparsed(sql, default_db, wanted, "not a statement the source understands")

    def _unparsed(self, sql: str, default_db: str, wanted: TableFilter, why: str) -> list[DdlChange]:
        words = sql.strip().split(None, 3)
        head = " ".join(w.upper() for w in words[:2])
        if head in ("ALTER TABLE", "CREATE TABLE", "DROP TABLE", "RENAME TABLE", "TRUNCATE TABLE"):
            # Only a statement on a table we track (or want) matters; read its name from the tokens.
            try:
                toks = [t.text.strip("`") for t in sqlglot.tokenize(sql, read="mysql")[2:6]]
            except sqlglot.errors.TokenError:
                toks = []
            while toks and toks[0].upper() in ("IF", "NOT", "EXISTS", "IGNORE", "ONLINE"):
                toks.pop(0)
            if toks:
                db, name = (toks[0], toks[2]) if len(toks) > 2 and toks[1] == "." else (default_db, toks[0])
                if not wanted(db, name) or (head != "CREATE TABLE" and self.get(db, name) is None):
                    return []
            raise errors.FailedPrecondition(
                f"cannot follow DDL {sql.strip()[:200]!r} ({why}); the table definitions would go wrong, so the "
                "source stops here: exclude the table with --tables or restart from a snapshot after it"
            )
        return []

    def _alter(self, old: SourceTable, stmt: exp.Alter, sql: str, when: dt.datetime | None = None) -> DdlChange:
        new = _copy(old)
        renames: dict[str, str] = {}
        for action in stmt.args.get("actions") or []:
            if isinstance(action, exp.ColumnDef):
                col = column_from_def(new.full_name, action, new.charset)
                _insert_column(new, col, action.args.get("position"))
                # What the rows existing now get (``coldefault``): a "now" default evaluated
                # at this statement, or the type's implicit default of a NOT NULL column.
                if col.default_expr and col.default is not None and coldefault.is_now(col.default):
                    col.existing = when.isoformat(sep=" ") if when is not None and col.kind == "datetime" else None
                elif col.default is None and not col.nullable:
                    col.existing = implicit_default(col)
                for cons in action.constraints:
                    if isinstance(cons.args.get("kind"), exp.PrimaryKeyColumnConstraint):
                        new.primary_key = [col.name]
                        col.nullable = False
            elif isinstance(action, exp.ModifyColumn):
                cd = action.this
                src = action.args.get("rename_from")
                old_name = _col_name(new, src.name if src is not None else cd.name)
                col = column_from_def(new.full_name, cd, new.charset)
                idx = [c.name for c in new.columns].index(old_name)
                new.columns.pop(idx)
                if col.name != old_name:
                    renames[old_name] = col.name
                    _rename_refs(new, old_name, col.name)
                if col.name in new.primary_key:
                    col.nullable = False
                pos = action.args.get("position") or cd.args.get("position")
                if pos is None:
                    new.columns.insert(idx, col)
                else:
                    _insert_column(new, col, pos)
            elif isinstance(action, exp.RenameColumn):
                o = _col_name(new, action.this.name)
                n = action.args["to"].name
                new.column(o).name = n
                renames[o] = n
                _rename_refs(new, o, n)
            elif isinstance(action, exp.Drop):
                kind = (action.args.get("kind") or "").upper()
                target = action.args["tables"][0].name if action.args.get("tables") else action.name
                if kind == "COLUMN":
                    n = _col_name(new, target)
                    new.columns = [c for c in new.columns if c.name != n]
                    new.column_ids.pop(n, None)  # retired for good, even if re-added by this statement
                    new.primary_key = [k for k in new.primary_key if k != n]
                    new.unique_keys = {k: [c for c in v if c != n] for k, v in new.unique_keys.items()}
                    new.unique_keys = {k: v for k, v in new.unique_keys.items() if v}
                elif kind in ("INDEX", "KEY"):
                    new.unique_keys.pop(target, None)
                elif kind == "PRIMARY KEY" or target.upper() == "PRIMARY":
                    new.primary_key = []
                else:
                    raise errors.FailedPrecondition(f"cannot follow {sql.strip()[:200]!r}: DROP {kind} not supported")
            elif isinstance(action, exp.AddConstraint):
                for c in action.expressions:
                    if isinstance(c, exp.PrimaryKey):
                        new.primary_key = [_col_name(new, k) for k in _key_names(c)]
                        for k in new.primary_key:
                            new.column(k).nullable = False
                    elif isinstance(c, exp.UniqueColumnConstraint):
                        schema = c.this
                        cols = [_col_name(new, k) for k in _key_names(schema)]
                        key = schema.this.name if isinstance(schema, exp.Schema) and schema.this else ""
                        new.unique_keys[key or _unique_name(new.unique_keys, cols)] = cols
                    elif isinstance(c, exp.Constraint):
                        for inner in c.expressions:
                            if isinstance(inner, exp.PrimaryKey):
                                new.primary_key = [_col_name(new, k) for k in _key_names(inner)]
            elif isinstance(action, exp.AlterRename):
                target = action.this
                new.db, new.name = _table_ref(target, new.db) if isinstance(target, exp.Table) else (new.db,
                                                                                                     target.name)
            elif isinstance(action, exp.AlterColumn):
                if action.args.get("dtype") is not None or action.args.get("allow_null") is not None:
                    raise errors.FailedPrecondition(f"cannot follow {sql.strip()[:200]!r}: ALTER COLUMN form")
                # SET/DROP DEFAULT: only rows inserted later take it (rows decode as before).
                target_col = new.column(action.this.name)
                if action.args.get("drop"):
                    target_col.default, target_col.default_expr = None, False
                elif action.args.get("default") is not None:
                    target_col.default, target_col.default_expr = default_text(action.args["default"])
            elif isinstance(action, (exp.Command, exp.Property, exp.Properties)) or action.__class__.__name__ in (
                "AlterIndex", "AlterSet", "AlterDistStyle",
            ):
                continue  # ENGINE=, COMMENT=, ALGORITHM=, index visibility: no effect on rows
            else:
                raise errors.FailedPrecondition(
                    f"cannot follow DDL {sql.strip()[:200]!r} ({action.__class__.__name__} not supported); the "
                    "source stops rather than decode rows with a wrong definition"
                )
        for o, n in renames.items():
            if o in new.column_ids:
                new.column_ids[n] = new.column_ids.pop(o)
        return DdlChange(old.db, old.name, new, old)

    def _rename(self, text: str, default_db: str, wanted: TableFilter, sql: str) -> list[DdlChange]:
        # RENAME TABLE a TO b[, c TO d]: sqlglot keeps it as a command; read its tokens.
        toks = [t for t in sqlglot.tokenize(text, read="mysql")]
        if not toks or toks[0].text.upper() != "TABLE":
            return []
        pairs: list[tuple[tuple[str, str], tuple[str, str]]] = []
        names: list[list[str]] = [[]]
        for tok in toks[1:]:
            if tok.token_type == TokenType.COMMA:
                names.append([])
            elif tok.token_type == TokenType.DOT:
                continue
            else:
                names[-1].append(tok.text)
        for group in names:
            if "TO" not in [g.upper() for g in group]:
                raise errors.FailedPrecondition(f"cannot follow DDL {sql.strip()[:200]!r}")
            i = [g.upper() for g in group].index("TO")
            a, b = group[:i], group[i + 1:]
            src = (a[0], a[1]) if len(a) == 2 else (default_db, a[0])
            dst = (b[0], b[1]) if len(b) == 2 else (default_db, b[0])
            pairs.append((src, dst))
        out = []
        for (sdb, sname), (ddb, dname) in pairs:
            old = self.get(sdb, sname)
            if old is None or not wanted(sdb, sname):
                continue
            new = _copy(old)
            new.db, new.name = ddb, dname
            out.append(DdlChange(sdb, sname, new if wanted(ddb, dname) else None, old))
        return out


def _copy(t: SourceTable) -> SourceTable:
    return SourceTable.from_json(t.to_json())


def _col_name(t: SourceTable, name: str) -> str:
    return t.column(name).name


def _rename_refs(t: SourceTable, old: str, new: str) -> None:
    t.primary_key = [new if k == old else k for k in t.primary_key]
    t.unique_keys = {k: [new if c == old else c for c in v] for k, v in t.unique_keys.items()}


def _insert_column(t: SourceTable, col: SourceColumn, position: exp.Expression | None) -> None:
    if any(c.name.lower() == col.name.lower() for c in t.columns):
        raise errors.FailedPrecondition(f"table {t.full_name} already has a column {col.name}")
    if position is None:
        t.columns.append(col)
        return
    where = str(position.args.get("position") or "").upper()
    if where == "FIRST":
        t.columns.insert(0, col)
        return
    after = _col_name(t, position.this.name)
    idx = [c.name for c in t.columns].index(after)
    t.columns.insert(idx + 1, col)
