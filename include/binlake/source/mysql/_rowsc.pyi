"""Types of ``binlake.source.mysql._rowsc``, the C extension built from ``_rowsc.c``
(its header comment states the contract: the Python path's exact bytes, or None)."""

from collections.abc import Sequence
from typing import final

from typing_extensions import Buffer

# One column of a plan (rowsplan.build_plan): op (rowsplan.OP_*), size, a, b, column
# id, nullable, NULL read as the empty string (a SET that may not be NULL), the ENUM /
# SET members, a single-byte charset's byte -> code point table (256 entries, -1: none).
_PlanColumn = tuple[int, int, int, int, int, bool, bool, Sequence[bytes] | None, Sequence[int] | None]

@final
class Plan:
    """A table version's decoding plan for row-event bodies."""

    def __init__(self, cols: Sequence[_PlanColumn]) -> None: ...
    def decode(self, body: Buffer, start: int, end: int, update: bool, bitmap1: Buffer, bitmap2: Buffer | None,
               /) -> list[bytes] | None:
        """Serialized Rows (UpdatedRows for an update) of body[start:end], or None: ask Python."""
    def columns(self) -> int: ...

def prewrite_value(schema_version: int, mutations: list[tuple[int, list[bytes], list[bytes], list[bytes], bytes]],
                   /) -> bytes:
    """A transaction's serialized PrewriteValue: per mutation (table_id, inserted, updated,
    deleted rows, sequence: one byte per MutationType)."""
