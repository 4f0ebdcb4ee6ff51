"""Types of ``binlake.source.postgres._pgoutc``, the C extension built from ``_pgoutc.c``
(its header comment states the contract: the Python path's exact bytes, or None)."""

from collections.abc import Sequence
from typing import final

from typing_extensions import Buffer

@final
class Plan:
    """A table version's pgoutput tuple plan: cols are (kind: pgplan.K_*, column id,
    nullable) in column order."""

    def __init__(self, cols: Sequence[tuple[int, int, bool]]) -> None: ...
    def row(self, data: Buffer, offset: int, /) -> tuple[bytes, int] | None: ...
    def update(self, data: Buffer, offset: int, /) -> tuple[bytes, int] | None: ...
    def copy_rows(self, data: Buffer, /) -> list[bytes] | None: ...
    def columns(self) -> int: ...
