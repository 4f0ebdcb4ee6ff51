"""Failpoints: named places where a crash test can kill the process.

``BINLAKE_FAILPOINT=<name>:exit`` makes ``hit(name)`` end the process at once
with status 137 (as kill -9 would: no ``finally``, no flush, no atexit);
``<name>:raise`` raises ``FailpointError`` there instead; ``<name>:exit:N``
(or ``raise:N``) acts on the Nth hit only, so a test can crash at a random
point of a busy path; ``<name>:exit:N:MS`` (or ``raise:N:MS``) stalls the
hitting thread MS milliseconds first while the rest of the process goes on (e.g. acknowledging
more writes the stalled thread will never index). Unset (always, in production) ``hit`` is one environment
lookup.

The names, where they are, and what a crash there must not break:

``before-db-commit``      TxnWriter, after the prewrite binlog, before the
                          upstream commit (the Pump must resolve it as rolled back)
``after-db-commit``       TxnWriter, after the upstream commit, before the commit
                          binlog (the Pump must resolve it as committed)
``source-after-prewrite`` a log-reading source (binlake.source.emitter), after
                          the Pump took the prewrite, before commit_ts is journaled
                          (the restart must roll it back and send the transaction anew)
``source-before-commit``  the same, after commit_ts is journaled, before the commit
                          binlog (the restart must send the same commit_ts again)
``source-after-group-prewrite``, ``source-before-group-commit``  the same two places,
                          hit only in a step whose group holds several transactions
                          (a crash inside a group, whatever the groups' sizes)
``source-after-commit``   the same, after the Pump acknowledged the commit, before
                          the checkpoint (the re-read copy must be dropped downstream)
``source-snapshot-part``  a source's initial snapshot (binlake.source.snapshot_group),
                          after a row part was prewritten (the one before it
                          committed), before the next (the restart
                          must take the snapshot again: the lake holds it once)
``ingest-before-ledger``  ingest, after the window's change and DDL rows are
                          written, before its ``windows`` row (the window must
                          stay "not ingested" and a re-run must give the same tables)
``ingest-before-append-commit``  ingest on a local lake, inside delta-rs's append of
                          a new window's change rows: its stream ended, some data
                          files may be written, the commit is not (nothing of the
                          window may show; a re-run appends it once)
``ingest-before-checkpoint``  ingest, after the ``windows`` row, before the lake's
                          consumer checkpoint moves (GC stays held; the next
                          ingest moves the checkpoint from the whole ledger)
``pump-before-index-batch`` Pump storage, after a group's value-log fsync and
                          acknowledgement, before the indexer's batch for it (a
                          restart must replay the log: nothing acknowledged
                          lost, nothing served twice, the safe ts not moved back)
``pump-power-loss``       Pump storage, after a group of commits/rollbacks was
                          acknowledged without an fsync; before the process ends the
                          value log is cut back to its last fsync (a power loss; a
                          kill -9 alone keeps the page cache). The restart must resolve
                          the cut commits through TxnStatus to the same commit_ts
``pump-gc-after-batch``   Pump GC, between two of its delete batches (the GC ts is
                          stored first: no window at or above it misses anything,
                          none below it is served; the next GC removes the leftovers)
``apply-before-commit``   apply (consistent mode), a window's rows and checkpoint
                          written, before the target commit (nothing of it may show)
``apply-after-window``    apply, after a window committed (the checkpoint is its end)
``apply-after-piece``     apply, after a piece of a window read in pieces was written,
                          before the next (consistent mode: nothing of the window may
                          show; parallel mode: the checkpoint is the piece's end)
``apply-after-group``     apply (parallel mode), in a worker after its conflict
                          groups committed (a rerun applies only the other groups)
``snapshot-after-table``  snapshot, after a table's data, before the snapshot's
                          marker row (no reader may use the partial snapshot)
``history-before-catalog`` history, after a table's MERGE, before its catalog row
                          (a re-run must rewind and leave the same table)
``restore-before-manifest`` restore --out, after the tables, before the manifest
``restore-after-table``   restore/snapshot, after one table was written while others
                          are being written (no half-written table may be visible)
``undo-after-batch``      undo, after a batch of deletes or inserts was written inside
                          its one target transaction (nothing of it may show; a rerun
                          reverts the same keys)
``undo-before-commit``    undo, every revert and its ``_binlake_undo`` row written,
                          before the target commit (the target must be unchanged)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

ENV = "BINLAKE_FAILPOINT"
NAMES = (
    "before-db-commit",
    "after-db-commit",
    "ingest-before-ledger",
    "ingest-before-append-commit",
    "ingest-before-checkpoint",
    "pump-before-index-batch",
    "pump-power-loss",
    "pump-gc-after-batch",
    "source-after-prewrite",
    "source-before-commit",
    "source-after-group-prewrite",
    "source-before-group-commit",
    "source-after-commit",
    "source-snapshot-part",
    "apply-before-commit",
    "apply-after-window",
    "apply-after-piece",
    "apply-after-group",
    "snapshot-after-table",
    "history-before-catalog",
    "restore-before-manifest",
    "restore-after-table",
)
_hits: dict[str, int] = {}


class FailpointError(Exception):
    """Raised at a failpoint set to ``:raise``."""


def hit(name: str, before: Callable[[], object] | None = None, first: Callable[[], object] | None = None) -> None:
    """Crash here if ``BINLAKE_FAILPOINT`` names this place; ``first`` runs as soon as
    the failpoint fires (before its stall: e.g. stop what would undo the crash's
    effect meanwhile), ``before`` just before the crash (what the crash should
    leave behind, e.g. a power loss's)."""
    spec = os.environ.get(ENV, "")
    if not spec:
        return
    point, _, action = spec.partition(":")
    if point != name:
        return
    action, _, nth = action.partition(":")
    nth, _, stall_ms = nth.partition(":")
    if nth:
        # Counting hits is racy across threads only in which thread crashes.
        _hits[name] = count = _hits.get(name, 0) + 1
        if count != int(nth):
            return
    if first is not None:
        first()
    if stall_ms:
        time.sleep(int(stall_ms) / 1000)
    if before is not None:
        before()
    if action == "exit":
        os._exit(137)
    raise FailpointError(f"failpoint {name}")
