"""The GC rule: retention, held at the lowest consumer checkpoint, overridden
only by an explicit hard limit (which names what each consumer loses)."""

from __future__ import annotations

from binlake import tso
from binlake.pump.gc import MS_PER_DAY, decide
from binlake.registry.model import ConsumerRecord

NOW_MS = 1_800_000_000_000
NOW = tso.compose(NOW_MS)


def days_ago(days: float) -> int:
    return tso.compose(NOW_MS - int(days * MS_PER_DAY))


def test_no_consumer_means_retention_alone() -> None:
    d = decide(NOW, retention_days=7, consumers=[])
    assert d.target_ts == d.retention_ts == days_ago(7) and d.held_by is None and not d.lost


def test_lowest_checkpoint_holds_gc_whatever_the_retention() -> None:
    lake, repl = ConsumerRecord("lake", days_ago(30)), ConsumerRecord("repl", days_ago(10))
    for retention in (0, 1, 7):
        d = decide(NOW, retention_days=retention, consumers=[repl, lake])
        assert d.target_ts == lake.checkpoint_ts and d.held_by == lake and d.forced_by is None and not d.lost
    # A consumer that consumed nothing yet holds everything.
    assert decide(NOW, retention_days=0, consumers=[ConsumerRecord("new", 0)]).target_ts == 0


def test_checkpoint_past_retention_lets_retention_decide() -> None:
    d = decide(NOW, retention_days=7, consumers=[ConsumerRecord("lake", days_ago(1))])
    assert d.target_ts == days_ago(7) and d.held_by is None


def test_hard_limit_days_overrides_naming_the_windows_lost() -> None:
    lake, fresh = ConsumerRecord("lake", days_ago(30)), ConsumerRecord("fresh", days_ago(2))
    d = decide(NOW, retention_days=7, consumers=[lake, fresh], hard_limit_days=20)
    assert d.target_ts == days_ago(20) and d.forced_by == "gc_hard_limit_days=20"
    assert d.lost == (("lake", lake.checkpoint_ts, days_ago(20)),)
    assert "consumer lake loses [" in d.describe_lost()
    # A hard limit the checkpoint is within changes nothing.
    d = decide(NOW, retention_days=7, consumers=[lake], hard_limit_days=40)
    assert d.target_ts == lake.checkpoint_ts and d.forced_by is None and not d.lost
    # The hard limit never collects more than retention would.
    d = decide(NOW, retention_days=7, consumers=[lake], hard_limit_days=1)
    assert d.target_ts == days_ago(7)


def test_hard_limit_bytes_overrides_only_above_the_size() -> None:
    lake = ConsumerRecord("lake", days_ago(30))
    under = decide(NOW, retention_days=7, consumers=[lake], hard_limit_bytes=1000, storage_bytes=999)
    assert under.target_ts == lake.checkpoint_ts and under.forced_by is None
    over = decide(NOW, retention_days=7, consumers=[lake], hard_limit_bytes=1000, storage_bytes=1001)
    assert over.target_ts == days_ago(7) and over.forced_by is not None and over.lost[0][0] == "lake"
