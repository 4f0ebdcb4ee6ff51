"""Causality: split a batch of row changes into groups that can be applied
independently (concurrently) without changing the outcome.

Two changes conflict when they touch the same key value of the same table:
the primary key, or one unique key (all its columns non-NULL), in the before
or the after image. Equal values on *different* unique keys do not conflict,
and a unique key with a NULL never does (NULLs are distinct to a unique
index). Conflicts are transitive: a group is a connected component of the
conflict graph, and keeps its changes in commit order. Every change of a table
without a primary key lands in one group per table (nothing identifies its
rows). Groups are numbered by their first change, so the same batch always
gives the same groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from binlake.replicate.compactor import Change, key_of


@dataclasses.dataclass(frozen=True)
class TableKeys:
    """A table's primary key and unique keys (column names)."""

    primary: tuple[str, ...]
    unique: tuple[tuple[str, tuple[str, ...]], ...] = ()


def _tokens(c: Change, keys: TableKeys | None) -> Iterator[tuple[Any, ...]]:
    if keys is None or not keys.primary:
        yield ("table", c.table)
        return
    for image in (c.before, c.after):
        if image is None:
            continue
        yield ("pk", c.table, key_of(image, keys.primary))
        for name, cols in keys.unique:
            value = key_of(image, cols)
            if all(v is not None for v in value):
                yield ("uk", c.table, name, value)


def group(changes: Sequence[Change], keys: Mapping[str, TableKeys]) -> list[list[Change]]:
    """The conflict groups of ``changes`` (commit order kept inside each group),
    ordered by their first change. ``keys``: table name -> its keys."""
    parent = list(range(len(changes)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[tuple[Any, ...], int] = {}
    for i, c in enumerate(changes):
        for tok in _tokens(c, keys.get(c.table)):
            j = owner.setdefault(tok, i)
            if j != i:
                a, b = find(i), find(j)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[int, list[Change]] = {}
    for i, c in enumerate(changes):
        groups.setdefault(find(i), []).append(c)
    return [groups[r] for r in sorted(groups)]
