"""Leader election among the registries that share an etcd store, as PD's
``pkg/election`` does it.

A member campaigns by granting an etcd lease (3 s) and putting the leader key
with that lease in a create-if-absent transaction; the one whose transaction
succeeds leads. The leader refreshes the lease every lease/3 and counts its own
expiry from the START of each keepalive request: etcd's expiry is counted from
when it received the request, which is later, so the leader's view of its
lease always ends before etcd's does and another member can win.

``is_leader()`` is true only before that local expiry. The registry checks it
before and after every TSO it hands out, and the store fences every write on
the leader key's create revision (``EtcdStore.fence``), so a leader that is
partitioned from etcd stops serving by itself within one lease and cannot
write after it lost the key. See docs/how-to/hosts/registry-etcd.md for the full
no-overlap argument.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable

from binlake import errors
from binlake.registry.etcd import cmp_create_revision, op_put
from binlake.registry.etcd_store import EtcdStore

log = logging.getLogger(__name__)

LEASE_S = 3
# Followers look for a vacant leader key this often; it bounds the failover
# time beyond the lease (PD watches the key; a poll is as good at this rate).
POLL_S = 0.1


class Election:
    """Campaign for, hold and give up the leader key of one registry group."""

    def __init__(self, store: EtcdStore, addr: str, *, lease_s: int = LEASE_S,
                 on_elected: Callable[[], None] | None = None,
                 on_deposed: Callable[[], None] | None = None) -> None:
        if lease_s < 2:
            raise errors.InvalidArgument(f"the leader lease must be >= 2 s (etcd's minimum TTL), got {lease_s}")
        self._store = store
        self._client = store.client
        self._addr = addr
        self._lease_s = lease_s
        self._key = store.key("leader")
        self._value = json.dumps({"addr": addr, "pid": os.getpid()}).encode()
        # Called on the election thread: when this member won (before it counts
        # as serving; an exception resigns) and when it stopped leading.
        self.on_elected: Callable[[], None] = on_elected or (lambda: None)
        self.on_deposed: Callable[[], None] = on_deposed or (lambda: None)
        self._lock = threading.Lock()
        # Monotonic time until which this member may act as leader; 0 = not leading.
        self._expiry = 0.0
        self._leader_addr = ""
        self._lease_id = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.terms = 0  # how many times this member was elected

    @property
    def lease_s(self) -> int:
        return self._lease_s

    # -- what the registry asks -----------------------------------------------------------

    def is_leader(self) -> bool:
        with self._lock:
            return time.monotonic() < self._expiry

    def leader_addr(self) -> str:
        """The current leader's HOST:PORT as last seen ('' when unknown; our own
        address only while our lease is valid)."""
        with self._lock:
            if time.monotonic() < self._expiry:
                return self._addr
            return "" if self._leader_addr == self._addr else self._leader_addr

    def lease_left_s(self) -> float:
        with self._lock:
            return max(0.0, self._expiry - time.monotonic())

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Election:
        self._thread = threading.Thread(target=self._run, name="registry-election", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop campaigning; a leader resigns (revokes its lease) so another member
        takes over at once instead of after the lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._lease_s + 2)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._follow():
                    continue
                self._campaign()
            except errors.BinlakeError as exc:
                log.warning("registry election: %s", exc)
                self._stop.wait(POLL_S * 5)
            except Exception:  # the election thread must not die
                log.exception("registry election failed; retrying")
                self._stop.wait(1.0)

    def _follow(self) -> bool:
        """Read the leader key; True (after a short wait) when someone holds it."""
        kv = self._client.get(self._key)
        if kv is None:
            return False
        try:
            addr = str(json.loads(kv.value).get("addr", ""))
        except ValueError:
            addr = ""
        with self._lock:
            self._leader_addr = addr
        self._stop.wait(POLL_S)
        return True

    def _campaign(self) -> None:
        start = time.monotonic()
        lease_id = self._client.grant(self._lease_s)
        resp = self._client.txn([cmp_create_revision(self._key, 0)], [op_put(self._key, self._value, lease_id)])
        if not resp.succeeded:
            self._revoke(lease_id)
            return
        # The key was created by this transaction: its create revision is the
        # transaction's revision, and it names this term in every fenced write.
        term = int(resp.header.revision)
        self._store.fence(term)
        with self._lock:
            self._expiry = start + self._lease_s
            self._lease_id = lease_id
            self._leader_addr = self._addr
        try:
            self.on_elected()
        except Exception as exc:
            log.warning("registry %s won the election but could not start serving: %s; resigning", self._addr, exc)
            self._step_down(lease_id)
            return
        self.terms += 1
        log.info("registry %s is the leader (term %d, lease %d)", self._addr, term, lease_id)
        self._keep(lease_id, term)
        self._step_down(lease_id)

    def _keep(self, lease_id: int, term: int) -> None:
        """Refresh the lease every lease/3 until it cannot be refreshed in time."""
        interval = self._lease_s / 3
        while not self._stop.wait(interval):
            sent = time.monotonic()
            if sent >= self.expiry_at():
                # Our own count ran out (a pause, a slow keepalive): this term is
                # over even if etcd still holds the lease; never revive it.
                log.warning("registry %s: lease expired locally; stepping down", self._addr)
                return
            try:
                ttl = self._client.keepalive_once(lease_id, timeout_s=interval)
                kv = self._client.get(self._key) if ttl > 0 else None
            except errors.BinlakeError as exc:
                log.warning("registry %s: lease keepalive failed: %s", self._addr, exc)
                ttl, kv = -1, None
            if ttl > 0 and kv is not None and kv.create_revision == term:
                with self._lock:
                    # Counted from the request's start: earlier than etcd's own count.
                    self._expiry = max(self._expiry, sent + ttl)
            elif ttl == 0 or (ttl > 0 and (kv is None or kv.create_revision != term)):
                log.warning("registry %s lost the leader key", self._addr)
                return
            if time.monotonic() >= self.expiry_at():
                log.warning("registry %s: lease expired locally; stepping down", self._addr)
                return

    def expiry_at(self) -> float:
        with self._lock:
            return self._expiry

    def _step_down(self, lease_id: int) -> None:
        with self._lock:
            self._expiry = 0.0
            self._lease_id = 0
            self._leader_addr = ""
        self._store.fence(-1)
        try:
            self.on_deposed()
        finally:
            # Revoking deletes the key at once, so a graceful stop hands over
            # without waiting out the lease; after a partition it may fail.
            self._revoke(lease_id)

    def _revoke(self, lease_id: int) -> None:
        try:
            self._client.revoke(lease_id)
        except errors.BinlakeError as exc:
            log.info("registry %s: could not revoke lease %d: %s", self._addr, lease_id, exc)
