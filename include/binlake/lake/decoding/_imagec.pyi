"""Types of ``binlake.lake.decoding._imagec``, the C extension built from ``_imagec.c`` (its
header comment states the contract: the pure-Python path's exact text, or None)."""

from collections.abc import Iterable, Sequence
from typing import Protocol, final

# One Arrow string column as take() hands it over: int32 offsets, UTF-8 data, the
# validity bitmap (None when there is no null) and the null count.
_StringBuffers = tuple[bytes, bytes, bytes | None, int]

class _Fallback(Protocol):
    """What decodes the rows the extension hands back (``binlake.lake.image.TablePlan``)."""

    def images(self, row: bytes, /) -> tuple[str, str]: ...
    def update_images(self, data: bytes, /) -> tuple[str, str, str]: ...
    def unknown_kind(self, kind: int, /) -> None: ...

@final
class Plan:
    """One table definition's image plan: cols are (column id, '"name":', column type)
    in image order, key_idx the positions of the key columns."""

    def __init__(self, cols: Sequence[tuple[int, str, int]], key_idx: Sequence[int]) -> None: ...
    def images(self, row: bytes, /) -> tuple[str, str] | None: ...
    def update_images(self, data: bytes, /) -> tuple[str, str, str] | None: ...
    def mutation_into(self, columns: Columns, sequence: Iterable[int], inserted: Sequence[bytes],
                      updated: Sequence[bytes], deleted: Sequence[bytes], fallback: _Fallback, /) -> int: ...

@final
class Columns:
    """Growing Arrow string buffers of change rows' op, keys, before and after."""

    def __init__(self) -> None: ...
    def __len__(self) -> int: ...
    def take(self) -> tuple[int, tuple[_StringBuffers, _StringBuffers, _StringBuffers, _StringBuffers]]: ...
    def extend(self, ops: Sequence[str | None], keys: Sequence[str | None], befores: Sequence[str | None],
               afters: Sequence[str | None], /) -> None: ...
