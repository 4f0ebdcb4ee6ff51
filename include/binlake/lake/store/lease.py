"""The writer lease of a lake on S3: one Spark writer at a time, across hosts.

delta-spark's default S3 LogStore serializes commits inside one JVM only: two
drivers (two hosts' ingests, an ingest beside OPTIMIZE/VACUUM) committing to one
table can lose a commit. So every writer of an S3 lake first takes the lake's
lease, one small object inside the lake (``_binlake/writer.lease``; Spark and
delta-rs skip ``_`` names), with S3's conditional writes (``lake.s3object``):

* **take**: create it with ``If-None-Match: *``, or replace a ``free`` (released)
  or expired lease with ``If-Match`` on the ETag read. Of several takers at once
  exactly one write succeeds; the others get 412 and read again.
* **renew**: the holder rewrites it every TTL/3 with ``If-Match`` on its own last
  ETag (each version differs: a sequence number), from a thread of its own.
* **expiry, without trusting clocks across hosts**: a waiter takes the lease
  over only after it has seen *the same ETag* for the holder's whole TTL on its
  own monotonic clock. A holder killed with -9 (or cut off) stops renewing, so
  the next writer gets the lease one TTL after its last renewal.
* **release**: rewrite it as ``free`` with ``If-Match`` (S3's conditional
  delete is not everywhere); a release that fails leaves it to expire.

Invariant (why a holder that lost its lease never commits): a waiter's TTL for
an ETag starts after the renewal that wrote it was sent, so the holder's claim
is valid until at least ``sent + TTL`` on its own clock. The holder treats it as
lost from ``sent + SAFETY * TTL`` (or at once when a renewal finds another ETag
there), and every write path calls ``check()`` right before each Delta commit
it starts, so a commit is only started while at least ``(1 - SAFETY) * TTL`` of
the claim remains. When the lease is lost mid-write, ``on_lost`` runs at once
(the lock cancels the session's Spark jobs, so a write still uploading files
never reaches its commit). What no lease can exclude is a commit already in
flight when the holder stalls for longer than that margin (a frozen process):
the TTL (default 60 s) is chosen far above a Delta log commit's duration.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable

from binlake import errors
from binlake.config import S3Settings
from binlake.lake import s3settings
from binlake.lake.store import location, s3object

log = logging.getLogger(__name__)

LEASE_KEY = "_binlake/writer.lease"
# The share of the TTL after its last renewal's send at which a holder stops
# trusting its lease (see the invariant above).
SAFETY = 0.75
FREE = "free"
HELD = "held"


class LeaseLost(errors.FailedPrecondition):
    """The writer lease expired or was taken over while held: nothing more may be committed."""


@dataclasses.dataclass(frozen=True)
class LeaseBody:
    """The lease object's content: who holds it, for how long a silence, its version."""

    state: str
    owner: str
    ttl_s: float
    seq: int
    what: str = ""

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, default_ttl_s: float) -> LeaseBody:
        """The body read; an unreadable one counts as held by nobody known, for the default TTL."""
        try:
            doc = json.loads(data)
            return cls(state=str(doc["state"]), owner=str(doc["owner"]), ttl_s=float(doc["ttl_s"]),
                       seq=int(doc["seq"]), what=str(doc.get("what", "")))
        except (ValueError, KeyError, TypeError):
            return cls(state=HELD, owner="?", ttl_s=default_ttl_s, seq=0)


def lease_where(lake: str) -> tuple[str, str]:
    """(bucket, key) of an S3 lake's lease object; ValueError for a lake not on S3."""
    where = location.parse(lake)
    if not where.is_s3 or not where.bucket:
        raise ValueError(f"lake {lake} is not on S3: its writers take the host's lock file instead")
    return where.bucket, "/".join(p for p in (where.prefix, LEASE_KEY) if p)


