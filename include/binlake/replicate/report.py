"""What an apply run did, for people and for programs: the summary it
returns (``ApplySummary``; ``summary`` is the CLI's text), the same as
JSON-ready values (``summary_dict``: jobs, the DAG's XCom, ``--json``), and
the progress bar of its per-window progress lines."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from binlake import tso
from binlake.replicate.compactor import DELETE, INSERT, UPDATE


@dataclasses.dataclass
class ApplySummary:
    """Counts of one apply run (``runner.Applier.run``)."""

    task: str
    target: str
    windows: int = 0
    changes_by_op: Counter[str] = dataclasses.field(default_factory=Counter)
    rows_written: int = 0  # rows deleted + inserted/upserted after compaction
    ddls: int = 0
    filtered: int = 0
    elapsed_s: float = 0.0
    checkpoint_ts: int = 0
    first_window: tuple[int, int] | None = None
    last_window: tuple[int, int] | None = None
    behind: int = 0
    split_windows: int = 0  # windows over the read budget, read and applied in pieces
    pieces: int = 0  # the pieces those windows took
    largest_read: int = 0  # the most row changes one read of the lake held

    @property
    def changes(self) -> int:
        return sum(self.changes_by_op.values())

    def summary(self) -> str:
        rate = self.changes / self.elapsed_s if self.elapsed_s > 0 else 0.0
        ops = ", ".join(f"{self.changes_by_op.get(op, 0):,} {op}" for op in (INSERT, UPDATE, DELETE))
        lines = [f"apply {self.task} -> {self.target}",
                 f"  windows      {self.windows}" + (f"  [{self.first_window[0]} .. {self.last_window[1]})"
                                                     if self.first_window and self.last_window else ""),
                 f"  row changes  {self.changes:,} ({ops}); {self.filtered:,} filtered out",
                 f"  rows written {self.rows_written:,} after compaction",
                 f"  DDLs         {self.ddls}",
                 f"  largest read {self.largest_read:,} row changes"
                 + (f"; {self.split_windows} window(s) read in {self.pieces} pieces" if self.split_windows else ""),
                 f"  rate         {rate:,.0f} row changes/s in {self.elapsed_s:.1f}s",
                 f"  checkpoint   {self.checkpoint_ts} ({tso.iso(self.checkpoint_ts)})"]
        if self.behind:
            lines.append(f"  not applied  {self.behind} later window(s) (beyond --until)")
        return "\n".join(lines)


def summary_dict(s: ApplySummary) -> dict[str, Any]:
    """The summary as JSON-ready values (jobs, the DAG's XCom, ``--json``)."""
    return {"task": s.task, "target": s.target, "windows": s.windows, "changes_by_op": dict(s.changes_by_op),
            "changes": s.changes, "rows_written": s.rows_written, "ddls": s.ddls, "filtered": s.filtered,
            "checkpoint_ts": s.checkpoint_ts, "elapsed_s": round(s.elapsed_s, 3), "behind": s.behind,
            "split_windows": s.split_windows, "pieces": s.pieces, "largest_read": s.largest_read}


def progress_bar(n: int, total: int, width: int = 20) -> str:
    """``n`` of ``total`` as a bar of ``width`` characters (``#`` done, ``.`` to do)."""
    done = width * n // max(1, total)
    return "#" * done + "." * (width - done)
