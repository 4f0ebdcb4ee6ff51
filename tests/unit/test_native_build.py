"""Every C extension setup.py builds is named wherever the build must know it, and
matches its type stub.

setup.py's ``ext_modules`` is the list; for each extension: its source is a
prerequisite of ``make setup`` (else editing it does not rebuild it), as are the
shared headers it includes; a ``.pyi`` stub lies next to the source and is
package data (else type checkers see no types); the stub agrees with the built
module (mypy's stubtest: names, parameters, positional-only markers, which the C
code declares in each docstring's signature line); and the module imports (a
build that silently failed, setup.py marking them optional, fails here too)."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "include" / "binlake"
HEADERS = sorted(p.relative_to(ROOT).as_posix() for p in (PACKAGE / "_native").glob("*.h"))


def extensions() -> dict[str, str]:
    """setup.py's extensions: module name -> source path (read, not run)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Extension":
            name = ast.literal_eval(node.args[0])
            (sources,) = [ast.literal_eval(k.value) for k in node.keywords if k.arg == "sources"]
            assert len(sources) == 1, f"{name}: one source file per extension"
            out[name] = sources[0]
    assert out, "no Extension(...) found in setup.py"
    return out


def test_the_five_extensions_are_listed() -> None:
    assert {n.rsplit(".", 1)[1] for n in extensions()} == {"_imagec", "_rowsc", "_framec", "_snaprowc", "_pgoutc"}
    assert HEADERS == ["include/binlake/_native/binlake_native.h", "include/binlake/_native/binlake_tags.h"]


def test_make_setup_rebuilds_on_every_source_and_header() -> None:
    # All prerequisites of $(STAMP), over every rule line that names it.
    text = (ROOT / "Makefile").read_text()
    prereqs = {p for line in re.findall(r"^\$\(STAMP\):(.*)$", text, re.M) for p in line.split()}
    for name, source in extensions().items():
        assert source in prereqs, f"the Makefile's $(STAMP) rule does not list {source} ({name})"
        assert "#include \"binlake_native.h\"" in (ROOT / source).read_text(), f"{source} does not use the shared header"
    for header in HEADERS:
        assert header in prereqs, f"the Makefile's $(STAMP) rule does not list {header}"


def test_every_extension_has_a_stub_shipped_as_package_data() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["binlake"]
    shipped = {p for g in globs for p in PACKAGE.glob(g)}
    for name, source in extensions().items():
        stub = (ROOT / source).with_suffix(".pyi")
        assert stub.name == name.rsplit(".", 1)[1] + ".pyi", f"{source} does not build {name}"
        assert stub.is_file(), f"{name} has no type stub {stub.relative_to(ROOT)}"
        assert stub in shipped, f"pyproject's package-data does not ship {stub.relative_to(ROOT)}"


def test_every_extension_imports() -> None:
    for name in extensions():
        importlib.import_module(name)  # ImportError: not built (`make setup` with a C compiler)


def test_the_stubs_agree_with_the_built_modules() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy.stubtest", *extensions()], capture_output=True, text=True,
                          timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
