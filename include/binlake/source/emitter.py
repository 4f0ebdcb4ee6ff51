"""The upstream role for a source that reads an existing database's log: turns
each upstream transaction into TiDB's two binlogs through the PumpClient,
with the TSO journal of ``source.journal`` so a re-read transaction is sent
with the same timestamps (see that module for the recovery argument).

Per transaction KEY (its position in the upstream log; ``emit``, one at a
time, used for DDL; ``step`` does the same for groups of transactions, see
``source.pipeline``):

1. already decided in the journal: re-send the commit (and nothing else) to
   the Pump that holds the prewrite;
2. otherwise: start_ts from the registry, journal it, prewrite to a Pump;
   after the Pump's acknowledgement, commit_ts from the registry, journal
   it with the Pump's id, commit binlog to that Pump.

The emitter registers as a ``writer`` in the registry and serves TxnStatus
from the journal, so a Pump holding a prewrite whose commit never came gets
an answer (committed with the journaled commit_ts, or rolled back).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import NamedTuple

from binlake import errors, failpoint
from binlake.client import wire
from binlake.client.pump_client import PumpClient
from binlake.config import ClientSettings
from binlake.proto import binlog_pb2
from binlake.registry.model import NodeRecord
from binlake.source.journal import SourceState
from binlake.writer import txn_status

log = logging.getLogger(__name__)


# A source's PumpClient, unless BINLAKE_CLIENT_* says otherwise: a group (up to 16 MiB,
# ``pipeline.MAX_GROUP_BYTES``) goes out as batches of 1 MiB, up to 8 on the wire at once,
# so the Pump appends and fsyncs one batch while the next travels (``pump.server``), not
# all of a bulk group's megabytes after they all arrived. A live step's small group is one
# batch of prewrites, as before; its batch of commits now travels beside it, not before it.
SOURCE_BATCH_BYTES = 1 << 20
SOURCE_INFLIGHT_BATCHES = 8


def source_client_settings(registry: str) -> ClientSettings:
    """The ClientSettings of a source's PumpClient: the environment's (BINLAKE_CLIENT_*),
    with the source's batch size and batches in flight where it does not set them."""
    settings = ClientSettings(registry=registry)
    update: dict[str, int] = {}
    # model_fields_set: the fields the environment set (the others hold their defaults).
    if "max_batch_bytes" not in settings.model_fields_set:
        update["max_batch_bytes"] = SOURCE_BATCH_BYTES
    if "max_inflight_batches" not in settings.model_fields_set:
        update["max_inflight_batches"] = SOURCE_INFLIGHT_BATCHES
    return settings.model_copy(update=update)


class Prewritten(NamedTuple):
    """A transaction whose prewrite a Pump acknowledged; no commit_ts yet."""

    key: str
    start_ts: int
    pump: str


class Sent(NamedTuple):
    """A transaction decided (commit_ts journaled) whose commit a Pump acknowledged."""

    key: str
    start_ts: int
    commit_ts: int
    pump: str


