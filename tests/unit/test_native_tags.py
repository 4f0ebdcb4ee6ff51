"""The protobuf tags the hand-written encoders and decoders use are binlog.proto's.

``codec.wire_tag`` (where the Python paths take theirs) gives the byte the protobuf
library itself writes first for every field. The C extensions' copies
(``include/binlake/_native/binlake_tags.h``) agree with it: every ``#define`` there
names a field or an enum value in its comment, and its name and value must be the
ones the descriptors give. A change to binlog.proto that moves a field the
extensions write or read fails here, not as bytes the parser misreads."""

from __future__ import annotations

import pathlib
import re
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from binlake import codec
from binlake.client import wire
from binlake.proto import binlog_pb2, pump_pb2

HEADER = pathlib.Path(__file__).resolve().parents[2] / "include" / "binlake" / "_native" / "binlake_tags.h"
DEFINE = re.compile(r"^#define (BL_\w+) (0x[0-9A-F]+|\d+) +/\* (\w+)\.(\w+)( \(packed\))? \*/$")

def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def problems(header: str) -> list[str]:
    """What in the text of binlake_tags.h disagrees with binlog.proto (nothing: [])."""
    messages = binlog_pb2.DESCRIPTOR.message_types_by_name
    enums = binlog_pb2.DESCRIPTOR.enum_types_by_name
    out = []
    for line in header.splitlines():
        if not line.startswith("#define BL_"):
            continue
        m = DEFINE.match(line)
        if not m:
            out.append(f"not of the checked form: {line!r}")
            continue
        name, value, owner, member, packed = m[1], int(m[2], 0), m[3], m[4], bool(m[5])
        if owner in messages:
            field = messages[owner].fields_by_name.get(member)
            tag = codec.wire_tag(getattr(binlog_pb2, owner), member) if field is not None else 0
            if field is None:
                out.append(f"{name}: binlog.proto has no field {owner}.{member}")
                continue
            if name != f"BL_TAG_{_snake(owner)}_{member.upper()}":
                out.append(f"{name} is not named after {owner}.{member}")
            if value != tag:
                out.append(f"{name} is {value:#04x}; binlog.proto gives {owner}.{member} {tag:#04x}")
            if packed != field.is_packed:
                out.append(f"{name}: '(packed)' must be said exactly of packed fields")
            if value >= 0x80:  # the C code writes and compares each tag as one byte
                out.append(f"{name} needs a two-byte tag")
        elif owner in enums:
            number = enums[owner].values_by_name.get(member)
            if number is None:
                out.append(f"{name}: binlog.proto's {owner} has no value {member}")
                continue
            if name != f"BL_{_snake(owner)}_{member}":
                out.append(f"{name} is not named after {owner}.{member}")
            if value != number.number:
                out.append(f"{name} is {value}; binlog.proto gives {owner}.{member} {number.number}")
        else:
            out.append(f"{name}: binlog.proto has no message or enum {owner}")
    return out


def _one_value(msg: Any, fd: FieldDescriptor) -> None:
    """Sets field ``fd`` of ``msg`` to something the serializer writes (not the default)."""
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        (getattr(msg, fd.name).add() if fd.is_repeated else getattr(msg, fd.name).SetInParent())
        return
    value = {FieldDescriptor.TYPE_STRING: "x", FieldDescriptor.TYPE_BYTES: b"x", FieldDescriptor.TYPE_BOOL: True,
             FieldDescriptor.TYPE_DOUBLE: 1.5, FieldDescriptor.TYPE_FLOAT: 1.5}.get(fd.type, 1)
    if fd.is_repeated:
        getattr(msg, fd.name).append(value)
    else:
        setattr(msg, fd.name, value)


def test_wire_tag_is_what_the_library_writes() -> None:
    checked = 0
    for module in (binlog_pb2, pump_pb2):
        for name, desc in module.DESCRIPTOR.message_types_by_name.items():
            cls = getattr(module, name)
            for fd in desc.fields:
                msg = cls()
                _one_value(msg, fd)
                tag = codec.wire_tag(cls, fd.name)
                data = msg.SerializeToString()
                assert data.startswith(wire.varint(tag)), (name, fd.name, hex(tag), data[:4])
                checked += 1
    assert checked > 50


def test_the_header_agrees_with_binlog_proto() -> None:
    text = HEADER.read_text()
    assert text.count("#define BL_") > 20  # the definitions were found
    assert problems(text) == []


def test_a_tag_that_disagrees_is_caught() -> None:
    text = HEADER.read_text()
    moved = text.replace("#define BL_TAG_DATUM_INT_VALUE 0x10", "#define BL_TAG_DATUM_INT_VALUE 0x18")
    renamed = text.replace("#define BL_TAG_ROW_COLUMNS 0x0A", "#define BL_TAG_ROW_COLUMN 0x0A")
    enum = text.replace("#define BL_COLUMN_TYPE_BOOL 11", "#define BL_COLUMN_TYPE_BOOL 10")
    unnamed = text.replace("/* Column.id */", "/* the id */")
    assert problems(moved) == ["BL_TAG_DATUM_INT_VALUE is 0x18; binlog.proto gives Datum.int_value 0x10"]
    assert problems(renamed) == ["BL_TAG_ROW_COLUMN is not named after Row.columns"]
    assert problems(enum) == ["BL_COLUMN_TYPE_BOOL is 10; binlog.proto gives ColumnType.BOOL 11"]
    assert len(problems(unnamed)) == 1 and "not of the checked form" in problems(unnamed)[0]
