"""Durable state of the registry: the TSO high-water mark, the cluster id and node records.

``RegistryStore`` is the narrow interface the registry service needs; the
embedded implementation is ``SQLiteStore`` (one file, one machine);
``binlake.registry.etcd_store.EtcdStore`` keeps the same state in etcd for a
group of registries on several hosts; ``binlake.registry.stores.open_store``
picks one of them for a data directory or a store URL.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import fcntl
import os
import pathlib
import secrets
import sqlite3
import threading
from collections.abc import Iterator

from binlake import errors
from binlake.registry.model import KINDS, ConsumerRecord, NodeRecord, NodeState, ReplicationSetting

# The file a data directory holds.
DB_FILE_NAME = "registry.db"
SCHEMA_VERSION = 1


class RegistryStore(abc.ABC):
    """What the registry persists. Every method is safe to call from any thread."""

    @abc.abstractmethod
    def load_tso_limit(self) -> int:
        """The saved TSO high-water mark (physical ms); 0 for a new store."""

    @abc.abstractmethod
    def save_tso_limit(self, limit: int) -> None:
        """Persist a new high-water mark; it is durable when this returns."""

    @abc.abstractmethod
    def cluster_id(self) -> int:
        """A random 63-bit id, chosen when the store was created and never changed."""

    @abc.abstractmethod
    def get_node(self, node_id: str) -> NodeRecord | None:
        """The stored record of ``node_id``, or None."""

    @abc.abstractmethod
    def put_node(self, record: NodeRecord) -> None:
        """Insert or replace a node record and bump the revision, atomically."""

    @abc.abstractmethod
    def list_nodes(self, kind: str | None = None) -> list[NodeRecord]:
        """Every node (of ``kind``, if given), in no particular order."""

    @abc.abstractmethod
    def get_consumer(self, consumer_id: str) -> ConsumerRecord | None:
        """The stored consumer ``consumer_id``, or None."""

    @abc.abstractmethod
    def put_consumer(self, record: ConsumerRecord) -> None:
        """Insert or replace a consumer; durable when this returns."""

    @abc.abstractmethod
    def delete_consumer(self, consumer_id: str) -> bool:
        """Remove a consumer; False when there was none."""

    @abc.abstractmethod
    def list_consumers(self) -> list[ConsumerRecord]:
        """Every consumer, in no particular order."""

    @abc.abstractmethod
    def list_replication(self) -> list[ReplicationSetting]:
        """Every replication setting, by from_ts (empty: none made, R = W = 1)."""

    @abc.abstractmethod
    def add_replication(self, setting: ReplicationSetting) -> None:
        """Append a setting; its from_ts is above every stored one (the service checks)."""

    @abc.abstractmethod
    def revision(self) -> int:
        """A counter that increases on every put_node."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store; calling it twice is harmless."""

    def describe(self) -> str:
        """Where the store lives, for logs."""
        return type(self).__name__

    def __enter__(self) -> RegistryStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# The node columns, in NodeRecord's field order, so rows map to records by name.
