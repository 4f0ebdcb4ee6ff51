"""A running Pump: storage, gRPC server, registry membership and background duties.

Start-up order matters: recover storage, listen (reads are served at once),
register with the registry (which stamps online_ts), and only then accept
writes. Background duties: heartbeats (and the operator's state changes they
carry back), fake binlogs while idle, asking writers about prewrites whose
commit did not come within the transaction timeout, GC by retention.
"""

from __future__ import annotations

import fcntl
import gc as gc_module
import logging
import os
import pathlib
import socket
import threading
import time
from collections.abc import Callable

from binlake import errors, rpc, tso
from binlake.client import txn_status
from binlake.config import PumpSettings
from binlake.proto import binlog_pb2
from binlake.pump import gc
from binlake.pump.metrics import PumpMetrics, lag_seconds
from binlake.pump.server import PumpServer, PumpServicer
from binlake.pump.service import PumpService
from binlake.pump.storage import Storage
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeRecord, NodeState

log = logging.getLogger(__name__)

# data_dir/node_id: the id this data dir was first registered with. Invariant:
# a data dir always registers under the same id, so its data is never read as
# another Pump's.
NODE_ID_FILE = "node_id"
LOCK_FILE = "LOCK"


class PumpNode:
    def __init__(self, settings: PumpSettings) -> None:
        self.settings = settings
        self.data_dir = pathlib.Path(settings.data_dir)
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise errors.InvalidArgument(
                f"pump data dir {self.data_dir} cannot be created ({exc.strerror}); give a writable directory"
            ) from None
        self._lock_fd = self._lock_data_dir()
        # A refused start (node id, port, storage) must not keep the data dir locked,
        # the storage open or the port bound: release whatever was taken, then re-raise.
        try:
            self.storage = Storage(
                self.data_dir, segment_bytes=settings.segment_bytes, fsync=settings.fsync,
                max_group_bytes=settings.max_group_bytes, sync_commits=settings.sync_commits,
            )
            self._stop = threading.Event()
            self._threads: list[threading.Thread] = []
            self._last_bound = (self.storage.sorter.bound, time.monotonic())
            self._last_written = (self.storage.stats.binlogs, time.monotonic(), 0.0)
            self._registry: RegistryClient | None = None
            self._resolve_warned: set[int] = set()
            # The latest GC round's decision (what holds GC), for operators and tests.
            self.gc_decision: gc.GCDecision | None = None
            self.metrics_addr = ""
            # Bound before the servicer exists: the node id may come from the port.
            options = rpc.message_options(settings.max_binlog_bytes)
            self._server = PumpServer(settings.addr, options, settings.grpc_workers)
            host = settings.addr.rpartition(":")[0]
            port = self._server.port
            if port == 0:
                raise errors.Unavailable(f"pump cannot listen on {settings.addr} (address in use?)")
            self.addr = f"{host}:{port}"
            self.advertise_addr = settings.advertise_addr or self.addr
            self.node_id = self._node_id(port)
            self.service = PumpService(
                self.storage, node_id=self.node_id, max_binlog_bytes=settings.max_binlog_bytes,
                stop_write_at_free_bytes=settings.stop_write_at_free_bytes,
                read_batch_txns=settings.read_batch_txns, read_batch_bytes=settings.read_batch_bytes,
            )
            self.metrics = PumpMetrics(self._snapshot)
            self._server.add(PumpServicer(self.service, self.metrics))
        except BaseException:
            if getattr(self, "_server", None) is not None:
                self._server.stop(None)
            if getattr(self, "storage", None) is not None:
                self.storage.close()
            os.close(self._lock_fd)
            raise

    # ------------------------------------------------------------------ identity
    def _lock_data_dir(self) -> int:
        fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise errors.FailedPrecondition(
                f"data dir {self.data_dir} is in use by another pump (pid {other or '?'}); "
                "give each pump its own --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _node_id(self, port: int) -> str:
        path = self.data_dir / NODE_ID_FILE
        remembered = path.read_text().strip() if path.exists() else ""
        wanted = self.settings.node_id
        if remembered and wanted and remembered != wanted:
            raise errors.FailedPrecondition(
                f"data dir {self.data_dir} belongs to pump {remembered!r}, not {wanted!r}; "
                "use that node id or another data dir"
            )
        node_id = wanted or remembered or f"{socket.gethostname()}:{port}"
        if not remembered:
            path.write_text(node_id + "\n")
        return node_id

    # ------------------------------------------------------------------ lifecycle
    def start(self, register_timeout_s: float = 30.0) -> PumpNode:
        self._server.start()
        log.info("pump %s listening on %s (data dir %s)", self.node_id, self.addr, self.data_dir)
        if self.settings.metrics_addr:
            try:
                self.metrics_addr = self.metrics.serve(self.settings.metrics_addr)
            except OSError as exc:
                self.stop(grace=0, report_paused=False)
                raise errors.Unavailable(
                    f"pump cannot serve metrics on {self.settings.metrics_addr} ({exc.strerror}); "
                    "choose a free --metrics-addr") from None
            log.info("pump %s metrics on http://%s/metrics", self.node_id, self.metrics_addr)
        self._registry = RegistryClient(self.settings.registry)
        try:
            self._register(register_timeout_s)
        except BaseException:
            self.stop(grace=0, report_paused=False)
            raise
        # First fake binlog right away so the safe ts is known without waiting.
        self._fake_binlog()
        for name, fn, every in (
            ("heartbeat", self._heartbeat, self.settings.heartbeat_interval_s),
            ("fake-binlog", self._maybe_fake_binlog, min(self.settings.fake_binlog_interval_s / 2, 1.0)),
            ("resolve", self._resolve_pending, min(max(self.settings.txn_timeout_s / 4, 0.2), 5.0)),
            ("gc", self._gc, self.settings.gc_interval_s),
        ):
            t = threading.Thread(target=self._loop, args=(name, fn, every), name=f"pump-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _register(self, timeout_s: float) -> None:
        assert self._registry is not None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                cluster_id, _rev = self._registry.cluster_info()
                rec = self._registry.register(self._record(NodeState.ONLINE))
                break
            except errors.Unavailable as exc:
                if time.monotonic() > deadline:
                    raise errors.Unavailable(
                        f"pump {self.node_id} could not register with the registry at "
                        f"{self.settings.registry} within {timeout_s:g}s: {exc}"
                    ) from None
                time.sleep(0.5)
        self.service.cluster_id = cluster_id
        self.service.state = rec.state
        self.service.registered = True
        log.info(
            "pump %s registered (online ts %s, cluster %d); accepting writes",
            self.node_id, tso.format_ts(rec.online_ts), cluster_id,
        )

    def _loop(self, name: str, fn: Callable[[], object], every: float) -> None:
        while not self._stop.wait(every):
            try:
                fn()
            except errors.BinlakeError as exc:
                log.warning("pump %s %s: %s", self.node_id, name, exc)
            except Exception:
                log.exception("pump %s %s failed", self.node_id, name)

    def stop(self, grace: float = 5.0, *, report_paused: bool = True) -> None:
        """Graceful shutdown: refuse new writes, let in-flight ones finish, report
        PAUSED (binlogctl's meaning of a stopped Pump), close storage."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.service.closing = True
        self._server.stop(grace)
        for t in self._threads:
            t.join(timeout=5)
        if self._registry is not None:
            if report_paused and self.service.state in (NodeState.ONLINE, NodeState.PAUSING):
                self.service.state = NodeState.PAUSED
            try:
                self._registry.heartbeat(self._record(self.service.state))
            except errors.BinlakeError as exc:
                log.warning("pump %s: final heartbeat failed: %s", self.node_id, exc)
            self._registry.close()
        self.metrics.close()
        self.storage.close()
        os.close(self._lock_fd)
        log.info("pump %s stopped", self.node_id)

    def wait(self) -> None:
        self._server.wait_for_termination()

    # ------------------------------------------------------------------ duties
    def _snapshot(self) -> dict[str, float]:
        st = self.storage
        # As Status: a scrape reflects every write acknowledged before it (the index lags by milliseconds).
        st.wait_indexed(timeout=1.0)
        return {
            "binlogs": st.stats.binlogs, "bytes": st.stats.bytes, "fsyncs": st.stats.fsyncs,
            "groups": st.stats.groups, "safe_ts": st.safe_ts, "safe_ts_lag_s": lag_seconds(st.safe_ts),
            "max_commit_ts": st.max_commit_ts, "gc_ts": st.gc_ts, "pending": st.pending_count,
            "storage_bytes": st.storage_bytes(), "disk_free": self.service.disk_free(),
        }

    def _record(self, state: NodeState) -> NodeRecord:
        st = self.storage
        binlogs, at, load = self._last_written
        now = time.monotonic()
        if now - at >= 0.5:
            load = (st.stats.binlogs - binlogs) / (now - at)
            self._last_written = (st.stats.binlogs, now, load)
        # The safe ts before the max commit ts: the registry takes (0, safe ts) as "holds
        # nothing below the safe ts" (NodeRecord.empty_below_ts), so a commit published
        # between the two reads must not be missed.
        safe_ts = st.safe_ts
        return NodeRecord(
            node_id=self.node_id, kind="pump", addr=self.advertise_addr, state=state,
            safe_ts=safe_ts, max_commit_ts=st.max_commit_ts, gc_ts=st.gc_ts,
            disk_used_bytes=st.storage_bytes(), disk_free_bytes=self.service.disk_free(),
            load=load, pending_txns=st.pending_count, metrics_addr=self.metrics_addr,
        )

    def _heartbeat(self) -> None:
        assert self._registry is not None
        svc = self.service
        reported = svc.state
        # An operator's pause/offline completes once no transaction is pending:
        # every prewrite this Pump took must get its commit here first.
        if reported is NodeState.PAUSING and self.storage.pending_count == 0:
            reported = NodeState.PAUSED
        elif reported is NodeState.CLOSING and self.storage.pending_count == 0:
            reported = NodeState.OFFLINE
        if reported is not svc.state:
            # Taken here, before the registry hears of it: whoever reads the new state
            # from the registry finds this Pump's Status saying it too (the registry's
            # answer below still wins if an operator changed it meanwhile).
            log.info("pump %s: state %s -> %s", self.node_id, svc.state.value, reported.value)
            svc.state = reported
        try:
            rec = self._registry.heartbeat(self._record(reported))
        except errors.NotFound:
            log.warning("pump %s is unknown to the registry; registering again", self.node_id)
            rec = self._registry.register(self._record(NodeState.ONLINE))
        if rec.state is not svc.state:
            log.info("pump %s: state %s -> %s", self.node_id, svc.state.value, rec.state.value)
        svc.state = rec.state

    def _fake_binlog(self) -> None:
        assert self._registry is not None
        # Fetch the ts first, then write: any prewrite not yet acknowledged at
        # this point will get a commit_ts above it (see pump.sorter).
        ts = self._registry.get_ts()
        err = self.service.write_internal(binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=ts, commit_ts=ts))
        if err is not None:
            raise err
        self._last_bound = (self.storage.sorter.bound, time.monotonic())

    def _maybe_fake_binlog(self) -> None:
        bound, at = self._last_bound
        now = time.monotonic()
        if self.storage.sorter.bound != bound:
            self._last_bound = (self.storage.sorter.bound, now)
        elif now - at >= self.settings.fake_binlog_interval_s:
            self._fake_binlog()

    def _resolve_pending(self) -> None:
        assert self._registry is not None
        for batch in self.storage.pending_older_than(self.settings.txn_timeout_s):
            for start_ts, prewrite_key in batch:
                self._resolve_one(start_ts, prewrite_key.decode(errors="replace"))

    def _resolve_one(self, start_ts: int, writer_id: str) -> None:
        """Ask the writer of one prewrite whose commit is overdue, and store its outcome."""
        assert self._registry is not None
        try:
            writer = self._registry.get_node(writer_id)
            state, commit_ts = txn_status.query_status(writer.addr, start_ts)
        except errors.BinlakeError as exc:
            if start_ts not in self._resolve_warned:
                self._resolve_warned.add(start_ts)
                log.warning(
                    "pump %s: prewrite %d has waited over %gs for its commit and writer %r cannot "
                    "answer yet (%s); it holds the safe ts until resolved",
                    self.node_id, start_ts, self.settings.txn_timeout_s, writer_id, exc,
                )
            return
        if state == txn_status.COMMITTED:
            err = self.service.write_internal(
                binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=start_ts, commit_ts=commit_ts)
            )
        elif state == txn_status.ROLLED_BACK:
            err = self.service.write_internal(binlog_pb2.Binlog(tp=binlog_pb2.ROLLBACK, start_ts=start_ts))
        else:
            return
        self._resolve_warned.discard(start_ts)
        if err is None:
            log.info("pump %s: resolved missing commit of %d: %s %s", self.node_id, start_ts, state,
                     commit_ts or "")
        elif not isinstance(err, errors.AlreadyExists):
            log.warning("pump %s: resolution of %d not stored: %s", self.node_id, start_ts, err)

    def _gc(self) -> gc.GCDecision:
        """One GC round: retention, held at the lowest consumer checkpoint unless a
        hard limit overrides it (loudly). With the registry unreachable nothing
        is collected: the checkpoints are unknown."""
        assert self._registry is not None
        now = self._registry.get_ts()
        s = self.settings
        decision = gc.decide(
            now, retention_days=s.gc_retention_days, consumers=self._registry.list_consumers(),
            hard_limit_days=s.gc_hard_limit_days, hard_limit_bytes=s.gc_hard_limit_bytes,
            storage_bytes=self.storage.storage_bytes(),
        )
        self.gc_decision = decision
        if decision.forced_by is not None and decision.target_ts > self.storage.gc_ts:
            for consumer_id, _lo, _hi in decision.lost:
                self.metrics.gc_forced.labels(consumer_id).inc()
            log.error(
                "pump %s: GC passes consumer checkpoints because of %s: %s; those windows can no longer be "
                "read from this pump (restore them from a snapshot or re-ingest elsewhere)",
                self.node_id, decision.forced_by, decision.describe_lost(),
            )
        elif decision.held_by is not None:
            log.info(
                "pump %s: GC held at %s by consumer %s (retention alone would allow %s)",
                self.node_id, tso.format_ts(decision.target_ts), decision.held_by.consumer_id,
                tso.format_ts(decision.retention_ts),
            )
        self.storage.gc(decision.target_ts)
        return decision


# The cyclic garbage collector's first-generation threshold in a running Pump
# (CPython's default: 700 container allocations).
GC_GEN0_THRESHOLD = 50_000


def quiet_cyclic_gc() -> None:
    """Keep CPython's cyclic garbage collector off the write path.

    Every batch allocates a few dozen container objects (parsed binlogs, entries,
    results) that reference counting frees at once; with the default threshold
    they set off ~75 young collections a second at 8,000 binlogs/s, and every
    ~4 s a full one over everything the Pump imported (grpc, protobuf, pydantic),
    which held the GIL for 18-32 ms: every write stream stalled meanwhile
    (measured with ``gc.callbacks`` on a Pump at 16 writers). Objects alive after
    start are frozen out of the collections (``gc.freeze``: they live as long
    as the process) and young collections run 70 times less often. Cyclic
    garbage (rare here: the write path frees by reference counting) is still
    collected, later."""
    gc_module.freeze()
    _, gen1, gen2 = gc_module.get_threshold()
    gc_module.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def run(settings: PumpSettings) -> None:
    """Run a Pump until SIGINT/SIGTERM, then shut down gracefully."""
    import signal
    import sys

    # Writes wake several threads in turn (RPC reader, group-commit writer,
    # responder); a short GIL switch interval keeps those hand-offs from
    # waiting out CPU-bound threads' default 5 ms slices.
    sys.setswitchinterval(0.0005)
    node = PumpNode(settings).start()
    quiet_cyclic_gc()
    done = threading.Event()

    def _handle(signum: int, _frame: object) -> None:
        log.info("pump %s: signal %d, shutting down", node.node_id, signum)
        done.set()

    signal.signal(signal.SIGTERM, _handle)
    signal.signal(signal.SIGINT, _handle)
    print(f"pump {node.node_id} listening on {node.addr}", flush=True)
    done.wait()
    node.stop()