class Emitter:
    """Sends upstream transactions as prewrite + commit binlogs; owns the journal."""

    def __init__(self, registry: str, state: SourceState, *, kind: str, status_addr: str = "127.0.0.1:0",
                 client_settings: ClientSettings | None = None) -> None:
        from binlake.registry.client import RegistryClient

        self.state = state
        self.registry = RegistryClient(registry)
        # The writer id is part of every prewrite (prewrite_key): a Pump asks it
        # about a missing commit, so it must stay the same across restarts.
        if "writer_id" not in state.state:
            state.save(writer_id=f"{kind}-source-{uuid.uuid4().hex[:12]}")
        self.writer_id = str(state.state["writer_id"])
        self._status = txn_status.TxnStatusServer(state, status_addr).start()
        try:
            self.registry.register(NodeRecord(node_id=self.writer_id, kind="writer", addr=self._status.addr))
            settings = client_settings or source_client_settings(registry)
            self.client = PumpClient(settings=settings, registry_client=self.registry)
        except BaseException:
            self._status.stop(0.1)
            self.registry.close()
            raise
        self.sent = 0
        self.resent = 0
        self._roll_back_orphans()
        self._resend_last_decided()

    def _roll_back_orphans(self) -> None:
        """Tell the Pumps that the transactions a killed run began and never decided are
        rolled back. The journal does not say which Pump took each prewrite, so every
        available Pump gets the rollbacks (one without the prewrite refuses it, which is
        fine). Without this the Pump holding one learns it only by asking this source's
        TxnStatus after its txn timeout, so a source stopped for good before that left
        the prewrite holding the Pump's safe ts (and every window after it) until the
        source came back. A Pump that cannot be told now still asks TxnStatus."""
        orphaned = self.state.orphaned
        if not orphaned:
            return
        results = self.client.broadcast([binlog_pb2.Binlog(tp=binlog_pb2.ROLLBACK, start_ts=s) for s in orphaned])
        stored = sum(1 for errs in results.values() for e in errs if e is None)
        unreachable = sorted(n for n, errs in results.items()
                             if any(e is not None and not isinstance(e, errors.FailedPrecondition | errors.AlreadyExists)
                                    for e in errs))
        log.info("source: %d transaction(s) the previous run began and never decided are rolled back; "
                 "%d rollback(s) stored on the Pumps%s", len(orphaned), stored,
                 f"; pumps {', '.join(unreachable)} will ask this source instead" if unreachable else "")

    def _resend_last_decided(self) -> None:
        """Re-send the commits of the journal's last decision line, which a killed run may
        have decided and never had acknowledged (``source.journal``, *Unacknowledged
        commits*): without this, a snapshot part of an attempt the restart abandons keeps
        its prewrite pending on its Pump until the Pump asks TxnStatus. A Pump that has
        the commit answers AlreadyExists; one that cannot be told now still asks."""
        resent = 0
        for start_ts, commit_ts, pump in self.state.last_decided:
            try:
                self._commit(start_ts, commit_ts, pump)
                resent += 1
            except errors.FailedPrecondition as exc:  # GC'd since (it had it), or given to a replica only
                log.debug("source: commit of start_ts %d not re-sent: %s", start_ts, exc)
            except errors.BinlakeError as exc:
                log.warning("source: the commit of start_ts %d (decided by the previous run) not re-sent to "
                            "pump %s: %s; the Pump asks this source instead", start_ts, pump, exc)
        if resent:
            log.info("source: %d commit(s) the previous run decided last re-sent to their Pumps", resent)

    def emit(self, key: str, value: binlog_pb2.PrewriteValue | bytes,
             ddl: tuple[str, Sequence[binlog_pb2.TableInfo]] | None = None) -> tuple[int, int]:
        """Send transaction KEY (its PrewriteValue, or that serialized); return its
        (start_ts, commit_ts) once a Pump acknowledged the commit. A DDL transaction
        carries one table definition (``ddl[1]`` has exactly one)."""
        d = self.state.decision(key)
        if d is not None:
            self._commit(d.start_ts, d.commit_ts, d.pump)
            self.resent += 1
            return d.start_ts, d.commit_ts
        start_ts, pump = self.prewrite(key, value, ddl)
        failpoint.hit("source-after-prewrite")
        commit_ts = self.registry.get_ts()
        self.state.decide(key, commit_ts, pump)
        failpoint.hit("source-before-commit")
        self._commit(start_ts, commit_ts, pump)
        failpoint.hit("source-after-commit")
        self.sent += 1
        return start_ts, commit_ts

    def step(self, decide: Sequence[Prewritten],
             txns: Sequence[tuple[str, bytes]]) -> tuple[list[int], list[Prewritten | Sent]]:
        """One step of the group pipeline: decide and commit the group ``decide`` (prewritten
        by the previous step, every prewrite acknowledged) and begin and prewrite the next
        group ``txns`` (key, serialized PrewriteValue), in upstream commit order. Round trips, whatever the
        groups' sizes: ONE TSO call (the commit_ts of ``decide``, then the start_ts of
        ``txns``, so each commit_ts follows its start_ts and every earlier commit_ts), ONE
        fsync'ed journal line deciding the one group and beginning the other (all or none),
        ONE batch per Pump with the commits and the prewrites together.

        Returns the commit_ts of each of ``decide`` (acknowledged by its Pump), and for each
        of ``txns`` either a ``Prewritten`` (acknowledged; the next step decides it) or, for
        a transaction already decided (re-read after a restart: only its commit is re-sent,
        with the journaled TSOs), a ``Sent``."""
        out: list[Prewritten | Sent] = []
        fresh: list[tuple[int, str, bytes]] = []
        resend: list[Sent] = []
        for i, (key, value) in enumerate(txns):
            d = self.state.decision(key)
            if d is None:
                fresh.append((i, key, value))
                out.append(Prewritten(key, 0, ""))  # filled in below
            else:
                sent = Sent(key, d.start_ts, d.commit_ts, d.pump)
                resend.append(sent)
                out.append(sent)
        n = len(decide) + len(fresh)
        first = self.registry.get_ts_batch(n) if n else 0
        commit_ts = [first + j for j in range(len(decide))]
        starts = [first + len(decide) + j for j in range(len(fresh))]
        self.state.step([(p.key, c, p.pump) for p, c in zip(decide, commit_ts, strict=True)],
                        [(key, s) for (_i, key, _v), s in zip(fresh, starts, strict=True)])
        if decide:
            failpoint.hit("source-before-commit")
            if len(decide) > 1:
                failpoint.hit("source-before-group-commit")
        writer = self.writer_id.encode()
        commits = [binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=p.start_ts, commit_ts=c)
                   for p, c in zip(decide, commit_ts, strict=True)]
        commits += [binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=r.start_ts, commit_ts=r.commit_ts)
                    for r in resend]
        pumps = self.client.write_group(
            commits, [p.pump for p in decide] + [r.pump for r in resend],
            [wire.prewrite(s, writer, v) for (_i, _k, v), s in zip(fresh, starts, strict=True)])
        if fresh:
            failpoint.hit("source-after-prewrite")
            if len(fresh) > 1:
                failpoint.hit("source-after-group-prewrite")
        if decide:
            failpoint.hit("source-after-commit")
        for (i, key, _v), s, pump in zip(fresh, starts, pumps, strict=True):
            out[i] = Prewritten(key, s, pump)
        self.sent += len(decide)
        self.resent += len(resend)
        return commit_ts, out

    def abandon(self, prewritten: Sequence[Prewritten]) -> None:
        """Roll back prewritten, undecided transactions (a sender stopping between steps):
        journaled first (TxnStatus answers "rolled back" from then on), then a ROLLBACK
        binlog to each one's Pump so its safe ts moves on without asking."""
        for p in prewritten:
            self.state.abandon(p.start_ts)
        try:
            self.client.write_commits([binlog_pb2.Binlog(tp=binlog_pb2.ROLLBACK, start_ts=p.start_ts)
                                       for p in prewritten], [p.pump for p in prewritten])
        except errors.BinlakeError as exc:  # the Pumps ask TxnStatus after their txn timeout instead
            log.warning("source: rollbacks not all acknowledged: %s", exc)

    def prewrite(self, key: str, value: binlog_pb2.PrewriteValue | bytes,
                 ddl: tuple[str, Sequence[binlog_pb2.TableInfo]] | None = None) -> tuple[int, str]:
        """Phase one only: start_ts, journal it, prewrite; return (start_ts, pump). Until a
        ``c`` line decides it, the Pumps hold it as running (TxnStatus) and a restart rolls it back."""
        start_ts = self.registry.get_ts()
        infos = list(ddl[1]) if ddl is not None else None
        self.state.begin(key, start_ts, infos)
        prewrite = binlog_pb2.Binlog(tp=binlog_pb2.PREWRITE, start_ts=start_ts,
                                     prewrite_key=self.writer_id.encode(),
                                     prewrite_value=value if isinstance(value, bytes) else value.SerializeToString())
        if ddl is not None:
            info = ddl[1][0]
            prewrite.ddl_query = ddl[0].encode()
            prewrite.ddl_job_id = info.schema_version
            prewrite.ddl_table.CopyFrom(info)
        return start_ts, self.client.write_prewrite(prewrite)

    def commit_group(self, items: Sequence[tuple[str, int, str]]) -> list[int]:
        """Decide prewritten transactions (key, start_ts, pump) all at once, then commit each.

        The commit_ts are taken in the order given and journaled in ONE line: a crash
        leaves either none of them decided (all rolled back at restart) or all of
        them (a restart re-sends the commits with the same TSOs)."""
        decisions = [(key, self.registry.get_ts(), pump) for key, _start, pump in items]
        self.state.decide_many(decisions)
        failpoint.hit("source-before-commit")
        for (_key, start_ts, _p), (_k, commit_ts, pump) in zip(items, decisions, strict=True):
            self._commit(start_ts, commit_ts, pump)
            self.sent += 1
        return [c for _k, c, _p in decisions]

    def ddl_decision(self, key: str) -> list[binlog_pb2.TableInfo] | None:
        """The table definitions a decided DDL transaction KEY was sent with, if any."""
        d = self.state.decision(key)
        return d.ddl if d is not None else None

    def _commit(self, start_ts: int, commit_ts: int, pump: str) -> None:
        try:
            self.client.write_commit(binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=start_ts,
                                                       commit_ts=commit_ts), pump)
        except errors.AlreadyExists:
            pass  # the Pump has this very commit already (a re-sent transaction)

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self._status.stop(0.5)
            self.registry.close()