_NODE_COLUMNS = tuple(f.name for f in dataclasses.fields(NodeRecord))

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (
    -- One row per key:
    --   schema_version: the layout of this file; written at creation, checked on open.
    --   cluster_id: random in [1, 2^63); written once at creation, never changed.
    --   tso_limit: physical ms; never decreases; every TSO the registry has handed
    --     out has physical < tso_limit (it is saved before such a TSO is returned).
    --   revision: >= 0; increases by one on every node write, never decreases.
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS replication (
    -- The cluster's replication settings, a history: rows are only appended.
    -- from_ts: the TSO the setting applies from; above every earlier row's.
    -- 0 only for the setting a cluster was created with (binlake registry --replicas).
    from_ts INTEGER PRIMARY KEY CHECK (from_ts >= 0),
    -- 1 <= min_acks <= replicas.
    replicas INTEGER NOT NULL CHECK (replicas >= 1),
    min_acks INTEGER NOT NULL CHECK (min_acks >= 1 AND min_acks <= replicas)
);
CREATE TABLE IF NOT EXISTS nodes (
    -- Unique; non-empty, at most 128 printable characters, no whitespace.
    node_id TEXT PRIMARY KEY,
    -- One of {KINDS}; never changes once a node id is registered.
    kind TEXT NOT NULL CHECK (kind IN ({", ".join(repr(k) for k in KINDS)})),
    -- HOST:PORT with port > 0, as the node last registered or reported it.
    addr TEXT NOT NULL,
    -- A NodeState value; only a registration moves it back to 'online'.
    state TEXT NOT NULL CHECK (state IN ({", ".join(repr(s.value) for s in NodeState)})),
    -- The node's reported status, each >= 0 (TSOs, or 0 when unknown).
    max_commit_ts INTEGER NOT NULL CHECK (max_commit_ts >= 0),
    safe_ts INTEGER NOT NULL CHECK (safe_ts >= 0),
    gc_ts INTEGER NOT NULL CHECK (gc_ts >= 0),
    disk_used_bytes INTEGER NOT NULL CHECK (disk_used_bytes >= 0),
    disk_free_bytes INTEGER NOT NULL CHECK (disk_free_bytes >= 0),
    -- Binlogs per second over the last heartbeat interval; finite and >= 0.
    load REAL NOT NULL CHECK (load >= 0),
    -- TSO stamped by the registry at the latest registration; > 0.
    online_ts INTEGER NOT NULL CHECK (online_ts > 0),
    -- TSO stamped when the node went offline; > 0 exactly when state = 'offline'.
    offline_ts INTEGER NOT NULL CHECK ((offline_ts > 0) = (state = 'offline')),
    -- Wall-clock ms of the node's own latest register/heartbeat (operator changes
    -- leave it alone, so it tells whether the node is alive).
    updated_at_ms INTEGER NOT NULL CHECK (updated_at_ms >= 0),
    -- Prewritten transactions still waiting for their commit; >= 0.
    pending_txns INTEGER NOT NULL CHECK (pending_txns >= 0),
    -- HOST:PORT of the node's metrics endpoint, or '' when it has none.
    metrics_addr TEXT NOT NULL,
    -- TSO; the Pump holds no transaction with commit_ts below it (the highest safe
    -- ts it reported while it had stored none); never decreases; 0 for a writer.
    empty_below_ts INTEGER NOT NULL DEFAULT 0 CHECK (empty_below_ts >= 0)
);
CREATE TABLE IF NOT EXISTS consumers (
    -- Unique; the same rules as a node id.
    consumer_id TEXT PRIMARY KEY,
    -- TSO; every transaction with commit_ts below it was consumed. Never
    -- decreases while the row exists (the service keeps the max); 0 = nothing
    -- consumed yet, which holds every Pump's GC at its current point.
    checkpoint_ts INTEGER NOT NULL CHECK (checkpoint_ts >= 0),
    -- Free text for operators (e.g. the lake's path).
    description TEXT NOT NULL,
    -- Wall-clock ms of the first registration and of the latest update.
    registered_at_ms INTEGER NOT NULL CHECK (registered_at_ms >= 0),
    updated_at_ms INTEGER NOT NULL CHECK (updated_at_ms >= 0)
);
"""

# The consumer columns, in ConsumerRecord's field order.
_CONSUMER_COLUMNS = tuple(f.name for f in dataclasses.fields(ConsumerRecord))


class SQLiteStore(RegistryStore):
    """The embedded store: one SQLite file in WAL mode with synchronous=FULL, so a
    commit is on disk when it returns. One process owns the file at a time (an
    exclusive lock on ``<file>.lock``): two registries on one store would hand out
    the same timestamps."""

    def __init__(self, path: str | pathlib.Path) -> None:
        self._path = pathlib.Path(path)
        self._lock = threading.Lock()
        self._lock_fd = self._acquire_file_lock()
        try:
            self._conn: sqlite3.Connection | None = self._open()
        except BaseException:
            self._release_file_lock()
            raise

    # -- opening -------------------------------------------------------------

    def _acquire_file_lock(self) -> int:
        lock_path = self._path.with_name(self._path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise errors.FailedPrecondition(
                f"registry store {self._path} is in use by another registry (pid {holder}); "
                "stop it first, or give this one its own data directory"
            ) from None
        # The pid is only for the message above; the lock itself is what counts.
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def _release_file_lock(self) -> None:
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _open(self) -> sqlite3.Connection:
        try:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves, so each write
            # is exactly one durable transaction.
            conn = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise errors.Unavailable(f"cannot open registry store {self._path}: {exc}") from None
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise errors.FailedPrecondition(
                    f"registry store {self._path}: the file system does not support SQLite WAL mode"
                )
            # FULL: the WAL is fsynced at every commit, so a saved TSO limit survives
            # a power loss, not just a process crash.
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=5000")
            # executescript commits on its own, so it runs outside our transaction;
            # CREATE TABLE IF NOT EXISTS makes it harmless on an existing file.
            conn.executescript(_SCHEMA)
            _add_missing_columns(conn)
            with _transaction(conn):
                self._init_meta(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise errors.FailedPrecondition(
                f"registry store {self._path} is not a usable SQLite database: {exc}"
            ) from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _init_meta(self, conn: sqlite3.Connection) -> None:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        elif row[0] != SCHEMA_VERSION:
            raise errors.FailedPrecondition(
                f"registry store {self._path} has schema version {row[0]}; "
                f"this binlake reads version {SCHEMA_VERSION}"
            )
        # A zero cluster id would look like "unset" on the wire, so draw from [1, 2^63).
        cluster_id = secrets.randbelow((1 << 63) - 1) + 1
        conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('cluster_id', ?)", (cluster_id,))
        conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('tso_limit', 0)")
        conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('revision', 0)")

    # -- helpers ---------------------------------------------------------------

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise errors.Unavailable(f"registry store {self._path} is closed")
            yield self._conn

    def _meta(self, conn: sqlite3.Connection, key: str) -> int:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        if row is None:
            raise errors.FailedPrecondition(f"registry store {self._path} lacks meta key {key!r}")
        return int(row[0])

    # -- RegistryStore -----------------------------------------------------------

    def describe(self) -> str:
        return str(self._path)

    @property
    def path(self) -> pathlib.Path:
        return self._path

    def load_tso_limit(self) -> int:
        with self._connection() as conn:
            return self._meta(conn, "tso_limit")

    def save_tso_limit(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise errors.InvalidArgument(f"a TSO limit is a non-negative integer, got {limit!r}")
        with self._connection() as conn, _transaction(conn):
            # max(): the limit never decreases, even if a caller hands us an older one.
            conn.execute("UPDATE meta SET value = max(value, ?) WHERE key = 'tso_limit'", (limit,))

    def cluster_id(self) -> int:
        with self._connection() as conn:
            return self._meta(conn, "cluster_id")

    def get_node(self, node_id: str) -> NodeRecord | None:
        with self._connection() as conn:
            row = conn.execute(
                f"SELECT {', '.join(_NODE_COLUMNS)} FROM nodes WHERE node_id = ?", (node_id,)
            ).fetchone()
        return _row_to_record(row) if row is not None else None

    def put_node(self, record: NodeRecord) -> None:
        values = dataclasses.asdict(record)
        values["state"] = NodeState(record.state).value
        placeholders = ", ".join(f":{c}" for c in _NODE_COLUMNS)
        with self._connection() as conn, _transaction(conn):
            conn.execute(
                f"INSERT OR REPLACE INTO nodes ({', '.join(_NODE_COLUMNS)}) VALUES ({placeholders})",
                values,
            )
            conn.execute("UPDATE meta SET value = value + 1 WHERE key = 'revision'")

    def list_nodes(self, kind: str | None = None) -> list[NodeRecord]:
        query = f"SELECT {', '.join(_NODE_COLUMNS)} FROM nodes"
        params: tuple[str, ...] = ()
        if kind:
            query += " WHERE kind = ?"
            params = (kind,)
        with self._connection() as conn:
            rows = conn.execute(query, params).fetchall()
        return [_row_to_record(row) for row in rows]

    def revision(self) -> int:
        with self._connection() as conn:
            return self._meta(conn, "revision")

    def list_replication(self) -> list[ReplicationSetting]:
        with self._connection() as conn:
            rows = conn.execute("SELECT from_ts, replicas, min_acks FROM replication ORDER BY from_ts").fetchall()
        return [ReplicationSetting(int(a), int(b), int(c)) for a, b, c in rows]

    def add_replication(self, setting: ReplicationSetting) -> None:
        with self._connection() as conn, _transaction(conn):
            conn.execute("INSERT INTO replication (from_ts, replicas, min_acks) VALUES (?, ?, ?)",
                         (setting.from_ts, setting.replicas, setting.min_acks))

    def get_consumer(self, consumer_id: str) -> ConsumerRecord | None:
        with self._connection() as conn:
            row = conn.execute(
                f"SELECT {', '.join(_CONSUMER_COLUMNS)} FROM consumers WHERE consumer_id = ?", (consumer_id,)
            ).fetchone()
        return ConsumerRecord(*row) if row is not None else None

    def put_consumer(self, record: ConsumerRecord) -> None:
        placeholders = ", ".join(f":{c}" for c in _CONSUMER_COLUMNS)
        with self._connection() as conn, _transaction(conn):
            conn.execute(
                f"INSERT OR REPLACE INTO consumers ({', '.join(_CONSUMER_COLUMNS)}) VALUES ({placeholders})",
                dataclasses.asdict(record),
            )

    def delete_consumer(self, consumer_id: str) -> bool:
        with self._connection() as conn, _transaction(conn):
            cur = conn.execute("DELETE FROM consumers WHERE consumer_id = ?", (consumer_id,))
            return cur.rowcount > 0

    def list_consumers(self) -> list[ConsumerRecord]:
        with self._connection() as conn:
            rows = conn.execute(f"SELECT {', '.join(_CONSUMER_COLUMNS)} FROM consumers").fetchall()
        return [ConsumerRecord(*row) for row in rows]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._release_file_lock()


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    # IMMEDIATE takes the write lock up front, so a read-modify-write inside the
    # transaction cannot be interleaved with another writer.
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    """Columns added to ``nodes`` after a store was created (each with a default
    meaning "unknown"), so an older store opens without a schema version change."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(nodes)")}
    if "empty_below_ts" not in have:
        conn.execute("ALTER TABLE nodes ADD COLUMN empty_below_ts INTEGER NOT NULL DEFAULT 0 "
                     "CHECK (empty_below_ts >= 0)")


def _row_to_record(row: tuple[object, ...]) -> NodeRecord:
    fields = dict(zip(_NODE_COLUMNS, row, strict=True))
    fields["state"] = NodeState(str(fields["state"]))
    return NodeRecord(**fields)  # type: ignore[arg-type]
