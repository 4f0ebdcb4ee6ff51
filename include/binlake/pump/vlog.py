"""The value log: append-only segment files of CRC-checked records.

Record layout (little-endian)::

    magic u32 | length u32 | crc32(payload) u32 | payload (length bytes)

Segments are named ``NNNNNNNNNNNN.vlog`` with increasing numbers; only the
newest is appended to. A record never spans two segments. The log is the
source of truth: the index can always be rebuilt from it, and after a crash a
torn tail (a short or corrupt last record) is cut at the last good record.

The newest segment is written ahead with zeros (``PREALLOC_BYTES`` at a time;
the group that writes them pays about one appending fsync, the next ~60
records of 1 KiB none) and records overwrite them: an fdatasync of blocks that
already exist flushes the data alone, with no journal commit for a new file
size (measured on ext4 here, quiet disk: 86-125 µs against 137-164 µs per fsync,
and a third less kernel CPU; on a disk busy with other work the device flush
dominates and the two are alike). So the newest segment may end in zeros after
a crash: an all-zero header marks the end of its records. On open that zero
tail (and whatever unacknowledged bytes lie past the end) is cut off before the
first append; an older segment is cut to its last record before the next
segment is created, and the newest on a clean close.
"""

from __future__ import annotations

import logging
import os
import pathlib
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import NamedTuple

from binlake import errors

log = logging.getLogger(__name__)

HEADER = struct.Struct("<III")
MAGIC = 0xB1B1A4E1
POINTER = struct.Struct("<IQI")
_SUFFIX = ".vlog"
# The newest segment is zero-filled this far ahead of its last record.
PREALLOC_BYTES = 64 << 10
_ZEROS = bytes(PREALLOC_BYTES)


class CorruptLog(errors.BinlakeError):
    """A bad record before the tail: the log was damaged, not merely cut short."""


class Pointer(NamedTuple):
    """Where a record lives: segment number, offset of its header, payload length.

    A named tuple, not a frozen dataclass: one is made for every record appended
    and every index entry read, and a tuple is built five times faster."""

    segment: int
    offset: int
    length: int

    def pack(self) -> bytes:
        return POINTER.pack(*self)

    @classmethod
    def unpack(cls, data: bytes, offset: int = 0) -> Pointer:
        return _new_pointer(cls, POINTER.unpack_from(data, offset))

    @property
    def end(self) -> int:
        return self.offset + HEADER.size + self.length


# Pointer(a, b, c) without the named tuple's keyword-handling constructor (hot paths).
_new_pointer: Callable[[type[Pointer], tuple[int, int, int]], Pointer] = tuple.__new__


