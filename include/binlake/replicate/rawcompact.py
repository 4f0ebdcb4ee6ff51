"""Compaction straight from the lake's image JSON, decoding only what survives.

``compactor.compact`` is the reference: it takes changes whose images are
already typed (``decode.image_values`` on every before and after image) and
keeps one final change per key. Decoding every image is most of the apply's
per-row cost, and most of it is thrown away when keys repeat in a batch, so
the runner compacts here instead:

* every image is parsed once (msgspec's JSON decoder: the same Python values
  as ``json.loads``, about five times faster) and checked against the table
  definition, but not typed;
* the key of an image is its key columns typed (so it compares exactly as the
  reference's ``compactor.key_of`` does on typed images);
* the same DM rules as ``compactor.compact`` pick the final change per key;
* only the final changes' images are typed, with the same conversions as
  ``decode.image_values``.

The result equals ``compactor.compact`` over the fully decoded changes, change
for change (``tests/replicate/test_rawcompact.py`` checks it on random change
sequences with key changes, deletes then re-inserts and keyless tables).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from binlake.lake.decoding.image import _value_of
from binlake.proto import binlog_pb2
from binlake.replicate.compactor import DELETE, INSERT, UPDATE, Change, hashable

# Column types whose JSON value already is the typed value when it has this
# Python type (what ``_value_of`` would return unchanged): the common case is
# then one type check instead of a call.
_SAME: dict[int, type] = {binlog_pb2.INT: int, binlog_pb2.UINT: int, binlog_pb2.STRING: str}
# Untyped decoding (dict, list, str, int, float, bool, None), as json.loads gives.
_json = msgspec.json.Decoder()


class ImageDecoder:
    """Parses and types the images of one upstream table definition, as rows of
    a target table (with the route's extract-table column filled in)."""

    __slots__ = ("info", "columns", "names", "extract", "key", "_key_plan", "_one")

    def __init__(self, info: binlog_pb2.TableInfo, key: Sequence[str],
                 extract: tuple[str, str | None] | None = None) -> None:
        if not isinstance(info, binlog_pb2.TableInfo):
            raise TypeError(f"info must be a TableInfo, got {type(info).__name__}")
        self.info = info
        self.columns: list[tuple[str, int, type | None]] = [(c.name, c.type, _SAME.get(int(c.type)))
                                                          for c in info.columns]
        self.names = frozenset(c.name for c in info.columns)
        self.extract = extract
        types = {name: t for name, t, _same in self.columns}
        if extract is not None:
            types[extract[0]] = binlog_pb2.STRING
        missing = [c for c in key if c not in types]
        if missing:
            raise ValueError(f"key column(s) {', '.join(missing)} not in {info.db}.{info.name}")
        self.key = tuple(key)
        # Per key column: (name, type, the Python type that needs no conversion, whether it is the extract column)
        self._key_plan = tuple((c, types[c], _SAME.get(types[c]), extract is not None and c == extract[0])
                               for c in key)
        # The common case, one plain key column: one dict lookup per image.
        one = self._key_plan[0] if len(key) == 1 else None
        self._one = one if one is not None and not one[3] else None

    def parse(self, image: str | None) -> dict[str, Any] | None:
        """The image's JSON object (values untyped), checked against the definition."""
        if image is None:
            return None
        try:
            doc = _json.decode(image)
        except msgspec.DecodeError as exc:
            raise ValueError(f"not image JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"an image is a JSON object, got {type(doc).__name__}")
        if not doc.keys() <= self.names:
            unknown = sorted(set(doc) - self.names)
            raise ValueError(f"image has column(s) {', '.join(unknown)} that {self.info.db}.{self.info.name} "
                             "does not")
        return doc

    def key_of(self, doc: dict[str, Any]) -> tuple[Any, ...]:
        """The key value of a parsed image, typed and hashable (as ``compactor.key_of``)."""
        one = self._one
        if one is not None:
            v = doc.get(one[0])
            return (v,) if v is None or type(v) is one[2] else (hashable(_value_of(v, one[1])),)
        out = []
        for name, t, same, is_extract in self._key_plan:
            if is_extract:
                out.append(self.extract[1])  # type: ignore[index]
                continue
            v = doc.get(name)
            out.append(v if v is None or type(v) is same else hashable(_value_of(v, t)))
        return tuple(out)

    def typed(self, doc: dict[str, Any] | None) -> dict[str, Any] | None:
        """A parsed image as ``decode.image_values`` gives it (plus the extract column)."""
        if doc is None:
            return None
        out: dict[str, Any] = {}
        get = doc.get
        for name, t, same in self.columns:
            v = get(name)
            out[name] = v if v is None or type(v) is same else _value_of(v, t)
        if self.extract is not None:
            out[self.extract[0]] = self.extract[1]
        return out


# One raw change: op, before JSON, after JSON, commit_ts, seq, the decoder of its images.
RawChange = tuple[str, "str | None", "str | None", int, int, ImageDecoder]


def decode_all(table: str, changes: Sequence[RawChange]) -> list[Change]:
    """Every change decoded, in commit order (no compaction)."""
    return [Change(table, op, dec.typed(dec.parse(b)), dec.typed(dec.parse(a)), ts, seq)
            for op, b, a, ts, seq, dec in changes]


def compact(table: str, changes: Sequence[RawChange], keyed: bool) -> list[Change]:
    """The final change per key of ``changes`` (one target table, commit order), equal
    to ``compactor.compact`` over the decoded changes; every change decoded, in
    commit order, when the table has no key (``keyed`` False)."""
    if not keyed:
        return decode_all(table, changes)
    # key -> [before doc at the batch start, its decoder, last op, last after doc, its decoder, ts, seq]
    state: dict[tuple[Any, ...], list[Any]] = {}

    def touch(k: tuple[Any, ...], before: dict[str, Any] | None, bdec: ImageDecoder, op: str,
              after: dict[str, Any] | None, adec: ImageDecoder, ts: int, seq: int) -> None:
        s = state.get(k)
        if s is None:
            state[k] = [before, bdec, op, after, adec, ts, seq]
        else:
            s[2], s[3], s[4], s[5], s[6] = op, after, adec, ts, seq

    for op, b, a, ts, seq, dec in changes:
        if op == INSERT:
            ad = dec.parse(a)
            assert ad is not None
            touch(dec.key_of(ad), None, dec, INSERT, ad, dec, ts, seq)
        elif op == DELETE:
            bd = dec.parse(b)
            assert bd is not None
            touch(dec.key_of(bd), bd, dec, DELETE, None, dec, ts, seq)
        else:
            bd, ad = dec.parse(b), dec.parse(a)
            assert bd is not None and ad is not None
            kb, ka = dec.key_of(bd), dec.key_of(ad)
            if kb != ka:  # a key change: delete(old) + insert(new), as compactor.split_key_updates
                touch(kb, bd, dec, DELETE, None, dec, ts, seq)
                touch(ka, None, dec, INSERT, ad, dec, ts, seq)
            else:
                touch(ka, bd, dec, UPDATE, ad, dec, ts, seq)
    out: list[Change] = []
    for before, bdec, op, after, adec, ts, seq in state.values():
        if before is None:
            if op != DELETE:
                out.append(Change(table, INSERT, None, adec.typed(after), ts, seq))
            # else: inserted and deleted inside the batch: nothing
        elif op != DELETE:
            out.append(Change(table, UPDATE, bdec.typed(before), adec.typed(after), ts, seq))
        else:
            out.append(Change(table, DELETE, bdec.typed(before), None, ts, seq))
    return out
