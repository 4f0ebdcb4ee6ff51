"""Checksums of restored Spark frames, computed in the executors.

A frame's checksum is ``binlake.sql.checksum``'s portable one: each row rendered
as the same canonical text ``checksum.portable_row_text`` gives for the row read
from a database (built here from Spark SQL functions, type by type), hashed with
MD5 (its first 8 bytes), and the hashes combined order-independently (their sum
mod 2^64 and their XOR). Each executor aggregates its partitions; the driver
receives one row per table. The 64-bit sum is kept as two sums of 32-bit halves
(no overflow below 2^31 rows), combined in the driver.

``first_difference`` finds, only when two checksums differ, the smallest key
whose row is on one side only or differs: a left-anti join both ways on
(key, row hash), then a top-1 by key (bounded: Spark keeps one row per task).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from binlake.proto import binlog_pb2
from binlake.restore import columns as C
from binlake.sql import checksum

_MASK = (1 << 64) - 1


def _value_text(F: Any, col: C.Column) -> Any:
    """The portable canonical text of one column, as ``checksum.portable_text`` gives
    it for the value a database hands back for that column."""
    c = F.col(f"`{col.name}`")
    if col.type == binlog_pb2.BOOL:
        return F.when(c.isNull(), F.lit(None)).when(c, F.lit("1")).otherwise(F.lit("0"))
    if col.type == binlog_pb2.FLOAT:
        # The IEEE 754 bits (as Python's struct gives them): no float-to-text rules to match.
        return F.when(c.isNull(), F.lit(None)).otherwise(
            F.expr(f"reflect('java.lang.Double', 'doubleToLongBits', cast(`{col.name}` as double))"))
    if col.type == binlog_pb2.BYTES:
        return F.lower(F.hex(c))
    if col.type == binlog_pb2.DATETIME:
        return F.date_format(c, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS")
    if col.type in (binlog_pb2.DECIMAL, binlog_pb2.UINT):
        # Python's Decimal.normalize(): no trailing zeros after the point, zero is "0".
        # Trims, not regular expressions: this runs for every value of every proof.
        text = c.cast("string")
        stripped = F.rtrim(F.rtrim(text, F.lit("0")), F.lit("."))
        plain = F.when(text.contains("."), stripped).otherwise(text)
        return F.when(F.regexp_like(plain, F.lit(r"^-?0$")), F.lit("0")).otherwise(plain)
    if col.type == binlog_pb2.JSON:
        # A JSON null document reads back from a database as None, as SQL NULL does.
        return F.when(c == F.lit("null"), F.lit(None)).otherwise(c)
    return c.cast("string")


def row_text(F: Any, info: binlog_pb2.TableInfo, cols: Sequence[C.Column] | None = None) -> Any:
    """The portable row text of a frame with ``info``'s columns (``cols``: those columns)."""
    chosen = list(cols) if cols is not None else C.columns_of(info)
    parts = []
    for col in sorted(chosen, key=lambda c: c.name):
        t = _value_text(F, col)
        framed = F.concat(F.lit("V"), F.octet_length(t).cast("string"), F.lit(":"), t)
        parts.append(F.lit(checksum.name_frame(col.name)))
        parts.append(F.coalesce(framed, F.lit("N")))
    return F.concat(*parts) if parts else F.lit("")


def _halves(F: Any, md5_hex: str) -> tuple[Any, Any]:
    """The 32-bit halves (as longs) of the 64-bit row hash: the first 8 bytes of the MD5
    hex column ``md5_hex``."""
    return (F.conv(F.substring(md5_hex, 1, 8), 16, 10).cast("long"),
            F.conv(F.substring(md5_hex, 9, 8), 16, 10).cast("long"))


def hashed(df: Any, info: binlog_pb2.TableInfo) -> Any:
    """``df`` as (``_b`` the row text's bytes, ``_m`` its MD5 hex, ``_hi``/``_lo`` the
    hash's 32-bit halves, and the key columns)."""
    from pyspark.sql import functions as F

    text = row_text(F, info)
    keys = [F.col(f"`{c}`") for c in C.key_names(info)]
    hi, lo = _halves(F, "_m")
    return (df.select(text.alias("_t"), *keys)
            .select(F.octet_length("_t").cast("long").alias("_b"), F.md5(F.col("_t")).alias("_m"), *keys)
            .select("_b", "_m", hi.alias("_hi"), lo.alias("_lo"), *keys))


def key_text(values: Sequence[Any], info: binlog_pb2.TableInfo) -> str:
    """A key's values (in ``columns.key_names`` order, as Spark gives them) as the JSON
    list of their portable texts, the form ``checksum.portable_rows`` gives."""
    by_name = {c.name: c for c in C.columns_of(info)}
    out = []
    for name, value in zip(C.key_names(info), values, strict=True):
        col = by_name[name]
        out.append(checksum.portable_text(C.python_value(value, col.type), col.type == binlog_pb2.JSON))
    return json.dumps(out)


