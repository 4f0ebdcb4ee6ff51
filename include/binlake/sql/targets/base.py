"""The ``Target`` interface: everything binlake needs from one kind of database.

A database binlake writes to (an apply's target, a restore's target, a scratch
database of ``binlake diff``) or writes through (the upstream writer) is one
subclass of ``Target`` in a module of its own (``sqlite``, ``postgresql``,
``mysql``, ``duckdb``), registered in ``binlake.sql.targets``. As a Drainer's
``Syncer``: a new database is one module plus its registration, and apply,
restore, diff and the checksums go through this interface only.

What a database module says:

* **its URLs** (``schemes``, ``drivers``) and how an engine for it is set up
  (``engine_options``, ``prepare_engine``);
* **its types** (``sa_type``) and the literals of its SQL (``default_sql``,
  ``literal``): what every column type of binlake's codec becomes, so a value
  reads back exactly as written;
* **its DDL**: create, alter (add/drop/rename/retype a column, change a default,
  unique keys), rename, truncate, drop; and whether DDL runs inside a
  transaction (``transactional_ddl``);
* **its batch writes** (``insert_rows``, ``insert_arrow``, ``upsert_rows``,
  ``delete_keys``, ``delete_one``, ``existing_keys``): whole batches, never a
  statement per row;
* **what it can do** (``native_arrow``, ``concurrent_writers``,
  ``snapshot_isolation``): the apply, the restore and diff choose their path by
  these flags, never by a database's name.

The class methods need no connection (the upstream writer renders its DDL with
them); an instance holds an engine (a pool of connections to one database).
The checkpoint table and ``_binlake_schema`` live in the target and are written
in the same transaction as the data they describe, so every target must run
DML in transactions (all four do); ``transactional_ddl`` only says whether DDL
joins them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from binlake import codec, coldefault, config, errors
from binlake.proto import binlog_pb2
from binlake.sql.schema import ColumnDef, column_def

# _binlake_schema in a target: one row per table binlake created, keyed by table_id.
# Invariant: ``info`` is the definition the target table ``name`` has now (``name``
# is the target's name, which a route may have changed), written in the same
# transaction as the DDL where the database's DDL is transactional, right after it otherwise.
SCHEMA_TABLE = "_binlake_schema"
# Every table of binlake's own in a database starts with this (checkpoints, claims, schema).
INTERNAL_PREFIX = "_binlake_"

IF_EXISTS = ("fail", "skip", "replace")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
# Bound parameters per statement stay below every database's limit (SQLite 32766,
# PostgreSQL 65535); 1,000 rows a statement is where larger batches stop paying.
MAX_PARAMS = 30_000
MAX_ROWS = 1_000

_md = sa.MetaData()
schema_table = sa.Table(SCHEMA_TABLE, _md,
                        sa.Column("table_id", sa.BigInteger, primary_key=True, autoincrement=False),
                        sa.Column("name", sa.String(128), nullable=False),
                        sa.Column("info", sa.LargeBinary, nullable=False),
                        sa.Column("dropped", sa.Boolean(create_constraint=False), nullable=False))


class DecimalText(sa.types.TypeDecorator[Any]):
    """Exact decimals kept as their text, where the database has no decimal type wide
    enough (SQLite has none; DuckDB's stops at 38 digits)."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        return None if value is None else str(decimal.Decimal(value))

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return None if value is None else decimal.Decimal(value)


class Target:
    """One kind of database (the class) and one database of that kind (an instance)."""

    # ------------------------------------------------------------ what a module sets
    name: ClassVar[str] = ""
    """SQLAlchemy's dialect name for this database (``engine.dialect.name``)."""
    title: ClassVar[str] = ""
    """How messages name the database."""
    schemes: ClassVar[Mapping[str, str]] = {}
    """URL scheme a user may write -> the SQLAlchemy driver binlake uses for it."""
    drivers: ClassVar[frozenset[str]] = frozenset()
    """Explicit SQLAlchemy driver names accepted as they are."""
    example_url: ClassVar[str] = ""
    transactional_ddl: ClassVar[bool] = True
    """DDL runs inside the caller's transaction (else it commits at once)."""
    native_arrow: ClassVar[bool] = False
    """``insert_arrow`` writes Arrow columns without building Python rows (the apply's fast path)."""
    concurrent_writers: ClassVar[bool] = True
    """Several connections can write at once without waiting on one lock (a restore's parallel loads)."""
    snapshot_isolation: ClassVar[str | None] = None
    """The isolation level that makes one connection's reads one snapshot (None: the default already does)."""
    alter_keeps_indexes: ClassVar[bool] = True
    """ALTER TABLE (rename, drop or retype a column, rename the table) works on a table that
    has secondary indexes; else the apply drops them first and creates them again after."""
    file_database: ClassVar[bool] = False
    """The URL names a file (its directory is created; an in-memory database is refused)."""
    namespace: ClassVar[str | None] = None
    """What one database of this kind holds tables in ("schema" in PostgreSQL, "database" in
    MySQL/MariaDB), where ``restore --into-schema`` puts them; None: a flat list of tables."""
    name_bytes: ClassVar[int | None] = None
    """The longest name (in UTF-8 bytes) the database keeps as written (None: no limit that matters)."""
    name_chars: ClassVar[int | None] = None
    """The longest name in characters (None: no limit that matters)."""
    reserved_prefixes: ClassVar[tuple[str, ...]] = ()
    """Name prefixes the database keeps for itself (compared without case)."""
    names_ignore_case: ClassVar[bool] = False
    """Table names that differ only in ASCII case are one table (SQLite, DuckDB)."""

    # ------------------------------------------------------------ URLs and engines
    @classmethod
    def prepare_url(cls, url: sa.engine.URL) -> sa.engine.URL:
        """``url`` checked and completed for this database (``errors.InvalidArgument`` when unusable)."""
        if cls.file_database and (not url.database or url.database == ":memory:"):
            scheme = next(iter(cls.schemes), cls.name)
            raise errors.InvalidArgument(
                f"target {scheme}:// needs a file path ({scheme}:///PATH): an in-memory database would "
                "vanish with the connection")
        return url

    @classmethod
    def engine_options(cls, url: sa.engine.URL) -> dict[str, Any]:
        """Keyword arguments of ``sqlalchemy.create_engine`` for ``url`` (a file database's
        directory is created here)."""
        if cls.file_database:
            pathlib.Path(url.database or "").parent.mkdir(parents=True, exist_ok=True)
        return {"pool_pre_ping": True}

    @classmethod
    def prepare_engine(cls, engine: Engine, *, writer: bool = True) -> None:
        """Set up a new engine (event listeners) before its first connection. ``writer``:
        the engine writes (an apply, a restore); else it only reads (diff, checksums),
        and must not take a writer's locks."""

    # ------------------------------------------------------------ names and namespaces
    @classmethod
    def name_problem(cls, name: str, namespace: bool = False) -> str | None:
        """Why ``name`` cannot name a table (``namespace``: a schema/database) that binlake
        creates in this kind of database and finds again under that name; None when it can.
        A name the database would cut short, or one binlake keeps for its own tables, is
        refused rather than changed."""
        if not isinstance(name, str) or not name:
            return "is empty"
        if name != name.strip():
            return "begins or ends with a space"
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
            return "holds a control character"
        if name.lower().startswith(INTERNAL_PREFIX):
            return f"begins with {INTERNAL_PREFIX}, which binlake keeps for its own tables"
        for prefix in cls.reserved_prefixes:
            if name.lower().startswith(prefix):
                return f"begins with {prefix}, which {cls.title} keeps for itself"
        if cls.name_bytes is not None and len(name.encode()) > cls.name_bytes:
            return (f"is {len(name.encode())} bytes long; {cls.title} keeps {cls.name_bytes} "
                    "and would cut the rest")
        if cls.name_chars is not None and len(name) > cls.name_chars:
            return f"is {len(name)} characters long; {cls.title} takes at most {cls.name_chars}"
        return None

    @classmethod
    def namespace_url(cls, url: sa.engine.URL, name: str) -> sa.engine.URL:
        """The URL of the same database with namespace ``name`` as the one unqualified
        names land in (so every method here works in it unchanged)."""
        raise errors.FailedPrecondition(f"{cls.title} has no schemas: restore into another database file, "
                                        "or give the tables other names with --rename")

    @classmethod
    def create_namespace_sql(cls, engine: Engine, name: str) -> list[str]:
        raise errors.FailedPrecondition(f"{cls.title} has no schemas")

    current_namespace_sql: ClassVar[str | None] = None
    """The query of the namespace unqualified names land in (with ``namespace``)."""
    has_namespace_sql: ClassVar[str | None] = None
    """The query that finds namespace ``:n`` (a row when it exists)."""

    def current_namespace(self) -> str | None:
        """The namespace unqualified names land in now (None where there are none)."""
        if self.current_namespace_sql is None:
            return None
        with self.engine.connect() as conn:
            found = conn.exec_driver_sql(self.current_namespace_sql).scalar()
        return None if found is None else str(found)

    def has_namespace(self, name: str) -> bool:
        """Whether namespace ``name`` exists."""
        if self.has_namespace_sql is None:
            return False
        with self.engine.connect() as conn:
            return conn.execute(sa.text(self.has_namespace_sql), {"n": name}).first() is not None

    def name_key(self, name: str) -> str:
        """What two names that are one table here have in common: the name as written
        (binlake quotes every one), in lower case where ``names_ignore_case``."""
        return name.translate(_ASCII_LOWER) if self.names_ignore_case else name

    # ------------------------------------------------------------ types and literals
    @classmethod
    def sa_type(cls, col: ColumnDef, keyed: bool = False) -> sa.types.TypeEngine[Any]:
        """The column type ``col`` (a binlake codec type) is stored as, so every value the
        codec accepts reads back equal. The base gives SQL's standard types."""
        t = col.type
        if t == "int":
            return sa.BigInteger()
        if t == "uint":
            return sa.Numeric(20, 0)
        if t == "bool":
            return sa.Boolean(create_constraint=False)
        if t == "float":
            return sa.Double()
        if t == "decimal":
            return sa.Numeric(col.precision, col.scale, asdecimal=True)
        if t == "string":
            return sa.String(col.length) if col.length else sa.Text()
        if t == "bytes":
            return sa.LargeBinary()
        if t == "date":
            return sa.Date()
        if t == "datetime":
            return sa.DateTime()
        if t == "time":
            return sa.Time()
        if t == "json":
            # none_as_null: Python None is SQL NULL, as the codec has it (is_null). The
            # default would store a JSON 'null' document, so `col IS NULL` in the
            # upstream would disagree with the binlog and with every restored target.
            return sa.JSON(none_as_null=True)
        raise errors.InvalidArgument(f"column {col.name}: unknown type {t}")

    @classmethod
    def quote_text(cls, text: str) -> str:
        """``text`` as a string literal of this database's SQL."""
        return "'" + text.replace("'", "''") + "'"

    @classmethod
    def bool_literal(cls, value: bool) -> str:
        return "TRUE" if value else "FALSE"

    @classmethod
    def bytes_literal(cls, value: bytes) -> str:
        return f"X'{value.hex()}'"

    @classmethod
    def text_stored(cls, col: ColumnDef) -> bool:
        """Whether values of ``col`` are kept as text (their literals are then quoted)."""
        return False

    @classmethod
    def json_default(cls, text: str) -> str:
        return cls.quote_text(text)

    @classmethod
    def now_default(cls, col: ColumnDef) -> str:
        """The DEFAULT of a date/time column that upstream defaults to "now"."""
        if col.type == "date":
            return "CURRENT_DATE"
        if col.type == "time":
            return "CURRENT_TIME"
        return "CURRENT_TIMESTAMP"

    @classmethod
    def default_sql(cls, col: ColumnDef) -> str | None:
        """The DEFAULT clause's value for ``col``, None when it has none a target can be
        given: a constant in the form this database stores the column's values in (what
        ``sa_type`` chose), or the current date/time for a "now" expression. Other
        expressions (``nextval(...)``, ``uuid()``) exist only upstream: None."""
        if col.default_expr is not None:
            if not coldefault.is_now(col.default_expr) or col.type not in ("datetime", "date", "time"):
                return None
            return cls.now_default(col)
        v = col.default
        if v is None:
            return None
        t = col.type
        if t == "bool":
            return cls.bool_literal(bool(v))
        if t in ("int", "float"):
            return repr(float(v)) if t == "float" else str(int(v))
        if t in ("uint", "decimal"):
            text = str(decimal.Decimal(v)) if t == "decimal" else str(int(v))
            return cls.quote_text(text) if cls.text_stored(col) else text
        if t == "string":
            return cls.quote_text(str(v))
        if t == "bytes":
            return cls.bytes_literal(bytes(v))
        if t == "date":
            return cls.quote_text(v.isoformat())
        if t == "datetime":
            if isinstance(v, dt.datetime) and v.tzinfo is not None:
                v = v.astimezone(dt.UTC).replace(tzinfo=None)
            return cls.quote_text(v.isoformat(sep=" ", timespec="microseconds"))
        if t == "time":
            if isinstance(v, dt.timedelta):
                v = (dt.datetime(1970, 1, 1) + v).time()
            return cls.quote_text(v.isoformat(timespec="microseconds"))
        if t == "json":
            text = v if isinstance(v, str) else json.dumps(v, sort_keys=True, separators=(",", ":"),
                                                           ensure_ascii=False)
            return cls.json_default(text)
        raise errors.InvalidArgument(f"column {col.name}: unknown type {t}")

    @classmethod
    def literal(cls, value: Any) -> str:
        """A Python value (as the drivers hand them back) as a literal of this database's
        SQL, for statements written to a file (``binlake diff --fix-sql``)."""
        if value is None:
            return "NULL"
        if isinstance(value, bool):
            return cls.bool_literal(value)
        if isinstance(value, int):
            return str(value)
        if isinstance(value, float):
            return repr(value)
        if isinstance(value, decimal.Decimal):
            return str(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return cls.bytes_literal(bytes(value))
        if isinstance(value, dt.datetime):
            text = value.isoformat(sep=" ", timespec="microseconds")
        elif isinstance(value, (dt.date, dt.time)):
            text = value.isoformat()
        elif isinstance(value, (dict, list)):
            text = codec.canonical_json(value)
        else:
            text = str(value)
        return cls.quote_text(text)

    @classmethod
    def table_options(cls) -> dict[str, Any]:
        """Keyword arguments of ``sqlalchemy.Table`` (a storage engine, a charset)."""
        return {}

    @classmethod
    def sa_table(cls, info: binlog_pb2.TableInfo, metadata: sa.MetaData | None = None) -> sa.Table:
        """A SQLAlchemy Table for ``info`` (for DML and CREATE TABLE)."""
        md = metadata or sa.MetaData()
        pk = set(info.primary_key)
        cols = []
        for ci in info.columns:
            cd = column_def(ci)
            default = cls.default_sql(cd)
            cols.append(sa.Column(ci.name, cls.sa_type(cd), primary_key=ci.id in pk,
                                  nullable=ci.nullable, autoincrement=False,
                                  server_default=sa.text(default) if default is not None else None))
        # Unique keys are created as separate unique indexes (see create_table_sql):
        # that is the one form every database can later drop by name.
        return sa.Table(info.name, md, *cols, **cls.table_options())

    # ------------------------------------------------------------ the catalog
    @classmethod
    def column_names(cls, conn: Connection, table: str) -> list[str]:
        """The columns table ``table`` has now, in order."""
        return [str(c["name"]) for c in sa.inspect(conn).get_columns(table)]

    @classmethod
    def index_names(cls, conn: Connection, table: str) -> set[str]:
        """The names of table ``table``'s indexes and unique constraints."""
        insp = sa.inspect(conn)
        names = {str(i["name"]) for i in insp.get_indexes(table) if i.get("name")}
        names |= {str(u["name"]) for u in insp.get_unique_constraints(table) if u.get("name")}
        return names

    @classmethod
    def unique_keys(cls, conn: Connection, table: str) -> list[list[str]]:
        """The column lists of table ``table``'s unique constraints and unique indexes."""
        insp = sa.inspect(conn)
        found = insp.get_unique_constraints(table) + [i for i in insp.get_indexes(table) if i.get("unique")]
        return [[str(c) for c in uk["column_names"] if c] for uk in found]

    @classmethod
    def reflect(cls, conn: Connection, table: str) -> sa.Table:
        """Table ``table`` as the database describes it (one binlake did not create)."""
        return sa.Table(table, sa.MetaData(), autoload_with=conn)

    # ------------------------------------------------------------ DDL
    @staticmethod
    def q(engine: Engine | Connection, name: str) -> str:
        """``name`` quoted as an identifier of ``engine``'s SQL."""
        return engine.dialect.identifier_preparer.quote(name)

    @classmethod
    def type_sql(cls, engine: Engine, col: ColumnDef) -> str:
        return cls.sa_type(col).compile(dialect=engine.dialect)

    @classmethod
    def create_table_sql(cls, engine: Engine, info: binlog_pb2.TableInfo) -> list[str]:
        from sqlalchemy.schema import CreateTable

        stmts = [str(CreateTable(cls.sa_table(info)).compile(dialect=engine.dialect)).strip()]
        by_id = {c.id: c.name for c in info.columns}
        for k in info.unique_keys:
            stmts += cls.add_unique_key_sql(engine, info.name, k.name, [by_id[i] for i in k.column_ids])
        return stmts

    @classmethod
    def add_column_sql(cls, engine: Engine, table: str, col: ColumnDef, fill: Any = None) -> list[str]:
        """ADD COLUMN with its DEFAULT, which the database gives the rows that exist.
        ``fill``: the value those rows hold upstream when its DEFAULT alone does not say
        (an expression the upstream evaluated at its ALTER): the column is added with it
        as a constant default, then given its own."""
        t, c = cls.q(engine, table), cls.q(engine, col.name)
        own = cls.default_sql(col)
        first = own
        if fill is not None and (col.default is None or col.default != fill):
            first = cls.default_sql(dataclasses.replace(col, default=fill, default_expr=None))
        null = "NULL" if col.nullable or first is None else "NOT NULL"
        stmts = [f"ALTER TABLE {t} ADD COLUMN {c} {cls.type_sql(engine, col)}"
                 + (f" DEFAULT {first}" if first is not None else "") + f" {null}"]
        if first != own:
            stmts += cls.own_default_after_fill(engine, table, col)
        return stmts

    @classmethod
    def own_default_after_fill(cls, engine: Engine, table: str, col: ColumnDef) -> list[str]:
        """After a column was added with a fill value as its default: its own default."""
        return cls.set_default_sql(engine, table, col)

    @classmethod
    def set_default_sql(cls, engine: Engine, table: str, col: ColumnDef,
                        info: binlog_pb2.TableInfo | None = None) -> list[str]:
        """``col``'s DEFAULT as its definition now has it (none: DROP DEFAULT); rows that
        exist keep their values. ``info``: the table's new definition (for a database
        that must rebuild the table)."""
        t, c = cls.q(engine, table), cls.q(engine, col.name)
        value = cls.default_sql(col)
        return [f"ALTER TABLE {t} ALTER COLUMN {c} " + (f"SET DEFAULT {value}" if value is not None
                                                         else "DROP DEFAULT")]

    @classmethod
    def drop_column_sql(cls, engine: Engine, table: str, col: str) -> list[str]:
        return [f"ALTER TABLE {cls.q(engine, table)} DROP COLUMN {cls.q(engine, col)}"]

    @classmethod
    def rename_column_sql(cls, engine: Engine, table: str, old: str, new: str) -> list[str]:
        return [f"ALTER TABLE {cls.q(engine, table)} RENAME COLUMN {cls.q(engine, old)} TO {cls.q(engine, new)}"]

    @classmethod
    def change_column_type_sql(cls, engine: Engine, table: str, col: ColumnDef,
                               info: binlog_pb2.TableInfo | None = None) -> list[str]:
        """The column's new type (and nullability); ``info`` is the table's definition
        after the change (a database that rebuilds the table needs all of it)."""
        t, c = cls.q(engine, table), cls.q(engine, col.name)
        ty = cls.type_sql(engine, col)
        return [f"ALTER TABLE {t} ALTER COLUMN {c} TYPE {ty}",
                f"ALTER TABLE {t} ALTER COLUMN {c} {'DROP' if col.nullable else 'SET'} NOT NULL"]

    @classmethod
    def add_unique_key_sql(cls, engine: Engine, table: str, name: str, cols: list[str]) -> list[str]:
        collist = ", ".join(cls.q(engine, c) for c in cols)
        return [f"CREATE UNIQUE INDEX {cls.q(engine, name)} ON {cls.q(engine, table)} ({collist})"]

    @classmethod
    def drop_unique_key_sql(cls, engine: Engine, table: str, name: str) -> list[str]:
        return [f"DROP INDEX {cls.q(engine, name)}"]

    @classmethod
    def rename_table_sql(cls, engine: Engine, old: str, new: str) -> list[str]:
        return [f"ALTER TABLE {cls.q(engine, old)} RENAME TO {cls.q(engine, new)}"]

    @classmethod
    def truncate_table_sql(cls, engine: Engine, table: str) -> list[str]:
        return [f"TRUNCATE TABLE {cls.q(engine, table)}"]

    @classmethod
    def drop_table_sql(cls, engine: Engine, table: str) -> list[str]:
        return [f"DROP TABLE {cls.q(engine, table)}"]

    # ------------------------------------------------------------ one database
    def __init__(self, engine: Engine) -> None:
        if not isinstance(engine, sa.Engine):
            raise TypeError(f"engine must be a SQLAlchemy Engine, got {type(engine).__name__}")
        if engine.dialect.name != self.name:
            raise ValueError(f"{type(self).__name__} is for {self.name} databases, the engine is "
                             f"{engine.dialect.name}")
        self.engine = engine
        self.dialect: str = engine.dialect.name

    def __str__(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    __repr__ = __str__

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def snapshot(self, conn: Connection) -> Connection:
        """``conn`` set so its reads see one snapshot (checksums of several tables at one moment)."""
        if self.snapshot_isolation is None:
            return conn
        return conn.execution_options(isolation_level=self.snapshot_isolation)

    # ------------------------------------------------------------ schema
    def table_names(self) -> list[str]:
        return sa.inspect(self.engine).get_table_names()

    def has_table(self, name: str, conn: Connection | None = None) -> bool:
        return sa.inspect(conn if conn is not None else self.engine).has_table(name)

    def table(self, info: binlog_pb2.TableInfo) -> sa.Table:
        return self.sa_table(info)

    def create_table(self, info: binlog_pb2.TableInfo, *, if_exists: str = "fail") -> None:
        """Create ``info.name`` with binlake's column types and unique keys.
        ``if_exists``: "fail" (errors.FailedPrecondition), "skip" (leave it) or "replace"."""
        check_info(info)
        if if_exists not in IF_EXISTS:
            raise ValueError(f"if_exists must be one of {', '.join(IF_EXISTS)}, got {if_exists!r}")
        with self.engine.connect() as conn:
            conn.begin()
            self.create_table_in(conn, info, if_exists=if_exists)
            conn.commit()

    def create_table_in(self, conn: Connection, info: binlog_pb2.TableInfo, *, if_exists: str = "fail") -> bool:
        """``create_table`` inside the caller's transaction; whether a table was created."""
        if self.has_table(info.name, conn):
            if if_exists == "skip":
                return False
            if if_exists == "fail":
                raise errors.FailedPrecondition(
                    f"target {self} already has a table {info.name}: drop it, or load with if_exists='replace'")
            self.execute_ddl(conn, self.drop_table_sql(self.engine, info.name))
        self.execute_ddl(conn, self.create_table_sql(self.engine, info))
        self.record_schema(conn, info)
        return True

    def execute_ddl(self, conn: Connection, statements: Sequence[str]) -> None:
        for stmt in statements:
            conn.exec_driver_sql(stmt)

    def ensure_schema_table(self) -> None:
        """Create ``_binlake_schema`` now if missing, so concurrent table creations
        (a restore's parallel loads) do not race to create it."""
        with self.engine.connect() as conn:
            conn.begin()
            schema_table.create(conn, checkfirst=True)
            conn.commit()

    def record_schema(self, conn: Connection, info: binlog_pb2.TableInfo, *, dropped: bool = False) -> None:
        """Record ``info`` as the definition of target table ``info.name``."""
        schema_table.create(conn, checkfirst=True)
        conn.execute(schema_table.delete().where(sa.or_(schema_table.c.name == info.name,
                                                        schema_table.c.table_id == info.table_id)))
        if not dropped:
            conn.execute(schema_table.insert().values(table_id=info.table_id, name=info.name,
                                                      info=info.SerializeToString(), dropped=False))

    def forget_schema(self, conn: Connection, name: str) -> None:
        if self.has_table(SCHEMA_TABLE, conn):
            conn.execute(schema_table.delete().where(schema_table.c.name == name))

    def recorded_schema(self, conn: Connection | None = None) -> dict[str, binlog_pb2.TableInfo]:
        """Target table name -> the definition binlake recorded for it."""
        if conn is not None:
            return recorded_schema(conn)
        with self.engine.connect() as c:
            return recorded_schema(c)

    # ------------------------------------------------------------ rows
    def bulk_load(self, info: binlog_pb2.TableInfo, rows: Iterable[Mapping[str, Any]]) -> int:
        """Append ``rows`` (column name -> Python value; missing columns are NULL) to
        table ``info.name`` in one transaction; the number of rows loaded."""
        check_info(info)
        with self.engine.connect() as conn:
            conn.begin()
            n = self.insert_rows(conn, info, rows)
            conn.commit()
        return n

    def insert_rows(self, conn: Connection, info: binlog_pb2.TableInfo, rows: Iterable[Mapping[str, Any]]) -> int:
        """Plain INSERT of ``rows`` in the caller's transaction, in multi-row statements;
        the rows inserted. Memory holds one statement's rows."""
        names = [c.name for c in info.columns]
        table = self.table(info)
        n = 0
        for batch in batches(rows, names):
            conn.execute(table.insert(), batch)
            n += len(batch)
        return n

    def insert_arrow(self, conn: Connection, info: binlog_pb2.TableInfo, rows: pa.Table) -> int:
        """Append ``rows`` (an Arrow table, columns named as the target's, values as
        ``arrowcompact`` types them: decimals as their exact text) in the caller's
        transaction. The base goes through ``insert_rows``, one record batch of at most
        ``[memory] batch_rows`` rows converted to Python at a time; a database with
        ``native_arrow`` writes the columns as they are."""
        if not isinstance(rows, pa.Table):
            raise TypeError(f"rows must be a pyarrow Table, got {type(rows).__name__}")
        slices = rows.to_batches(max_chunksize=config.memory().batch_rows)
        return self.insert_rows(conn, info, (row for batch in slices for row in batch.to_pylist()))

    def insert_arrow_stream(self, conn: Connection, info: binlog_pb2.TableInfo, tables: Iterable[pa.Table]) -> int:
        """``insert_arrow`` of every table of ``tables`` (a stream of batches of one
        table's rows), in the caller's transaction; a database with a bulk statement
        (PostgreSQL's COPY) sends them all through one."""
        return sum(self.insert_arrow(conn, info, rows) for rows in tables)

    def upsert_statement(self, table: sa.Table, batch: list[dict[str, Any]], names: Sequence[str],
                         key: Sequence[str]) -> Any:
        """One multi-row insert-or-overwrite statement of ``batch`` on the primary key."""
        raise errors.FailedPrecondition(f"{self.title} targets cannot upsert (safe mode)")

    def upsert_rows(self, conn: Connection, info: binlog_pb2.TableInfo, rows: Iterable[Mapping[str, Any]]) -> int:
        """Multi-row upsert on the primary key (insert, or overwrite every column)."""
        table = self.table(info)
        names = [c.name for c in info.columns]
        key = key_names(info)
        n = 0
        for batch in batches(rows, names):
            conn.execute(self.upsert_statement(table, batch, names, key))
            n += len(batch)
        return n

    def delete_keys(self, conn: Connection, info: binlog_pb2.TableInfo, keys: Sequence[tuple[Any, ...]]) -> int:
        """``DELETE ... WHERE key IN (...)`` in batches; the number of rows deleted."""
        table = self.table(info)
        names = key_names(info)
        cols = [table.c[name] for name in names]
        if not keys:
            return 0
        per = max(1, min(MAX_ROWS, MAX_PARAMS // len(cols)))
        n = 0
        for i in range(0, len(keys), per):
            chunk = list(keys[i:i + per])
            if len(cols) == 1:
                clause = cols[0].in_([k[0] for k in chunk])
            else:
                clause = sa.tuple_(*cols).in_(chunk)
            n += conn.execute(table.delete().where(clause)).rowcount
        return n

    def existing_keys(self, conn: Connection, info: binlog_pb2.TableInfo,
                      keys: Sequence[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
        """Which of ``keys`` the target table holds (as the target returns them)."""
        table = self.table(info)
        cols = [table.c[name] for name in key_names(info)]
        found: set[tuple[Any, ...]] = set()
        per = max(1, min(MAX_ROWS, MAX_PARAMS // len(cols)))
        for i in range(0, len(keys), per):
            chunk = list(keys[i:i + per])
            clause = cols[0].in_([k[0] for k in chunk]) if len(cols) == 1 else sa.tuple_(*cols).in_(chunk)
            found.update(tuple(r) for r in conn.execute(sa.select(*cols).where(clause)))
        return found

    def rows_of_keys(self, conn: Connection, info: binlog_pb2.TableInfo, keys: Sequence[tuple[Any, ...]], *,
                     lock: bool = False) -> list[dict[str, Any]]:
        """The rows of table ``info.name`` whose primary key is one of ``keys`` (column name ->
        value as the target returns it). ``lock``: take the rows' write locks too (SELECT ...
        FOR UPDATE, where ``row_locks``), so nothing changes them before the transaction ends."""
        table = self.table(info)
        cols = [table.c[name] for name in key_names(info)]
        out: list[dict[str, Any]] = []
        per = max(1, min(MAX_ROWS, MAX_PARAMS // len(cols)))
        for i in range(0, len(keys), per):
            chunk = list(keys[i:i + per])
            clause = cols[0].in_([k[0] for k in chunk]) if len(cols) == 1 else sa.tuple_(*cols).in_(chunk)
            query = sa.select(table).where(clause)
            if lock and self.row_locks:
                query = query.with_for_update()
            out.extend(dict(r._mapping) for r in conn.execute(query))
        return out

    row_locks: ClassVar[bool] = True
    """SELECT ... FOR UPDATE locks rows (where the database has no such clause, its
    transaction's own lock already keeps other writers out)."""

    row_id: ClassVar[str] = "rowid"
    """The pseudo-column that names one physical row (a keyless table's delete)."""

    def delete_one(self, conn: Connection, info: binlog_pb2.TableInfo, row: Mapping[str, Any]) -> int:
        """Delete one row equal to ``row`` in every column (tables without a key)."""
        table = self.table(info)
        cond = row_condition(table, info, row)
        rid: sa.ColumnElement[Any] = sa.literal_column(self.row_id)
        inner = sa.select(rid).select_from(table).where(cond).limit(1).scalar_subquery()
        return conn.execute(table.delete().where(rid == inner)).rowcount


# ---------------------------------------------------------------- shared helpers
def key_names(info: binlog_pb2.TableInfo) -> list[str]:
    """The primary key's column names (``errors.FailedPrecondition`` for a keyless table)."""
    by_id = {c.id: c.name for c in info.columns}
    names = [by_id[i] for i in info.primary_key]
    if not names:
        raise errors.FailedPrecondition(f"table {info.name} has no primary key")
    return names


def check_info(info: Any) -> None:
    if not isinstance(info, binlog_pb2.TableInfo):
        raise TypeError(f"info must be a binlog_pb2.TableInfo, got {type(info).__name__}")
    if not info.name or not info.columns:
        raise ValueError("info must name the table and list its columns")


def row_condition(table: sa.Table, info: binlog_pb2.TableInfo, row: Mapping[str, Any]) -> sa.ColumnElement[bool]:
    """Every column equal to ``row``'s value (NULL: IS NULL); JSON columns, which not
    every database compares, are left out."""
    return sa.and_(*[table.c[c.name].is_(None) if row.get(c.name) is None
                     else table.c[c.name] == row[c.name] for c in info.columns
                     if c.type != binlog_pb2.JSON])


def on_conflict_upsert(insert: Any, names: Sequence[str], key: Sequence[str]) -> Any:
    """``insert`` (an ``INSERT ... ON CONFLICT`` construct: PostgreSQL's, SQLite's) made to
    overwrite every non-key column of a row whose key exists (or to skip it, when every
    column is the key)."""
    if len(names) == len(key):
        return insert.on_conflict_do_nothing(index_elements=list(key))
    return insert.on_conflict_do_update(index_elements=list(key),
                                        set_={c: insert.excluded[c] for c in names if c not in key})


def bind_processors(table: sa.Table, names: Sequence[str], conn: Connection) -> list[Any]:
    """Each column's SQLAlchemy bind processor (None when the driver takes the value
    as is): what SQLAlchemy applies to a parameter, for statements run on the driver."""
    dialect = conn.dialect
    return [table.c[n].type.dialect_impl(dialect).bind_processor(dialect) for n in names]


def batches(rows: Iterable[Mapping[str, Any]], names: Sequence[str]) -> Iterable[list[dict[str, Any]]]:
    """``rows`` in lists of at most one statement's worth (by rows and bound parameters)."""
    per = max(1, min(MAX_ROWS, MAX_PARAMS // max(1, len(names))))
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append({n: row.get(n) for n in names})
        if len(batch) >= per:
            yield batch
            batch = []
    if batch:
        yield batch


def recorded_schema(conn: Connection) -> dict[str, binlog_pb2.TableInfo]:
    """The definitions in ``conn``'s ``_binlake_schema`` by table name (empty without one):
    the tables binlake created in a target, or wrote through in an upstream."""
    if not sa.inspect(conn).has_table(SCHEMA_TABLE):
        return {}
    t = sa.table(SCHEMA_TABLE, sa.column("info"), sa.column("dropped"))
    out: dict[str, binlog_pb2.TableInfo] = {}
    for raw, dropped in conn.execute(sa.select(t.c.info, t.c.dropped)):
        if dropped:
            continue
        info = binlog_pb2.TableInfo.FromString(bytes(raw))
        out[info.name] = info
    return out
