"""The native pgoutput tuple decoder (``source.postgres._pgoutc``) against the
Python path, on generated tuples.

The contract (stated in ``_pgoutc.c``): whenever the decoder answers, its bytes
are what the Python path (``_Reader.tuple_data``, ``values.decode_row``,
``codec.encode_row``/``encode_update``) builds from the same tuple, and it
ends where the Python reader ends; where the Python path raises (a NULL in a
NOT NULL column, an unchanged TOAST value, a value it cannot carry), the
decoder declines. Hypothesis builds tables of every type the decoder covers,
with values as PostgreSQL prints them and, mixed in, texts it never prints
(infinities, BC dates, hour 24, exponents, bytes that are not UTF-8). No
server needed: the end-to-end equality on a real PostgreSQL is
``test_postgres_source``'s, run natively and with ``BINLAKE_NATIVE_PGOUTPUT=0``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from binlake import codec, errors
from binlake.source.postgres import pgplan, values
from binlake.source.postgres.source import _Reader
from binlake.source.tables import assign_ids

pytestmark = pytest.mark.skipif(not pgplan.available(), reason=f"_pgoutc not built: {pgplan.import_error()}")

_TZ = ["+00", "+05:30", "-08", "+14", "-03:30"]


def _frac(t: dt.datetime | dt.time) -> str:
    return f".{t.microsecond:06d}".rstrip("0") if t.microsecond else ""


# Canonical texts (as PostgreSQL's output functions print them, session as values.SESSION_OPTIONS).
CANON: dict[int, st.SearchStrategy[str]] = {
    20: st.integers(-(1 << 63), (1 << 63) - 1).map(str),
    21: st.integers(-(1 << 15), (1 << 15) - 1).map(str),
    23: st.integers(-(1 << 31), (1 << 31) - 1).map(str),
    26: st.integers(0, (1 << 32) - 1).map(str),
    16: st.sampled_from(["t", "f"]),
    701: st.floats(allow_nan=False, allow_infinity=False).map(repr),
    700: st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda f: f"{f:.9g}"),
    1700: st.tuples(st.integers(-(10**20), 10**20), st.integers(0, 12)).map(
        lambda p: format(decimal.Decimal(p[0]).scaleb(-p[1]), "f")),
    25: st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\0"), max_size=20),
    1043: st.text(max_size=5, alphabet="ab é"),
    17: st.binary(max_size=12).map(lambda b: "\\x" + b.hex()),
    1082: st.dates().map(lambda d: d.isoformat()),
    1114: st.datetimes().map(lambda t: t.strftime("%Y-%m-%d %H:%M:%S").rjust(19, "0") + _frac(t)),
    1184: st.tuples(st.datetimes(dt.datetime(2, 1, 1), dt.datetime(9998, 12, 31)), st.sampled_from(_TZ)).map(
        lambda p: p[0].strftime("%Y-%m-%d %H:%M:%S").rjust(19, "0") + _frac(p[0]) + p[1]),
    1083: st.times().map(lambda t: t.strftime("%H:%M:%S") + _frac(t)),
}
# Texts PostgreSQL never prints for the type, or prints for values binlake cannot carry.
ODD = st.one_of(
    st.sampled_from(["Infinity", "-Infinity", "NaN", "infinity", "24:00:00", "0044-03-15 BC", "+5", " 5",
                     "1e5", "0.0000001", "-0.00000000", "00012", ".5", "", "\\x0g", "\\x123", "12345-01-01",
                     "2020-02-30", "2020-01-01 00:00:00.1234567", "2020-01-01 00:00:00+0530", "0001-01-01 00:00:00+05",
                     "9999-12-31 23:00:00-05", "99999999999999999999", "-9223372036854775809", "t ", "1.5.5"]),
    st.text(max_size=8),
)


@st.composite
def tables_and_tuples(draw: Any) -> tuple[Any, list[int], Any, list[tuple[bytes, str | None]], bool]:
    oids = draw(st.lists(st.sampled_from(sorted(CANON)), min_size=1, max_size=8))
    attrs = [values.Attr(f"c{i}", oid, -1) for i, oid in enumerate(oids)]
    cols = values.columns("public", "t", attrs)
    t = values.table("public", "t", cols, ["c0"])
    for c in t.columns[1:]:
        c.nullable = draw(st.booleans())
    assign_ids(t, None, 100, 1)
    odd = draw(st.integers(0, 4)) == 0

    def one_tuple() -> list[tuple[bytes, str | None]]:
        out: list[tuple[bytes, str | None]] = []
        for oid in oids:
            r = draw(st.integers(0, 19))
            if r == 0:
                out.append((b"n", None))
            elif r == 1 and odd:
                out.append((b"u", None))
            else:
                text = draw(ODD if odd and r < 5 else CANON[oid])
                out.append((b"t", text))
        return out

    tuples = [one_tuple(), one_tuple()]
    return t, oids, t.to_info(), tuples, odd


def _tuple_bytes(cols: list[tuple[bytes, str | None]], last_raw: bytes | None = None) -> bytes:
    """A pgoutput TupleData; ``last_raw``: the last column's bytes as given (not text)."""
    out = struct.pack(">h", len(cols))
    for i, (kind, text) in enumerate(cols):
        out += kind
        if kind == b"t":
            data = last_raw if last_raw is not None and i == len(cols) - 1 else (text or "").encode()
            out += struct.pack(">i", len(data)) + data
    return out


