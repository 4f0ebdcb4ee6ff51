"""Types of ``binlake.source.mysql._framec``, the C extension built from ``_framec.c``
(its header comment lists the event tuples ``feed`` returns)."""

from typing import Any, final

from typing_extensions import Buffer

@final
class Framer:
    """Frames a replication stream into event tuples."""

    def __init__(self, checksum: bool) -> None: ...
    def feed(self, data: Buffer, /) -> list[tuple[Any, ...]]: ...
    def set_post_header(self, lengths: Buffer, /) -> None: ...
    def pending(self) -> int: ...

def crc32(data: Buffer, /) -> int: ...