class WriterLease:
    """The lake's writer lease, taken by ``acquire`` and held (renewed) until ``release``."""

    def __init__(self, lake: str, *, settings: S3Settings | None = None, ttl_s: float | None = None,
                 what: str = "", on_lost: Callable[[str], None] | None = None) -> None:
        s = settings or s3settings.s3_settings()
        ttl = s.writer_lease_ttl_s if ttl_s is None else ttl_s
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 1 <= ttl <= 3600:
            raise ValueError(f"the writer lease TTL must be 1..3600 seconds, got {ttl!r}")
        bucket, key = lease_where(lake)
        self.lake = lake
        self.ttl_s = float(ttl)
        self.what = what
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.client = s3object.ObjectClient(s, bucket, key, timeout_s=max(1.0, min(10.0, self.ttl_s / 4)))
        self._on_lost = on_lost
        self._state = threading.Lock()
        self._etag: str | None = None
        self._seq = 0
        self._sent_at = 0.0  # monotonic time the last successful take/renewal was sent
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def poll_s(self) -> float:
        """How often a waiter reads the lease again."""
        return max(0.05, min(1.0, self.ttl_s / 20))

    def _body(self, state: str, seq: int) -> bytes:
        return LeaseBody(state, self.owner, self.ttl_s, seq, self.what).encode()

    def acquire(self, progress: Callable[[str], None] | None = None, timeout_s: float | None = None) -> float:
        """Take the lease, waiting while another writer holds it; the seconds waited.
        ``errors.DeadlineExceeded`` after ``timeout_s`` (None: wait as long as it takes)."""
        if self._thread is not None:
            raise RuntimeError("this lease is already held")
        say = progress or (lambda _m: None)
        began = time.monotonic()
        seen: tuple[str | None, float] | None = None  # (ETag, when this waiter first saw it)
        told = ""
        while True:
            ans = self.client.get()
            sent = time.monotonic()
            if ans.status == 404:
                put = self.client.put(self._body(HELD, 1), if_none_match=True)
                if put.status == 200:
                    self._took(put.etag, 1, sent)
                    return time.monotonic() - began
                continue  # another writer created it first: read who
            if not ans.etag:
                raise errors.FailedPrecondition(
                    f"{self.client.where}: the S3 server gave no ETag, which the writer lease needs")
            cur = LeaseBody.decode(ans.body, self.ttl_s)
            expired = (cur.state != FREE and seen is not None and seen[0] == ans.etag
                       and sent - seen[1] >= cur.ttl_s)
            if cur.state == FREE or expired:
                put = self.client.put(self._body(HELD, cur.seq + 1), if_match=ans.etag)
                if put.status == 200:
                    if expired:
                        log.warning("took over the writer lease of %s from %s, silent for %.1fs (its TTL)",
                                    self.lake, cur.owner, sent - (seen[1] if seen else sent))
                        say(f"took over the lake's writer lease from {cur.owner} (not renewed for {cur.ttl_s:g}s)")
                    self._took(put.etag, cur.seq + 1, sent)
                    return time.monotonic() - began
                continue
            if seen is None or seen[0] != ans.etag:
                seen = (ans.etag, sent)
            if told != cur.owner:
                told = cur.owner
                say(f"waiting for the lake's writer lease, held by {cur.owner}" + (f" ({cur.what})" if cur.what else ""))
            if timeout_s is not None and time.monotonic() - began > timeout_s:
                raise errors.DeadlineExceeded(
                    f"the writer lease of {self.lake} is still held by {cur.owner} after {timeout_s:g}s")
            time.sleep(self.poll_s)

    def _took(self, etag: str | None, seq: int, sent: float) -> None:
        if not etag:
            raise errors.FailedPrecondition(f"{self.client.where}: the S3 server gave no ETag for the lease")
        with self._state:
            self._etag, self._seq, self._sent_at, self._lost = etag, seq, sent, None
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="binlake-writer-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        interval = self.ttl_s / 3
        while not self._stop.wait(min(interval, self.poll_s * 4)):
            with self._state:
                if self._lost is not None:
                    return
                due = time.monotonic() - self._sent_at >= interval
                etag, seq = self._etag, self._seq + 1
            if not due:
                continue
            sent = time.monotonic()
            failure = ""
            try:
                put = self.client.put(self._body(HELD, seq), if_match=str(etag))
            except errors.BinlakeError as exc:
                put, failure = None, str(exc)
                log.warning("renewing the writer lease of %s failed: %s", self.lake, exc)
            with self._state:
                if put is not None and put.status == 200 and put.etag:
                    self._etag, self._seq, self._sent_at = put.etag, seq, sent
                    continue
                if put is not None:
                    self._lost = f"another writer took the lease over (renewal answered {put.status})"
                elif time.monotonic() >= self._sent_at + SAFETY * self.ttl_s:
                    self._lost = f"it could not be renewed for {SAFETY * self.ttl_s:g}s: {failure}"
                lost = self._lost
            if lost is not None:
                log.error("lost the writer lease of %s: %s; stopping its writes", self.lake, lost)
                if self._on_lost is not None:
                    with contextlib.suppress(Exception):
                        self._on_lost(lost)
                return

    def check(self) -> None:
        """Raise ``LeaseLost`` unless the lease is held with at least (1 - SAFETY) of its TTL left.
        Called right before each Delta commit a writer starts."""
        with self._state:
            if self._thread is None:
                raise LeaseLost(f"the writer lease of {self.lake} is not held")
            if self._lost is None and time.monotonic() >= self._sent_at + SAFETY * self.ttl_s:
                self._lost = f"it was not renewed for {SAFETY * self.ttl_s:g}s"
            lost = self._lost
        if lost is not None:
            raise LeaseLost(f"lost the writer lease of {self.lake} ({lost}): nothing more is committed; "
                            "rerun to finish (another writer may hold the lake now)")

    def release(self) -> None:
        """Stop renewing and mark the lease free (best effort: else it expires after its TTL)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join()
        with self._state:
            etag, seq, lost = self._etag, self._seq + 1, self._lost
        if lost is not None:
            return  # not ours any more
        try:
            self.client.put(self._body(FREE, seq), if_match=str(etag))
        except errors.BinlakeError as exc:
            log.warning("releasing the writer lease of %s failed (%s): it expires after %gs", self.lake, exc,
                        self.ttl_s)