def first_difference(a: Any, b: Any, info: binlog_pb2.TableInfo) -> tuple[str, str] | None:
    """The smallest key whose row differs between frames ``a`` and ``b`` (or is in one
    only), as (key text, which side: "only in first" / "only in second" / "differs");
    None when they hold the same rows. Run only after their checksums differed."""
    keys = C.key_names(info) or ["_m"]  # a table without a key: rows told apart by their hash
    cols = list(dict.fromkeys(["_m", *keys]))
    from pyspark import StorageLevel

    # Each side takes part in both anti-joins: kept (on disk, only the keys and hashes)
    # so neither table is rebuilt twice.
    ha = hashed(a, info).select(*[f"`{k}`" for k in cols]).persist(StorageLevel.DISK_ONLY)
    hb = hashed(b, info).select(*[f"`{k}`" for k in cols]).persist(StorageLevel.DISK_ONLY)
    on = cols
    try:
        left = ha.join(hb, on=on, how="left_anti").orderBy(*[f"`{k}`" for k in keys]).limit(1).collect()
        right = hb.join(ha, on=on, how="left_anti").orderBy(*[f"`{k}`" for k in keys]).limit(1).collect()
    finally:
        ha.unpersist()
        hb.unpersist()
    found = [(tuple(r[k] for k in keys), "only in first") for r in left] + \
            [(tuple(r[k] for k in keys), "only in second") for r in right]
    if not found:
        return None
    def text(values: tuple[Any, ...]) -> str:
        return json.dumps(list(values)) if keys == ["_m"] else key_text(values, info)

    if len(found) == 2 and found[0][0] == found[1][0]:
        return text(found[0][0]), "differs"
    first = min(found, key=lambda f: text(f[0]))
    return text(first[0]), first[1]


def signed_parts(name: str, df: Any, info: binlog_pb2.TableInfo, sign: Any = None) -> Any:
    """``df``'s rows as the terms of checksum ``name``: (``_k`` name, ``_s`` the row's sign,
    ``_hi``/``_lo`` its hash's halves, ``_b`` its signed bytes). ``sign`` (a column of +1/-1,
    default +1): a row counted -1 takes away what the same row counted +1 adds, so a sum of
    terms is a checksum of what remains (``totals``)."""
    from pyspark.sql import functions as F

    staged = df.select(row_text(F, info).alias("_t"), (F.lit(1) if sign is None else sign).cast("long").alias("_s"))
    staged = staged.select("_s", F.octet_length("_t").cast("long").alias("_n"), F.md5(F.col("_t")).alias("_m"))
    hi, lo = _halves(F, "_m")
    return staged.select(F.lit(name).alias("_k"), "_s", hi.alias("_hi"), lo.alias("_lo"),
                         (F.col("_n") * F.col("_s")).alias("_b"))


def hash_parts(name: Any, h: Any, frame: Any) -> Any:
    """Terms of the checksum named by the column ``name`` whose hash is the 64-bit column
    ``h`` of ``frame`` (each +1, no bytes): a digest of rows that need no portable rendering
    (``totals`` combines it)."""
    from pyspark.sql import functions as F

    return frame.select(name.alias("_k"), F.lit(1).cast("long").alias("_s"),
                        F.shiftrightunsigned(h, 32).alias("_hi"), (h.bitwiseAND(F.lit(0xFFFFFFFF))).alias("_lo"),
                        F.lit(0).cast("long").alias("_b"))


def totals(parts: Sequence[Any]) -> dict[str, tuple[int, str, int]]:
    """{name: (rows, checksum, bytes)} of ``signed_parts``/``hash_parts`` frames, in one Spark
    job: rows and bytes are the sums of the signs and signed bytes, the checksum the signed
    sum of the hashes mod 2^64 and their XOR (a row added then taken away cancels in both).
    A name with no term is absent."""
    from functools import reduce

    from pyspark.sql import functions as F

    if not parts:
        return {}
    rows = reduce(lambda a, b: a.unionAll(b), parts).groupBy("_k").agg(
        F.sum("_s").alias("n"), F.sum(F.col("_hi") * F.col("_s")).alias("shi"),
        F.sum(F.col("_lo") * F.col("_s")).alias("slo"), F.bit_xor("_hi").alias("xhi"), F.bit_xor("_lo").alias("xlo"),
        F.sum("_b").alias("b")).collect()
    out = {}
    for r in rows:
        total = ((int(r["shi"]) << 32) + int(r["slo"])) & _MASK
        xor = ((int(r["xhi"]) & 0xFFFFFFFF) << 32) | (int(r["xlo"]) & 0xFFFFFFFF)
        out[str(r["_k"])] = (int(r["n"]), f"{total:016x}{xor:016x}", int(r["b"]))
    return out


EMPTY = (0, f"{0:016x}{0:016x}", 0)


def combine(a: tuple[int, str, int], b: tuple[int, str, int]) -> tuple[int, str, int]:
    """The checksum of two disjoint sets of signed terms (``totals``' form): rows and bytes
    added, sums added mod 2^64, XORs combined."""
    sa, xa = int(a[1][:16], 16), int(a[1][16:], 16)
    sb, xb = int(b[1][:16], 16), int(b[1][16:], 16)
    return a[0] + b[0], f"{(sa + sb) & _MASK:016x}{xa ^ xb:016x}", a[2] + b[2]


def frames_checksums(items: Sequence[tuple[str, Any, binlog_pb2.TableInfo]]) -> dict[str, tuple[int, str, int]]:
    """The checksums of several typed frames in one Spark job: {name: (rows, checksum as
    ``checksum.checksum(..., portable=True)`` gives it, bytes of the row texts)} for each
    (name, frame, info); a frame with no row is (0, the empty checksum, 0)."""
    found = totals([signed_parts(name, df, info) for name, df, info in items])
    return {name: found.get(name, EMPTY) for name, _df, _i in items}
