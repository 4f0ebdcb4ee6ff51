"""Compaction: one final change per key within a batch, by DM's rules.

A batch's changes of one table, in commit order, become at most one change per
primary-key value that takes the key's row from its state before the batch to
its state after it:

* an update that changes the key is first split into delete(old) + insert(new);
* insert + update -> insert of the final image;
* update + update -> update (first before image, last after image);
* insert + delete -> nothing;
* update + delete -> delete with the original before image;
* delete + insert -> update from the deleted row to the new row.

Put generally: a key that existed before the batch (its first change has a
before image) and exists after it is an update, one that only existed before
is a delete, one that only exists after is an insert, and one that did neither
leaves nothing. A table without a primary key (or NOT NULL unique key) has no
key to compact on: its changes stay as they are, in commit order.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

INSERT, UPDATE, DELETE = "insert", "update", "delete"


@dataclasses.dataclass(slots=True)
class Change:
    """One row change of a (target) table; images are column -> JSON value."""

    table: str
    op: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    commit_ts: int = 0
    seq: int = 0

    def __post_init__(self) -> None:
        if self.op not in (INSERT, UPDATE, DELETE):
            raise ValueError(f"op must be insert, update or delete, got {self.op!r}")
        if (self.before is None) != (self.op == INSERT) or (self.after is None) != (self.op == DELETE):
            raise ValueError(f"a {self.op} has {'no ' if self.op == INSERT else 'a '}before image and "
                             f"{'no ' if self.op == DELETE else 'an '}after image")


def hashable(value: Any) -> Any:
    """A value usable in a dict key (objects such as {"$base64": ...} as canonical text)."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return value


def key_of(image: Mapping[str, Any], key: Sequence[str]) -> tuple[Any, ...]:
    return tuple(hashable(image.get(c)) for c in key)


def split_key_updates(changes: Sequence[Change], key: Sequence[str]) -> list[Change]:
    """Updates that change the key as delete(old) + insert(new)."""
    out: list[Change] = []
    for c in changes:
        if c.op == UPDATE and c.before is not None and c.after is not None and \
                key_of(c.before, key) != key_of(c.after, key):
            out.append(Change(c.table, DELETE, c.before, None, c.commit_ts, c.seq))
            out.append(Change(c.table, INSERT, None, c.after, c.commit_ts, c.seq))
        else:
            out.append(c)
    return out


def compact(changes: Sequence[Change], key: Sequence[str] | None) -> list[Change]:
    """The final change per key value of ``changes`` (one table, commit order), in
    the order each key was first touched; unchanged when ``key`` is empty/None."""
    if not key:
        return list(changes)
    # key value -> (before image at the batch start or None, latest change)
    state: dict[tuple[Any, ...], tuple[dict[str, Any] | None, Change]] = {}
    for c in split_key_updates(changes, key):
        image = c.after if c.after is not None else c.before
        assert image is not None
        k = key_of(image, key)
        prev = state.get(k)
        first_before = c.before if prev is None else prev[0]
        state[k] = (first_before, c)
    out: list[Change] = []
    for first_before, last in state.values():
        exists_after = last.op != DELETE
        if first_before is None and not exists_after:
            continue  # inserted and deleted inside the batch
        if first_before is None:
            out.append(Change(last.table, INSERT, None, last.after, last.commit_ts, last.seq))
        elif exists_after:
            out.append(Change(last.table, UPDATE, first_before, last.after, last.commit_ts, last.seq))
        else:
            out.append(Change(last.table, DELETE, first_before, None, last.commit_ts, last.seq))
    return out
