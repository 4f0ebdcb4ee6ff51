"""Helpers for the source tests: a binlog-enabled MariaDB, a registry and one
Pump, a source run in a thread, and reading back what the Pump serves as the
rows it rebuilds (by replaying the binlogs, keyed by primary key)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import pymysql

from binlake import config
from binlake.client.reader import pull_window
from binlake.proto import binlog_pb2
from binlake.pump.node import PumpNode
from binlake.registry.client import RegistryClient
from binlake.registry.server import RegistryServer
from binlake.source.replay import Replay  # noqa: F401 (re-exported for the tests)
from binlake.stack.localdb import LocalMariaDB


@dataclasses.dataclass
class Cluster:
    registry: RegistryServer
    pump: PumpNode

    def binlogs(self, start_ts: int = 0) -> list[binlog_pb2.Binlog]:
        """Every complete transaction the Pump serves, merged and deduplicated as the reader does."""
        with RegistryClient(self.registry.addr) as reg:
            end_ts = reg.get_ts()
        return list(pull_window({"p1": self.pump.addr}, start_ts, end_ts, wait=True, wait_timeout_s=60))

    def raw(self, start_ts: int = 0) -> list[binlog_pb2.Binlog]:
        """The Pump's window *without* the reader's duplicate rule (to count copies)."""
        from binlake.client.reader import pull_pump

        with RegistryClient(self.registry.addr) as reg:
            end_ts = reg.get_ts()
        return list(pull_pump(self.pump.addr, start_ts, end_ts, wait=True, wait_timeout_s=60))


def start_cluster(tmp: pathlib.Path) -> tuple[RegistryServer, PumpNode]:
    reg = RegistryServer(config.load(config.RegistrySettings, data_dir=tmp / "registry",
                                     addr="127.0.0.1:0")).start()
    pump = PumpNode(config.load(
        config.PumpSettings, registry=reg.addr, data_dir=tmp / "p1", addr="127.0.0.1:0", node_id="p1",
        stop_write_at_free_bytes=0, fake_binlog_interval_s=0.2, txn_timeout_s=1,
    )).start()
    return reg, pump


def journal_prewrites(svc: Any, data: pathlib.Path) -> int:
    """Snapshot prewrites a source process (``svc``, still alive) has journaled in ``data``."""
    svc.check_alive()
    p = data / "journal.log"
    if not p.exists():
        return 0
    n = 0
    for line in p.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # a line being written
            continue
        n += len(rec.get("b", ())) + (1 if "s" in rec and not rec.get("r") else 0)
    return n


def sql(server: LocalMariaDB, *stmts: str, db: str | None = None) -> list[Any]:
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", autocommit=True, charset="utf8mb4",
                           database=db)
    out: list[Any] = []
    try:
        with conn.cursor() as cur:
            for s in stmts:
                cur.execute(s)
                out = list(cur.fetchall())
    finally:
        conn.close()
    return out


class SourceThread:
    """A MySQLSource run in a background thread."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.source.run()
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def start(self) -> SourceThread:
        self.thread.start()
        return self

    def stop(self, timeout: float = 30) -> None:
        self.source.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "source did not stop"
        if self.error is not None:
            raise self.error


def iter_rows(server: LocalMariaDB, db: str, table: str) -> Iterator[dict[str, Any]]:
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", charset="utf8mb4", database=db,
                           cursorclass=pymysql.cursors.DictCursor)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM `{table}`")
            yield from cur.fetchall()
    finally:
        conn.close()


def check_retaken(binlogs: list[binlog_pb2.Binlog], tables: int) -> None:
    """A snapshot killed after some of its row parts committed, then taken again: every
    table defined pending twice, the retake's ids replacing the killed attempt's (whose
    rows are in the log), one marker per table, and the lake's tables (``tables_at``,
    what every restore chooses from) hold none of them inside the killed attempt and the
    retake's after its markers."""
    from binlake.lake.decoding.schema_history import SchemaHistory
    from binlake.restore import rebuild

    ddls = [b for b in binlogs if b.ddl_query]
    pending = [b.ddl_table for b in ddls if b.ddl_table.snapshot_pending]
    markers = [b for b in ddls if b.ddl_query.startswith(b"-- binlake: initial snapshot")]
    assert len(markers) == tables and len(pending) == 2 * tables, "two attempts, one completed"
    retake = {i.table_id: i.previous_table_id for i in pending if i.previous_table_id}
    assert set(retake) == {b.ddl_table.table_id for b in markers}, "the markers name the retake's tables"
    killed = set(retake.values())
    assert not killed & set(retake), "new ids"
    killed_rows = [b for b in binlogs if not b.ddl_query and any(
        m.table_id in killed for m in binlog_pb2.PrewriteValue.FromString(b.prewrite_value).mutations)]
    assert killed_rows, "killed after some row parts committed"
    history = SchemaHistory()
    for b in ddls:
        history.apply(b)
    assert rebuild.tables_at(history, killed_rows[-1].commit_ts) == {}, "nothing restorable inside the killed attempt"
    assert set(rebuild.tables_at(history, binlogs[-1].commit_ts)) == set(retake)
