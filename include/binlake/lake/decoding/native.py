"""The optional native image decoder (``binlake.lake.decoding._imagec``) and its Arrow string buffers.

The step serialized row -> image JSON runs in the C extension ``_imagec`` when
it is built (``pip install -e .`` builds it), which returns exactly the text of
the pure-Python path (``binlake.lake.decoding.image``), or hands the row back to it
(anything unusual: garbled bytes, invalid UTF-8, NaN, dates beyond year 9999),
so results and errors never depend on whether it is there. Without the
extension everything runs in Python; ``BINLAKE_NATIVE_DECODE=0`` in the
environment forces the Python path (a diagnostic switch, read when a
``ChangeDecoder`` is made). Natively, ``ChangeDecoder`` has the C code write the
images (and op) straight into Arrow's string layout (``StringColumn``), rows
handed back to Python included, in their place: the Arrow batch the data source
builds from either path is the same (``batch.equals``).

Other modules get the extension through ``imagec()`` at call time (never
``from ... import``), so that setting ``_imagec`` to None behaves as on a machine
where it was not built.
"""

from __future__ import annotations

import array
import struct
from collections.abc import Iterator
from types import ModuleType
from typing import Any

# The extension module (typed by its .pyi), or None where it was not built.
_imagec: ModuleType | None
try:  # the native image decoder; optional: without it the pure-Python path does everything
    from binlake.lake.decoding import _imagec
    _IMAGEC_ERROR = ""
except ImportError as _exc:  # not built (no C compiler when installed), or built for another Python
    _imagec = None
    _IMAGEC_ERROR = str(_exc)

# The environment switch: "0" forces the pure-Python path (read when a ChangeDecoder is made).
NATIVE_DECODE_ENV = "BINLAKE_NATIVE_DECODE"


def native_available() -> bool:
    """Whether the native image decoder (``binlake.lake.decoding._imagec``) was built and imports
    (``native_import_error()`` says why not)."""
    return _imagec is not None


def imagec() -> Any:
    """The extension module ``_imagec``, or None when it is not built (read at call
    time, so a test setting ``native._imagec = None`` sees the machine without it)."""
    return _imagec


def native_import_error() -> str:
    """Why ``binlake.lake.decoding._imagec`` did not import ("" when it did)."""
    return _IMAGEC_ERROR


def native_enabled() -> bool:
    """Whether a ChangeDecoder uses the native decoder by default: it is built and
    ``[native] decode`` (``BINLAKE_NATIVE_DECODE``) is not off."""
    from binlake import config

    return _imagec is not None and config.load(config.NativeSettings).decode


_OFFSETS = struct.Struct("=2i")  # a value's start and end in a StringColumn
IMAGE_COLUMNS = ("op", "keys", "before", "after")  # the order of _imagec.Columns.take()


class StringColumn:
    """A column of str or None in Arrow's string layout: ``offsets`` (int32 per row +
    1, native byte order), ``data`` (the UTF-8 text back to back), ``validity`` (a
    bitmap, bit set = not null; None when there is no null). What the native decoder
    hands over instead of a list, so the text never becomes Python objects on its
    way to Arrow (``binlake.lake.pumps.datasource.changes_batch`` wraps the buffers). Reads
    like a list (``len``, iteration, indexing, ``==`` with a list) for everything else."""

    __slots__ = ("length", "offsets", "data", "validity", "null_count")

    def __init__(self, length: int, offsets: bytes, data: bytes, validity: bytes | None, null_count: int) -> None:
        self.length = length
        self.offsets = offsets
        self.data = data
        self.validity = validity
        self.null_count = null_count

    def __len__(self) -> int:
        return self.length

    def to_list(self) -> list[str | None]:
        offs = array.array("i", self.offsets)
        valid = self.validity
        data = self.data
        return [data[offs[i]:offs[i + 1]].decode() if valid is None or valid[i >> 3] >> (i & 7) & 1 else None
                for i in range(self.length)]

    def __iter__(self) -> Iterator[str | None]:
        return iter(self.to_list())

    def __getitem__(self, index: int) -> str | None:
        i = range(self.length)[index]  # a list's IndexError and negative indices
        if self.validity is not None and not self.validity[i >> 3] >> (i & 7) & 1:
            return None
        start, end = _OFFSETS.unpack_from(self.offsets, 4 * i)
        return self.data[start:end].decode()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringColumn):
            return self.to_list() == other.to_list()
        if isinstance(other, list):
            return self.to_list() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StringColumn({self.to_list()!r})"
