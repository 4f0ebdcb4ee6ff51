"""TSO: the timestamps that order every transaction.

A TSO is ``physical_ms << 18 | logical``: milliseconds since the Unix epoch in
the high bits and an 18-bit counter below them, as PD hands them out. This
module converts between TSOs and datetimes (UTC unless a zone is given) and
holds the allocator the registry uses.
"""

from __future__ import annotations

import datetime as _dt
import threading
import time
from collections.abc import Callable

LOGICAL_BITS = 18
LOGICAL_MASK = (1 << LOGICAL_BITS) - 1
MAX_LOGICAL = 1 << LOGICAL_BITS
# The largest TSO we accept anywhere (a signed 64-bit int).
MAX_TS = (1 << 63) - 1

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def compose(physical_ms: int, logical: int = 0) -> int:
    """Build a TSO from its parts."""
    for value in (physical_ms, logical):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError("physical_ms and logical must be integers")
    if physical_ms < 0:
        raise ValueError(f"physical_ms must be >= 0, got {physical_ms}")
    if not 0 <= logical < MAX_LOGICAL:
        raise ValueError(f"logical must be in [0, {MAX_LOGICAL}), got {logical}")
    ts = (physical_ms << LOGICAL_BITS) | logical
    if ts > MAX_TS:
        raise ValueError(f"physical_ms {physical_ms} is too large for a 63-bit TSO")
    return ts


def physical_ms(ts: int) -> int:
    """The millisecond part of a TSO."""
    _check_ts(ts)
    return ts >> LOGICAL_BITS


def logical(ts: int) -> int:
    """The logical counter of a TSO."""
    _check_ts(ts)
    return ts & LOGICAL_MASK


def to_datetime(ts: int, tz: _dt.tzinfo | None = None) -> _dt.datetime:
    """The wall-clock time of a TSO (UTC unless ``tz`` is given)."""
    _check_ts(ts)
    moment = _EPOCH + _dt.timedelta(milliseconds=ts >> LOGICAL_BITS)
    return moment.astimezone(tz) if tz is not None else moment


def from_datetime(moment: _dt.datetime, tz: _dt.tzinfo | None = None) -> int:
    """The smallest TSO at ``moment``: every ts issued at or after it is >= this.

    A naive datetime is read in ``tz`` (UTC when ``tz`` is None).
    """
    if not isinstance(moment, _dt.datetime):
        raise TypeError(f"expected a datetime, got {type(moment).__name__}")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=tz or _dt.UTC)
    delta = moment - _EPOCH
    ms = (delta.days * 86_400_000) + (delta.seconds * 1000) + (delta.microseconds // 1000)
    if ms < 0:
        raise ValueError(f"{moment.isoformat()} is before 1970-01-01: no TSO exists for it")
    return compose(ms, 0)


def parse_datetime(text: str, tz: _dt.tzinfo | None = None) -> int:
    """Parse an ISO-8601 datetime (``2026-11-21T08:00:00``, optional offset) to a TSO."""
    try:
        moment = _dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise ValueError(
            f"cannot read {text!r} as a datetime; use ISO-8601 such as 2026-11-21T08:00:00 "
            "or 2026-11-21T08:00:00+01:00"
        ) from None
    return from_datetime(moment, tz)


def format_ts(ts: int) -> str:
    """``ts (UTC datetime)`` for logs and tables; 0 prints as ``-``."""
    if ts <= 0:
        return "-"
    return f"{ts} ({to_datetime(ts).strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]}Z)"


def iso(ts: int, millis: bool = False) -> str:
    """``ts`` as an ISO UTC datetime ending in ``Z`` (microseconds, or milliseconds when
    ``millis``), for messages naming a window; 0 (no ts yet) prints as ``-``."""
    if ts <= 0:
        return "-"
    text = to_datetime(ts).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return (text[:-3] if millis else text) + "Z"


def _check_ts(ts: int) -> None:
    if isinstance(ts, bool) or not isinstance(ts, int):
        raise TypeError(f"a TSO is an integer, got {type(ts).__name__}")
    if not 0 <= ts <= MAX_TS:
        raise ValueError(f"a TSO must be in [0, 2^63), got {ts}")


class TSOAllocator:
    """Hands out strictly increasing TSOs, in batches, across restarts and crashes.

    ``load_limit``/``save_limit`` persist a high-water mark: no TSO at or above the
    persisted physical limit is ever handed out before a higher limit is saved.
    On start, the allocator begins above the saved limit, so a crash can skip
    timestamps but never repeat one (PD's scheme).
    """

    def __init__(
        self,
        load_limit: Callable[[], int],
        save_limit: Callable[[int], None],
        *,
        window_ms: int = 3000,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        if window_ms <= 0:
            raise ValueError("window_ms must be > 0")
        self._save_limit = save_limit
        self._window_ms = window_ms
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._lock = threading.Lock()
        saved = load_limit()
        # Invariant: every TSO handed out has physical < self._limit, and
        # self._limit has been persisted before such a TSO is returned.
        self._physical = max(self._clock_ms(), saved + 1)
        self._logical = 0
        self._limit = saved
        self._ensure_limit(self._physical)

    def _ensure_limit(self, physical: int) -> None:
        if physical >= self._limit:
            new_limit = physical + self._window_ms
            self._save_limit(new_limit)
            self._limit = new_limit

    @property
    def limit(self) -> int:
        """The persisted high-water mark (physical ms)."""
        return self._limit

    def allocate(self, count: int = 1) -> int:
        """Reserve ``count`` consecutive TSOs; return the first."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError("count must be an integer")
        if not 1 <= count <= MAX_LOGICAL:
            raise ValueError(f"count must be in [1, {MAX_LOGICAL}], got {count}")
        with self._lock:
            now = self._clock_ms()
            if now > self._physical:
                self._physical, self._logical = now, 0
            if self._logical + count > MAX_LOGICAL:
                # The logical counter of this millisecond is spent: borrow the next one.
                self._physical += 1
                self._logical = 0
            self._ensure_limit(self._physical)
            first = compose(self._physical, self._logical)
            self._logical += count
            return first
