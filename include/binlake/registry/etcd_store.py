"""The registry's state in etcd, shared by every member of a registry group.

Layout, every key under one prefix (``/binlake`` unless the URL names another):

- ``<p>/meta/schema_version``, ``<p>/meta/cluster_id``: written once, by the
  transaction that finds the store empty (create-if-absent), never changed;
- ``<p>/meta/tso_limit``: physical ms, never decreases; every TSO any registry
  handed out has physical < it (saved before such a TSO is returned);
- ``<p>/meta/revision``: increases on every node write;
- ``<p>/nodes/<id>``, ``<p>/consumers/<id>``: one JSON record each;
- ``<p>/leader``: the elected registry (see ``binlake.registry.election``).

Every read-modify-write is one etcd transaction that compares the mod revision
of what it read, and retries when another writer got there first. Once a
member is elected, ``fence`` makes every write also compare that the leader key
is still the one this member created: a deposed leader cannot write anything,
not the TSO mark nor a node record.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import threading
from typing import Any

from binlake import errors
from binlake.registry.etcd import (
    EtcdClient,
    EtcdTarget,
    cmp_create_revision,
    cmp_mod_revision,
    op_delete,
    op_put,
)
from binlake.registry.model import ConsumerRecord, NodeRecord, NodeState, ReplicationSetting
from binlake.registry.store import SCHEMA_VERSION, RegistryStore

# Conflicting writers retry this often before giving up (each retry means
# someone else committed, so this is only reached under a storm of writers).
_MAX_CAS_ATTEMPTS = 64


class EtcdStore(RegistryStore):
    """``RegistryStore`` over an etcd cluster. Thread-safe."""

    def __init__(self, target: EtcdTarget, *, timeout_s: float = 5.0, expect_cluster_id: int = 0) -> None:
        self._target = target
        self._prefix = target.prefix.rstrip("/").encode()
        self._client = EtcdClient(target.endpoints, timeout_s=timeout_s)
        # (leader key's create revision, leader name) while this member leads; see fence().
        self._fence_lock = threading.Lock()
        self._fence: int = 0
        try:
            self._cluster_id = self._init_meta()
            if expect_cluster_id and expect_cluster_id != self._cluster_id:
                raise errors.FailedPrecondition(
                    f"etcd store {target.url()} holds cluster {self._cluster_id}, not {expect_cluster_id}: "
                    "point --store at this cluster's etcd and prefix, or drop --cluster-id"
                )
        except BaseException:
            self._client.close()
            raise

    # -- keys ---------------------------------------------------------------------------

    def key(self, *parts: str) -> bytes:
        return b"/".join([self._prefix, *(p.encode() for p in parts)])

    @property
    def client(self) -> EtcdClient:
        return self._client

    @property
    def target(self) -> EtcdTarget:
        return self._target

    def _init_meta(self) -> int:
        # One transaction creates every meta key if the store is new, so a crash
        # cannot leave a store with a cluster id but no TSO mark.
        cid_key = self.key("meta", "cluster_id")
        cluster_id = secrets.randbelow((1 << 63) - 1) + 1
        self._client.txn(
            [cmp_create_revision(cid_key, 0)],
            [
                op_put(self.key("meta", "schema_version"), str(SCHEMA_VERSION).encode()),
                op_put(cid_key, str(cluster_id).encode()),
                op_put(self.key("meta", "tso_limit"), b"0"),
                op_put(self.key("meta", "revision"), b"0"),
            ],
        )
        version = self._int(self.key("meta", "schema_version"))
        if version != SCHEMA_VERSION:
            raise errors.FailedPrecondition(
                f"etcd store {self._target.url()} has schema version {version}; this binlake reads {SCHEMA_VERSION}"
            )
        return self._int(cid_key)

    def _int(self, key: bytes) -> int:
        kv = self._client.get(key)
        if kv is None:
            raise errors.FailedPrecondition(f"etcd store {self._target.url()} lacks {key.decode()}")
        return int(kv.value)

    # -- leadership fencing --------------------------------------------------------------------

    def fence(self, leader_create_revision: int) -> None:
        """From now on every write also requires that the leader key exists with
        this create revision (0 lifts the fence: writes are unconditional)."""
        with self._fence_lock:
            self._fence = leader_create_revision

    def _guard(self) -> list[Any]:
        with self._fence_lock:
            fence = self._fence
        return [cmp_create_revision(self.key("leader"), fence)] if fence else []

    def _commit(self, compare: list[Any], success: list[Any], what: str) -> bool:
        """Run a guarded transaction; False when ``compare`` failed (retry), NotLeader
        when the fence failed."""
        guard = self._guard()
        resp = self._client.txn(compare + guard, success)
        if resp.succeeded:
            return True
        if guard:
            leader = self._client.get(self.key("leader"))
            if leader is None or leader.create_revision != guard[0].create_revision:
                with self._fence_lock:
                    self._fence = -1  # stays failed until the election fences again
                raise errors.NotLeader(f"this registry is no longer the leader; {what} was not written")
        return False

    # -- RegistryStore --------------------------------------------------------------------------

    def describe(self) -> str:
        return self._target.url()

    def cluster_id(self) -> int:
        return self._cluster_id

    def load_tso_limit(self) -> int:
        return self._int(self.key("meta", "tso_limit"))

    def save_tso_limit(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise errors.InvalidArgument(f"a TSO limit is a non-negative integer, got {limit!r}")
        key = self.key("meta", "tso_limit")
        for _ in range(_MAX_CAS_ATTEMPTS):
            kv = self._client.get(key)
            current = int(kv.value) if kv is not None else 0
            # The stored mark never decreases, even if a caller hands us an older one;
            # but a fenced caller still checks it leads (a deposed leader learns it here).
            new = max(current, limit)
            compare = [cmp_mod_revision(key, kv.mod_revision if kv is not None else 0)]
            if self._commit(compare, [op_put(key, str(new).encode())], "the TSO mark"):
                return
        raise errors.Unavailable("etcd store: too many concurrent writers of the TSO mark")

    def get_node(self, node_id: str) -> NodeRecord | None:
        kv = self._client.get(self.key("nodes", node_id))
        return _node(kv.value) if kv is not None else None

    def put_node(self, record: NodeRecord) -> None:
        values = dataclasses.asdict(record)
        values["state"] = NodeState(record.state).value
        body = json.dumps(values, sort_keys=True).encode()
        rev_key = self.key("meta", "revision")
        for _ in range(_MAX_CAS_ATTEMPTS):
            kv = self._client.get(rev_key)
            rev = int(kv.value) if kv is not None else 0
            compare = [cmp_mod_revision(rev_key, kv.mod_revision if kv is not None else 0)]
            if self._commit(compare, [op_put(self.key("nodes", record.node_id), body),
                                      op_put(rev_key, str(rev + 1).encode())], f"node {record.node_id}"):
                return
        raise errors.Unavailable("etcd store: too many concurrent node writers")

    def list_nodes(self, kind: str | None = None) -> list[NodeRecord]:
        nodes = [_node(kv.value) for kv in self._client.get_prefix(self.key("nodes", ""))]
        return [n for n in nodes if not kind or n.kind == kind]

    def revision(self) -> int:
        return self._int(self.key("meta", "revision"))

    def get_consumer(self, consumer_id: str) -> ConsumerRecord | None:
        kv = self._client.get(self.key("consumers", consumer_id))
        return ConsumerRecord(**json.loads(kv.value)) if kv is not None else None

    def put_consumer(self, record: ConsumerRecord) -> None:
        body = json.dumps(dataclasses.asdict(record), sort_keys=True).encode()
        # A whole-record put: the service holds its lock across the read and this write.
        if not self._commit([], [op_put(self.key("consumers", record.consumer_id), body)],
                            f"consumer {record.consumer_id}"):
            raise errors.Unavailable(f"etcd store: consumer {record.consumer_id} was not written")

    def delete_consumer(self, consumer_id: str) -> bool:
        key = self.key("consumers", consumer_id)
        kv = self._client.get(key)
        if kv is None:
            return False
        return self._commit([cmp_mod_revision(key, kv.mod_revision)], [op_delete(key)], f"consumer {consumer_id}")

    def list_consumers(self) -> list[ConsumerRecord]:
        return [ConsumerRecord(**json.loads(kv.value)) for kv in self._client.get_prefix(self.key("consumers", ""))]

    def list_replication(self) -> list[ReplicationSetting]:
        rows = [ReplicationSetting(**json.loads(kv.value)) for kv in self._client.get_prefix(self.key("replication", ""))]
        return sorted(rows, key=lambda r: r.from_ts)

    def add_replication(self, setting: ReplicationSetting) -> None:
        # Keyed by the zero-padded from_ts: the prefix lists in order, and an append never overwrites.
        key = self.key("replication", f"{setting.from_ts:020d}")
        body = json.dumps(dataclasses.asdict(setting), sort_keys=True).encode()
        if not self._commit([cmp_mod_revision(key, 0)], [op_put(key, body)], f"replication from {setting.from_ts}"):
            raise errors.Unavailable(f"etcd store: a replication setting from {setting.from_ts} already exists")

    def close(self) -> None:
        self._client.close()


def _node(body: bytes) -> NodeRecord:
    fields = json.loads(body)
    fields["state"] = NodeState(str(fields["state"]))
    return NodeRecord(**fields)