def _python(t: Any, oids: list[int], info: Any, data: bytes, at: int, update: bool) -> tuple[bytes, int] | None:
    """The Python path over the same bytes: (serialized Row/UpdatedRow, end) or None if it raises."""
    r = _Reader(data)
    r.i = at
    try:
        old = values.decode_row(t, oids, r.tuple_data())
        if update:
            r.byte()
            new = values.decode_row(t, oids, r.tuple_data())
            return codec.encode_update(old, new, info), r.i
        return codec.encode_row(old, info), r.i
    except (ValueError, TypeError, errors.BinlakeError):
        return None  # what the source reports as one line (values.convert, codec)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables_and_tuples(), st.binary(max_size=3), st.booleans(), st.binary(min_size=1, max_size=4))
def test_native_tuples_equal_the_python_path_or_decline(case: Any, prefix: bytes, update: bool,
                                                        bad_utf8: bytes) -> None:
    t, oids, info, (first, second), odd = case
    # Odd cases: sometimes the last column's bytes are no UTF-8 text at all.
    raw = b"\xff" + bad_utf8 if odd and first[-1][0] == b"t" else None
    body = _tuple_bytes(first, raw)
    if update:
        body += b"N" + _tuple_bytes(second)
    data = prefix + body + b"\x00tail"
    plan = pgplan.build_plan(t, oids, info)
    assert plan is not None
    got = plan.update(data, len(prefix)) if update else plan.row(data, len(prefix))
    want = _python(t, oids, info, data, len(prefix), update)
    if got is not None:
        assert want is not None, "the decoder answered where the Python path refuses"
        assert got == want
    elif not odd:
        # Canonical values: the decoder declines only what Python would print differently
        # (DECIMALs in exponent form) or refuses (a NULL in a NOT NULL column).
        assert want is None or any(o == 1700 for o in oids), "the decoder declined a canonical tuple"


