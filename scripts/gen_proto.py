"""Regenerate (or, with --check, verify) the committed *_pb2 modules from the .proto sources.

`make proto` regenerates; `make proto-check` and the test suite fail when the
committed modules differ from what the pinned grpcio-tools would generate.
"""

from __future__ import annotations

import argparse
import filecmp
import pathlib
import shutil
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "include"
PROTO_DIR = INCLUDE / "binlake" / "proto"


def generate(out: pathlib.Path) -> list[pathlib.Path]:
    from grpc_tools import protoc  # dev dependency

    protos = sorted(PROTO_DIR.glob("*.proto"))
    args = [
        "protoc",
        f"-I{INCLUDE}",
        f"-I{pathlib.Path(protoc.__file__).parent / '_proto'}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *[str(p.relative_to(INCLUDE)) for p in protos],
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    return sorted((out / "binlake" / "proto").glob("*_pb2*.py*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report stale modules; change nothing")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(pathlib.Path(tmp))
        stale = []
        for path in generated:
            committed = PROTO_DIR / path.name
            if not committed.exists() or not filecmp.cmp(path, committed, shallow=False):
                stale.append(path.name)
                if not opts.check:
                    shutil.copyfile(path, committed)
        names = {p.name for p in generated}
        extra = [p.name for p in PROTO_DIR.glob("*_pb2*.py*") if p.name not in names]
    if opts.check:
        if stale or extra:
            print(
                "generated protobuf modules are stale: "
                + ", ".join(stale + extra)
                + "\nrun `make proto` and commit the result",
                file=sys.stderr,
            )
            return 1
        print("protobuf modules are fresh")
        return 0
    print("regenerated: " + (", ".join(stale) if stale else "nothing (already fresh)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