def encode_record(payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


class ValueLog:
    """Segmented append-only log. Appends come from one thread at a time; reads
    (``read``) and ``sync_appended`` may come from any thread, while an append runs."""

    def __init__(self, directory: str | os.PathLike[str], *, segment_bytes: int, fsync: bool = True) -> None:
        if segment_bytes < 4096:
            raise ValueError("segment_bytes must be >= 4096")
        self.dir = pathlib.Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._read_fds: dict[int, int] = {}
        self._read_lock = threading.Lock()
        # Guards the newest segment's descriptor, _synced_offset and _roll_fsyncs
        # against ``sync_appended`` on other threads (an append holds it only to roll).
        self._fd_lock = threading.Lock()
        segs = self.segments()
        self._segment = segs[-1] if segs else 1
        path = self._path(self._segment)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._offset = os.fstat(self._fd).st_size
        # The segment's size on disk: zeros from _offset up to here.
        self._zeroed_to = self._offset
        if self._offset >= HEADER.size and os.pread(self._fd, HEADER.size, self._offset - HEADER.size) == bytes(
                HEADER.size):
            self._cut_zero_tail(path)
        self._dirty: set[int] = set()
        # The newest segment's records up to here are covered by an fsync (or
        # were there at open): what a power loss cannot take.
        self._synced_offset = self._offset
        # fsyncs of rolled-over segments, reported by the next sync().
        self._roll_fsyncs = 0
        if not segs:
            self._sync_dir()

    def _cut_zero_tail(self, path: pathlib.Path) -> None:
        """The newest segment ends in zeros (written ahead, then a crash): find its
        last record and cut the file there, so that the next append follows it and
        nothing unacknowledged past it can be read back later as a record."""
        end = 0
        with path.open("rb") as fh:
            while True:
                header = fh.read(HEADER.size)
                if len(header) < HEADER.size:
                    break
                magic, length, crc = HEADER.unpack(header)
                if magic != MAGIC:
                    break
                payload = fh.read(length)
                if len(payload) < length or zlib.crc32(payload) != crc:
                    break
                end += HEADER.size + length
        log.info("value log: %s ends at %d; cutting the %d bytes written ahead of it",
                 path.name, end, self._offset - end)
        os.ftruncate(self._fd, end)
        if self.fsync:
            os.fsync(self._fd)
        self._offset = self._zeroed_to = end

    # -- naming -------------------------------------------------------------
    def _path(self, segment: int) -> pathlib.Path:
        return self.dir / f"{segment:012d}{_SUFFIX}"

    def segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.dir.glob(f"*{_SUFFIX}") if p.stem.isdigit())

    @property
    def head(self) -> tuple[int, int]:
        """The append position: (segment, offset) just past the last record."""
        return self._segment, self._offset

    @property
    def synced_head(self) -> tuple[int, int]:
        """(segment, offset) up to which the records are covered by an fsync."""
        return self._segment, self._synced_offset

    def size_bytes(self) -> int:
        total = 0
        for seg in self.segments():
            try:
                total += self._path(seg).stat().st_size
            except FileNotFoundError:
                pass
        return total

    # -- writing ------------------------------------------------------------
    def append(self, payloads: list[bytes]) -> list[Pointer]:
        """Append records (not yet durable: call ``sync``). Rolls to a new segment
        when a record would cross ``segment_bytes``."""
        pointers: list[Pointer] = []
        buf: list[bytes] = []
        buf_len = 0
        # Locals: this runs for every group the Pump commits.
        header, crc32, new, limit = HEADER.pack, zlib.crc32, _new_pointer, self.segment_bytes
        start = self._offset
        for payload in payloads:
            n = len(payload)
            rec_len = HEADER.size + n
            if start + buf_len + rec_len > limit and start + buf_len > 0:
                self._write(buf)
                buf, buf_len = [], 0
                self._roll()
                start = self._offset
            pointers.append(new(Pointer, (self._segment, start + buf_len, n)))
            buf.append(header(MAGIC, n, crc32(payload)))
            buf.append(payload)
            buf_len += rec_len
        if buf:
            self._write(buf)
        return pointers

    def _write(self, parts: list[bytes]) -> None:
        data = b"".join(parts)
        end = self._offset + len(data)
        if end > self._zeroed_to:
            # Zero-fill ahead (see the module docstring); made durable by the
            # next sync together with the records written over it.
            target = max(end, min(self._zeroed_to + PREALLOC_BYTES, self.segment_bytes))
            while self._zeroed_to < target:
                n = os.pwrite(self._fd, memoryview(_ZEROS)[: min(PREALLOC_BYTES, target - self._zeroed_to)],
                              self._zeroed_to)
                self._zeroed_to += n
        view = memoryview(data)
        offset = self._offset
        while view:
            n = os.pwrite(self._fd, view, offset)
            view = view[n:]
            offset += n
        self._offset = end
        self._dirty.add(self._fd)

    def _cut_to_end(self, fd: int) -> None:
        """Drop the zeros written ahead of the last record (before the segment is closed)."""
        if self._zeroed_to > self._offset:
            os.ftruncate(fd, self._offset)
            self._zeroed_to = self._offset
            self._dirty.add(fd)

    def _roll(self) -> None:
        # The old segment is made durable before a newer segment exists: recovery
        # treats a bad record in any segment but the newest as damage (CorruptLog),
        # so a power loss must never leave a torn record in a segment that has a
        # successor on disk.
        old_fd = self._fd
        self._cut_to_end(old_fd)  # only the newest segment may end in zeros
        synced = self.fsync and old_fd in self._dirty
        if synced:
            os.fdatasync(old_fd)
        self._dirty.discard(old_fd)
        with self._fd_lock:
            self._roll_fsyncs += synced
            os.close(old_fd)
            self._segment += 1
            self._fd = os.open(self._path(self._segment), os.O_RDWR | os.O_CREAT, 0o644)
            self._offset = self._zeroed_to = self._synced_offset = 0
        self._sync_dir()

    def sync(self) -> int:
        """Make every appended record durable. Returns the number of fsyncs issued
        (counting those of segments rolled over since the last sync)."""
        n, self._roll_fsyncs = self._roll_fsyncs, 0
        if self.fsync:
            for fd in list(self._dirty):
                os.fdatasync(fd)
                n += 1
        self._dirty.clear()
        self._synced_offset = self._offset
        return n

    def sync_appended(self) -> int:
        """``sync`` for a thread other than the appending one, while appends go on:
        fdatasync the newest segment through a duplicate of its descriptor (a roll
        may close the original meanwhile; a rolled-over segment was fsynced by the
        roll). Everything appended before the call is durable when it returns; the
        caller says how far that is with ``mark_synced``. Returns the fsyncs issued
        (with those of segments rolled over since the last sync)."""
        with self._fd_lock:
            n, self._roll_fsyncs = self._roll_fsyncs, 0
            if not self.fsync:
                return n
            fd = os.dup(self._fd)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
        return n + 1

    def mark_synced(self, head: tuple[int, int]) -> None:
        """Record that the records up to ``head`` (a ``head`` read after they were
        appended, before a ``sync_appended`` began) are durable."""
        with self._fd_lock:
            if head[0] == self._segment and head[1] > self._synced_offset:
                self._synced_offset = head[1]

    def drop_unsynced(self) -> None:
        """Cut the newest segment back to the end of its last fsync: what a power
        loss does to records only the page cache holds (a kill -9 keeps them).
        For crash tests (the ``pump-power-loss`` failpoint); the log must not be
        appended to afterwards."""
        os.ftruncate(self._fd, self._synced_offset)
        os.fsync(self._fd)
        self._offset = self._zeroed_to = self._synced_offset

    def _sync_dir(self) -> None:
        if not self.fsync:
            return
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- reading ------------------------------------------------------------
    def _reader(self, segment: int) -> int:
        fd = self._read_fds.get(segment)
        if fd is None:
            with self._read_lock:
                fd = self._read_fds.get(segment)
                if fd is None:
                    try:
                        fd = os.open(self._path(segment), os.O_RDONLY)
                    except FileNotFoundError:
                        raise errors.OutOfRange(
                            f"value log segment {segment} was removed by GC"
                        ) from None
                    self._read_fds[segment] = fd
        return fd

    def read(self, ptr: Pointer) -> bytes:
        """Read and check one record's payload."""
        data = os.pread(self._reader(ptr.segment), HEADER.size + ptr.length, ptr.offset)
        # Past the last record of the newest segment lie zeros written ahead, not a record.
        if len(data) != HEADER.size + ptr.length or (ptr.segment == self._segment and ptr.end > self._offset):
            raise CorruptLog(f"record at segment {ptr.segment} offset {ptr.offset} is short")
        magic, length, crc = HEADER.unpack_from(data)
        payload = data[HEADER.size :]
        if magic != MAGIC or length != ptr.length or zlib.crc32(payload) != crc:
            raise CorruptLog(f"record at segment {ptr.segment} offset {ptr.offset} fails its checksum")
        return payload

    def read_slices(self, ptr: Pointer, size: int) -> Iterator[bytes]:
        """One record's payload in slices of at most ``size`` bytes, read one at a
        time; the checksum is verified before the last slice is yielded (so a
        reader that got every slice got checked bytes)."""
        fd = self._reader(ptr.segment)
        header = os.pread(fd, HEADER.size, ptr.offset)
        if len(header) != HEADER.size or (ptr.segment == self._segment and ptr.end > self._offset):
            raise CorruptLog(f"record at segment {ptr.segment} offset {ptr.offset} is short")
        magic, length, crc = HEADER.unpack(header)
        if magic != MAGIC or length != ptr.length:
            raise CorruptLog(f"record at segment {ptr.segment} offset {ptr.offset} has a bad header")
        running = 0
        done = 0
        while done < length:
            data = os.pread(fd, min(size, length - done), ptr.offset + HEADER.size + done)
            if not data:
                raise CorruptLog(f"record at segment {ptr.segment} offset {ptr.offset} is short")
            running = zlib.crc32(data, running)
            done += len(data)
            if done >= length and running != crc:
                raise CorruptLog(f"record at segment {ptr.segment} offset {ptr.offset} fails its checksum")
            yield data

    def scan(self, segment: int, offset: int) -> Iterator[tuple[Pointer, bytes]]:
        """Yield every good record from (segment, offset) to the end of the log.

        A bad record in the newest segment is a torn tail: the segment is
        truncated there (and the rest skipped). A bad record in an older
        segment raises CorruptLog: that is damage, not an interrupted write.
        """
        for seg in [s for s in self.segments() if s >= segment]:
            path = self._path(seg)
            start = offset if seg == segment else 0
            is_last = seg == self._segment
            with path.open("rb") as fh:
                fh.seek(start)
                pos = start
                while True:
                    header = fh.read(HEADER.size)
                    if not header:
                        break
                    if is_last and pos == self._offset:
                        break  # the end of the records; zeros written ahead may follow
                    bad = None
                    if len(header) < HEADER.size:
                        bad = "short header"
                    else:
                        magic, length, crc = HEADER.unpack(header)
                        if magic != MAGIC:
                            bad = "bad magic"
                        else:
                            payload = fh.read(length)
                            if len(payload) < length:
                                bad = "short payload"
                            elif zlib.crc32(payload) != crc:
                                bad = "checksum mismatch"
                    if bad is not None:
                        if not is_last:
                            raise CorruptLog(
                                f"value log segment {path} is damaged at offset {pos} ({bad}); "
                                "it is not the newest segment, so this is not a torn write"
                            )
                        size = path.stat().st_size
                        log.warning(
                            "value log: cutting torn tail of %s at offset %d (%s; %d bytes dropped)",
                            path.name, pos, bad, size - pos,
                        )
                        os.ftruncate(self._fd, pos)
                        if self.fsync:
                            os.fsync(self._fd)
                        self._offset = self._zeroed_to = pos
                        break
                    yield Pointer(seg, pos, length), payload
                    pos += HEADER.size + length

    # -- GC -----------------------------------------------------------------
    def remove_below(self, segment: int) -> list[int]:
        """Delete every segment numbered below ``segment`` (never the active one)."""
        removed = []
        for seg in self.segments():
            if seg >= segment or seg >= self._segment:
                break
            with self._read_lock:
                fd = self._read_fds.pop(seg, None)
            if fd is not None:
                os.close(fd)
            self._path(seg).unlink(missing_ok=True)
            removed.append(seg)
        if removed:
            self._sync_dir()
        return removed

    def close(self) -> None:
        self._cut_to_end(self._fd)
        self.sync()
        os.close(self._fd)
        with self._read_lock:
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
