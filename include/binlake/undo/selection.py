"""Which change rows an undo reverts, and the checks made before any work.

A selection is either a commit_ts range ``[start, end)`` (TSOs or datetimes, as
a window is given to ``binlake ingest``) or a list of transactions by their
start_ts, narrowed by ``tables`` (TABLE or DB.TABLE, as named today) and
``where`` (a Spark SQL predicate over the change rows: op, db, table,
commit_ts, start_ts and the typed ``before``/``after`` images). Its
``digest`` names it in the target's ``_binlake_undo`` record: the same
selection undone twice is recognised, whatever flags the second run has.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence

from binlake import errors, tso


@dataclasses.dataclass(frozen=True)
class Selection:
    """``start_ts``/``end_ts``: the range ``[start_ts, end_ts)``, or None with ``txns``."""

    start_ts: int | None = None
    end_ts: int | None = None
    txns: tuple[int, ...] = ()
    tables: tuple[str, ...] | None = None
    where: str | None = None

    def describe(self) -> str:
        what = (f"transaction(s) {', '.join(str(t) for t in self.txns)}" if self.txns else
                f"commit_ts [{self.start_ts}, {self.end_ts}) ({tso.iso(int(self.start_ts or 0), millis=True)} .. "
                f"{tso.iso(int(self.end_ts or 0), millis=True)})")
        if self.tables:
            what += f", tables {', '.join(self.tables)}"
        if self.where:
            what += f", where {self.where}"
        return what

    def digest(self) -> str:
        """A stable name of the selection (sha256 of its canonical JSON)."""
        doc = {"start_ts": self.start_ts, "end_ts": self.end_ts, "txns": sorted(self.txns),
               "tables": sorted(self.tables) if self.tables else None, "where": self.where}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    def to_dict(self) -> dict[str, object]:
        return {"start_ts": self.start_ts, "end_ts": self.end_ts, "txns": list(self.txns),
                "tables": list(self.tables) if self.tables else None, "where": self.where}


def parse_time(flag: str, text: str | None, tz: str | None) -> int | None:
    """A TSO (digits) or a datetime (ISO-8601, in ``tz`` or local time) as a TSO."""
    from binlake.restore.restore import resolve_ts

    if text is None:
        return None
    text = text.strip()
    if not text:
        raise errors.InvalidArgument(f"{flag} is empty: give a TSO or a datetime such as 2026-11-21T14:03")
    if text.isdigit():
        value = int(text)
        if not 0 < value < tso.MAX_TS:
            raise errors.InvalidArgument(f"{flag}: a TSO is a positive integer below 2^63, got {text}")
        return value
    try:
        return resolve_ts(None, text, tz)
    except errors.InvalidArgument as exc:
        raise errors.InvalidArgument(f"{flag}: {exc}") from None


def parse_txns(text: str | None) -> tuple[int, ...]:
    if text is None:
        return ()
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 0 < int(part) < tso.MAX_TS:
            raise errors.InvalidArgument(
                f"--txn takes start_ts values (TSOs, comma-separated), got {part!r}")
        out.append(int(part))
    if not out:
        raise errors.InvalidArgument("--txn needs at least one start_ts")
    return tuple(dict.fromkeys(out))


def choose(start: str | None = None, end: str | None = None, *, txns: str | Sequence[int] | None = None,
           tables: str | Sequence[str] | None = None, where: str | None = None, tz: str | None = None) -> Selection:
    """The checked selection of the CLI's (or the DAG's) arguments."""
    if tz is not None and not tz.strip():
        raise errors.InvalidArgument("--tz is empty: give an IANA time zone such as Europe/Paris, or UTC")
    picked = parse_txns(txns) if isinstance(txns, str) or txns is None else parse_txns(",".join(map(str, txns)))
    if picked and (start is not None or end is not None):
        raise errors.InvalidArgument("give either --start/--end or --txn, not both")
    lo, hi = parse_time("--start", start, tz), parse_time("--end", end, tz)
    if not picked:
        if lo is None or hi is None:
            raise errors.InvalidArgument("say which changes to undo: --start T1 --end T2 (TSOs or datetimes) "
                                         "or --txn START_TS[,...]")
        if hi <= lo:
            raise errors.InvalidArgument(f"--end ({hi}) must be after --start ({lo}): the range [start, end) is empty")
    names: tuple[str, ...] | None = None
    if tables is not None:
        raw = tables.split(",") if isinstance(tables, str) else list(tables)
        names = tuple(dict.fromkeys(t.strip() for t in raw if t.strip()))
        if not names:
            raise errors.InvalidArgument("--tables needs at least one table name (comma-separated, TABLE or DB.TABLE)")
    if where is not None and not where.strip():
        raise errors.InvalidArgument("--where is empty: give a Spark SQL predicate such as \"op = 'update'\"")
    return Selection(lo if not picked else None, hi if not picked else None, picked, names,
                     where.strip() if where else None)
