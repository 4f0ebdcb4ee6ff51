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

FRAMES_FULL: int
FRAMES_MORE: int
FRAMES_EOF: int
FRAMES_ERROR: int

def frames(buf: bytes | bytearray | memoryview, pos: int, max_rows: int, /) -> tuple[list[bytes], int, int]:
    """Row payloads split out of a result set's packets in ``buf`` from ``pos``:
    (payloads, next_pos, status), status one of the FRAMES_* (see the C source)."""
