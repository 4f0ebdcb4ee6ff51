"""The upstream role for a source that reads an existing database's log: turns
each upstream transaction into TiDB's two binlogs through the PumpClient,
with the TSO journal of ``source.journal`` so a re-read transaction is sent
with the same timestamps (see that module for the recovery argument).

Per transaction KEY (its position in the upstream log; ``emit``, one at a
time, used for DDL; ``emit_group`` does the same for a group of transactions
with one round trip of each kind for the whole group):

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

from binlake import errors, failpoint
from binlake.client.pump_client import PumpClient
from binlake.config import ClientSettings
from binlake.proto import binlog_pb2
from binlake.registry.model import NodeRecord
from binlake.source import txn_status
from binlake.source.journal import SourceState

log = logging.getLogger(__name__)


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
            settings = client_settings or ClientSettings(registry=registry)
            self.client = PumpClient(settings=settings, registry_client=self.registry)
        except BaseException:
            self._status.stop(0.1)
            self.registry.close()
            raise
        self.sent = 0
        self.resent = 0

    def emit(self, key: str, value: binlog_pb2.PrewriteValue,
             ddl: tuple[str, Sequence[binlog_pb2.TableInfo]] | None = None) -> tuple[int, int]:
        """Send transaction KEY; return its (start_ts, commit_ts) once a Pump acknowledged the commit.
        A DDL transaction carries one table definition (``ddl[1]`` has exactly one)."""
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

    def emit_group(self, txns: Sequence[tuple[str, binlog_pb2.PrewriteValue]]) -> list[tuple[int, int]]:
        """Send a group of upstream transactions (key, value), in upstream commit order, as
        one unit of work; return each one's (start_ts, commit_ts) once the Pumps acknowledged
        every commit. Round trips per group, whatever its size: one TSO call for the start_ts,
        one journal line (fsync) for the begins, the prewrites in one batch per Pump, one TSO
        call for the commit_ts (after every prewrite is acknowledged, so each commit_ts
        follows its start_ts, and in the group's order), one journal line deciding them all
        (``decide_many``: all or none), the commits in one batch per Pump.

        Transactions already decided (re-read after a restart; they come first, being the
        oldest) only have their commits re-sent, with the journaled TSOs."""
        out: list[tuple[int, int]] = [(0, 0)] * len(txns)
        resend: list[tuple[int, int, int, str]] = []  # index, start_ts, commit_ts, pump
        fresh: list[int] = []
        for i, (key, _value) in enumerate(txns):
            d = self.state.decision(key)
            if d is None:
                fresh.append(i)
            else:
                resend.append((i, d.start_ts, d.commit_ts, d.pump))
        if resend:
            self._commit_many([(s, c, p) for _i, s, c, p in resend])
            for i, s, c, _p in resend:
                out[i] = (s, c)
            self.resent += len(resend)
        if not fresh:
            return out
        n = len(fresh)
        first = self.registry.get_ts_batch(n)
        keys = [txns[i][0] for i in fresh]
        self.state.begin_many([(k, first + j) for j, k in enumerate(keys)])
        writer = self.writer_id.encode()
        pumps = self.client.write_prewrites([
            binlog_pb2.Binlog(tp=binlog_pb2.PREWRITE, start_ts=first + j, prewrite_key=writer,
                              prewrite_value=txns[i][1].SerializeToString())
            for j, i in enumerate(fresh)])
        failpoint.hit("source-after-prewrite")
        c0 = self.registry.get_ts_batch(n)
        self.state.decide_many([(k, c0 + j, pumps[j]) for j, k in enumerate(keys)])
        failpoint.hit("source-before-commit")
        self._commit_many([(first + j, c0 + j, pumps[j]) for j in range(n)])
        failpoint.hit("source-after-commit")
        for j, i in enumerate(fresh):
            out[i] = (first + j, c0 + j)
        self.sent += n
        return out

    def _commit_many(self, items: Sequence[tuple[int, int, str]]) -> None:
        """Commit binlogs (start_ts, commit_ts, pump), sent together; back once all are acknowledged."""
        self.client.write_commits(
            [binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=s, commit_ts=c) for s, c, _p in items],
            [p for _s, _c, p in items])

    def prewrite(self, key: str, value: binlog_pb2.PrewriteValue,
                 ddl: tuple[str, Sequence[binlog_pb2.TableInfo]] | None = None) -> tuple[int, str]:
        """Phase one only: start_ts, journal it, prewrite; return (start_ts, pump). Until a
        ``c`` line decides it, the Pumps hold it as running (TxnStatus) and a restart rolls it back."""
        start_ts = self.registry.get_ts()
        infos = list(ddl[1]) if ddl is not None else None
        self.state.begin(key, start_ts, infos)
        prewrite = binlog_pb2.Binlog(tp=binlog_pb2.PREWRITE, start_ts=start_ts,
                                     prewrite_key=self.writer_id.encode(), prewrite_value=value.SerializeToString())
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
