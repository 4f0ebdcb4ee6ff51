"""Types of ``binlake.source.mysql._snaprowc``, the C extension built from ``_snaprowc.c``
(its header comment states the contract: the Python path's exact bytes, or None)."""

from collections.abc import Sequence
from typing import final

@final
class Plan:
    """A table version's plan for the snapshot's text-protocol row packets: cols are
    (op: snapshot.T_*, column id, nullable, a) in column order."""

    def __init__(self, cols: Sequence[tuple[int, int, bool, int]]) -> None: ...
    def rows(self, packets: Sequence[bytes], /) -> list[bytes] | None: ...
    def columns(self) -> int: ...
