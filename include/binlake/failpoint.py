"""Failpoints: named places where a crash test can kill the process.

``BINLAKE_FAILPOINT=<name>:exit`` makes ``hit(name)`` end the process at once
with status 137 (as kill -9 would: no ``finally``, no flush, no atexit);
``<name>:raise`` raises ``FailpointError`` there instead. Unset (always, in
production) ``hit`` is one environment lookup.

The names, where they are, and what a crash there must not break:

``before-db-commit``      TxnWriter, after the prewrite binlog, before the
                          upstream commit (the Pump must resolve it as rolled back)
``after-db-commit``       TxnWriter, after the upstream commit, before the commit
                          binlog (the Pump must resolve it as committed)
``ingest-before-ledger``  ingest, after the window's change and DDL rows are
                          written, before its ``windows`` row (the window must
                          stay "not ingested" and a re-run must give the same tables)
``apply-before-commit``   apply (consistent mode), a window's rows and checkpoint
                          written, before the target commit (nothing of it may show)
``apply-after-window``    apply, after a window committed (the checkpoint is its end)
``apply-after-group``     apply (parallel mode), in a Spark task after one conflict
                          group committed (a rerun applies only the other groups)
``snapshot-after-table``  snapshot, after a table's data, before the snapshot's
                          marker row (no reader may use the partial snapshot)
``history-before-catalog`` history, after a table's MERGE, before its catalog row
                          (a re-run must rewind and leave the same table)
``restore-before-manifest`` restore --out, after the tables, before the manifest
"""

from __future__ import annotations

import os

ENV = "BINLAKE_FAILPOINT"
NAMES = ("before-db-commit", "after-db-commit", "ingest-before-ledger", "apply-before-commit",
         "apply-after-window", "apply-after-group", "snapshot-after-table", "history-before-catalog",
         "restore-before-manifest")


class FailpointError(Exception):
    """Raised at a failpoint set to ``:raise``."""


def hit(name: str) -> None:
    """Crash here if ``BINLAKE_FAILPOINT`` names this place."""
    spec = os.environ.get(ENV, "")
    if not spec:
        return
    point, _, action = spec.partition(":")
    if point != name:
        return
    if action == "exit":
        os._exit(137)
    raise FailpointError(f"failpoint {name}")
