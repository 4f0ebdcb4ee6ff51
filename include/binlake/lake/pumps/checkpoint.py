"""The lake as a registered consumer: its checkpoint holds every Pump's GC.

The lake's checkpoint is the end of its *contiguous ingested ledger*: starting
at the lowest ``windows`` row, the end of the run of done windows with no gap
between them. Every transaction below it is in the lake; a gap (a window that
failed, or a backfill still to run) keeps the checkpoint at the gap, so the
Pumps keep the binlogs that backfill needs.

Crash safety: the ingest writes the ``windows`` row first and the checkpoint
after it, and the checkpoint is always recomputed from the whole ledger. A
crash between the two leaves the registry's checkpoint behind the lake (GC is
held a little longer, never too little); the next ingest moves it forward.
The registry keeps the highest checkpoint it was given, so reports arriving
late or twice never move it back.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

from binlake.registry.client import RegistryClient
from binlake.registry.model import ConsumerRecord

# Overrides the lake's consumer id (e.g. two lakes on different hosts with the same path).
CONSUMER_ID_ENV = "BINLAKE_LAKE_CONSUMER_ID"
_MAX_ID = 128


def consumer_id(lake: str) -> str:
    """The lake's consumer id: ``$BINLAKE_LAKE_CONSUMER_ID``, else ``lake:<absolute path or URI>``
    (a hash of it when the path is too long or has whitespace)."""
    from binlake import config

    override = config.load(config.LakeSettings).consumer_id
    if override:
        return override
    where = lake if "://" in lake else os.path.abspath(lake)
    readable = f"lake:{where.rstrip('/')}"
    if len(readable) <= _MAX_ID and readable.isprintable() and not any(c.isspace() for c in readable):
        return readable
    return "lake-" + hashlib.sha256(where.encode()).hexdigest()[:16]


def contiguous_end(windows: Iterable[Mapping[str, Any]]) -> int | None:
    """The end of the gap-free run of done windows starting at the lowest one (None: no window)."""
    spans = sorted((int(w["start_ts"]), int(w["end_ts"])) for w in windows if w.get("status", "done") == "done")
    if not spans:
        return None
    end = spans[0][1]
    for s, e in spans[1:]:
        if s > end:
            break
        end = max(end, e)
    return end


def report(registry: str, lake: str, checkpoint_ts: int) -> ConsumerRecord:
    """Register the lake as a consumer (if new) with ``checkpoint_ts`` (kept only if higher)."""
    where = lake if "://" in lake else os.path.abspath(lake)
    with RegistryClient(registry) as reg:
        return reg.update_consumer(consumer_id(lake), checkpoint_ts, f"binlake lake {where}")
