"""How far a Pump may collect: retention, held by consumers' checkpoints,
overridden only by an explicit hard limit.

A Pump keeps binlogs for ``gc_retention_days``, but never collects anything a
registered consumer (the lake's ingest, a replication task) has not consumed:
the GC ts stays at or below the lowest consumer checkpoint, as TiDB Binlog's
Pumps wait for their slowest Drainer. A stopped ingest therefore holds every
Pump's GC until it catches up or an operator removes it (``binlake ctl
remove-consumer``). Only a hard limit (``gc_hard_limit_days`` or
``gc_hard_limit_bytes``, both off by default) may collect past a checkpoint,
and the decision then names what each consumer loses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from binlake import tso
from binlake.registry.model import ConsumerRecord

MS_PER_DAY = 86_400_000


@dataclasses.dataclass(frozen=True)
class GCDecision:
    """The GC ts a Pump may move to now, and why."""

    # Collect every transaction with commit_ts below this (storage clamps it to the safe ts).
    target_ts: int
    # What retention alone would allow.
    retention_ts: int
    # The consumer holding GC back (lowest checkpoint), or None.
    held_by: ConsumerRecord | None
    # Set when a hard limit overrode a checkpoint: the limit that did it.
    forced_by: str | None = None
    # (consumer id, lost window start, lost window end) for every consumer whose
    # checkpoint is below target_ts: binlogs it has not read will be removed.
    lost: tuple[tuple[str, int, int], ...] = ()

    def describe_lost(self) -> str:
        return "; ".join(
            f"consumer {cid} loses [{tso.format_ts(lo)}, {tso.format_ts(hi)})" for cid, lo, hi in self.lost
        )


def decide(
    now_ts: int,
    *,
    retention_days: float,
    consumers: Sequence[ConsumerRecord],
    hard_limit_days: float = 0.0,
    hard_limit_bytes: int = 0,
    storage_bytes: int = 0,
) -> GCDecision:
    """The GC target at ``now_ts``. A hard limit of 0 is off."""
    if retention_days <= 0:
        # Retention 0 would mean "collect everything"; it is still held by consumers.
        retention_ts = now_ts
    else:
        retention_ts = tso.compose(max(0, tso.physical_ms(now_ts) - int(retention_days * MS_PER_DAY)))
    holder = min(consumers, key=lambda c: (c.checkpoint_ts, c.consumer_id), default=None)
    if holder is None or holder.checkpoint_ts >= retention_ts:
        return GCDecision(retention_ts, retention_ts, None)
    target = holder.checkpoint_ts
    forced_by: str | None = None
    if hard_limit_days > 0:
        hard_ts = tso.compose(max(0, tso.physical_ms(now_ts) - int(hard_limit_days * MS_PER_DAY)))
        if min(hard_ts, retention_ts) > target:
            target = min(hard_ts, retention_ts)
            forced_by = f"gc_hard_limit_days={hard_limit_days:g}"
    if hard_limit_bytes > 0 and storage_bytes > hard_limit_bytes:
        target = retention_ts
        forced_by = f"gc_hard_limit_bytes={hard_limit_bytes} (storage is {storage_bytes} bytes)"
    lost = tuple(
        (c.consumer_id, c.checkpoint_ts, target)
        for c in sorted(consumers, key=lambda c: c.consumer_id) if c.checkpoint_ts < target
    )
    return GCDecision(target, retention_ts, holder, forced_by if lost else None, lost)