def test_every_covered_type_decodes_natively_and_json_takes_the_python_path() -> None:
    oids = sorted(CANON)
    attrs = [values.Attr(f"c{i}", oid, -1) for i, oid in enumerate(oids)]
    t = values.table("public", "t", values.columns("public", "t", attrs), ["c0"])
    assign_ids(t, None, 100, 1)
    info = t.to_info()
    texts = {20: "-9223372036854775808", 21: "-5", 23: "7", 26: "4294967295", 16: "t", 701: "-1.5e-300",
             700: "3.4028235e+38", 1700: "-12.3400", 25: "héllo ☃", 1043: "x", 17: "\\x00ff10",
             1082: "0044-03-15", 1114: "2024-02-29 23:59:59.5", 1184: "2024-01-01 00:30:00.25+05:30",
             1083: "00:00:00.000001"}
    tup = [(b"t", texts[o]) for o in oids]
    data = b"I" + _tuple_bytes(tup)
    plan = pgplan.build_plan(t, oids, info)
    assert plan is not None and plan.columns() == len(oids)
    got = plan.row(data, 1)
    assert got is not None and got == _python(t, oids, info, data, 1, False)
    json_t = values.table("public", "j", values.columns("public", "j", [values.Attr("a", 23, -1),
                                                                        values.Attr("b", 3802, -1)]), ["a"])
    assign_ids(json_t, None, 101, 1)
    assert pgplan.build_plan(json_t, [23, 3802], json_t.to_info()) is None


# ---------------------------------------------------------------------------- COPY lines (the initial snapshot)

def _copy_field(text: str | None) -> bytes:
    """A value as ``COPY ... TO STDOUT`` writes it in text format: \\N for NULL, and
    backslash, tab, newline, carriage return and the other control escapes escaped."""
    if text is None:
        return b"\\N"
    out = text.encode()
    for raw, esc in ((b"\\", b"\\\\"), (b"\t", b"\\t"), (b"\n", b"\\n"), (b"\r", b"\\r"), (b"\b", b"\\b"),
                     (b"\f", b"\\f"), (b"\v", b"\\v")):
        out = out.replace(raw, esc)
    return out


def _copy_python(t: Any, oids: list[int], info: Any, chunk: bytes) -> list[bytes] | None:
    """The snapshot's Python path for the same lines, or None where it raises."""
    from binlake.source.postgres import snapshot as snap

    try:
        return [codec.encode_row(values.decode_row(t, oids, r), info) for r in snap.copy_line_texts(chunk)]
    except (ValueError, TypeError, errors.BinlakeError):
        return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables_and_tuples(), st.sampled_from(["", "\\", "\\\\x41", "\\101", "\\q"]))
def test_copy_lines_encode_as_the_python_path_or_decline(case: Any, escape: str) -> None:
    """``Plan.copy_rows`` over COPY lines: the Python path's rows for the same lines
    (``copy_line_texts``, then the stream's ``decode_row``), or None where it refuses."""
    t, oids, info, tuples, odd = case
    lines = []
    for tup in tuples:
        fields = [_copy_field(None if kind == b"n" else text) for kind, text in tup if kind != b"u"]
        if len(fields) != len(tup):
            continue  # pgoutput's unchanged TOAST marker has no COPY form
        lines.append(b"\t".join(fields) + b"\n")
    if not lines:
        return
    chunk = b"".join(lines)
    if odd and escape and oids[-1] in (25, 1043):
        # An escape COPY TO never writes but COPY FROM reads (octal, hex, an escaped
        # ordinary character): both readers take it the same way.
        chunk = chunk[:-1] + escape.encode() + b"\n"
    plan = pgplan.build_plan(t, oids, info)
    assert plan is not None
    got = plan.copy_rows(chunk)
    want = _copy_python(t, oids, info, chunk)
    if got is not None:
        assert want is not None, "the decoder answered where the Python path refuses"
        assert got == want
    elif not odd:
        assert want is None or any(o == 1700 for o in oids), "the decoder declined canonical lines"
    # A chunk cut inside a line (its last line without the newline; a chunk whose last
    # line is empty would lose a whole line), or a line with a field too many or too few: declined.
    assert plan.copy_rows(chunk + b"1") is None
    assert plan.copy_rows(b"\t".join([b"1"] * (len(oids) + 1)) + b"\n") is None
    if len(oids) > 1:
        assert plan.copy_rows(b"1\n") is None
