"""The import contract (``[tool.importlinter]`` in pyproject.toml, run by ``make lint``):
binlake as it is keeps it, and the contract bites: a copy of the package with one
import going up a layer fails, naming that import."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import binlake

CHECKOUT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = pathlib.Path(binlake.__file__).resolve().parent


def _lint_imports(package_parent: pathlib.Path, config_dir: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the binlake package found under ``package_parent``, with the
    contract of ``config_dir``'s pyproject.toml (no cache: the copy is new each time)."""
    script = pathlib.Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run([str(script), "--no-cache"], cwd=config_dir, env=env, capture_output=True, text=True,
                          timeout=240)


def test_binlake_keeps_its_import_contract() -> None:
    done = _lint_imports(PACKAGE.parent, CHECKOUT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_an_import_up_a_layer_breaks_the_contract(tmp_path: pathlib.Path) -> None:
    copy = tmp_path / "src" / "binlake"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(CHECKOUT / "pyproject.toml", tmp_path / "pyproject.toml")
    # tso is a shared leaf: the command line is the top layer.
    with (copy / "tso.py").open("a") as f:
        f.write("\nimport binlake.cli  # noqa: E402,F401\n")
    done = _lint_imports(copy.parent, tmp_path)
    assert done.returncode != 0, done.stdout[-4000:]
    assert "binlake's layers, from the command line down to the shared leaves BROKEN" in done.stdout
    assert "binlake.tso -> binlake.cli" in done.stdout


def test_production_code_importing_the_test_tooling_breaks_the_contract(tmp_path: pathlib.Path) -> None:
    copy = tmp_path / "src" / "binlake"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(CHECKOUT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (copy / "stack" / "supervisor.py").open("a") as f:
        f.write("\nfrom binlake.testing import devcluster  # noqa: E402,F401\n")
    done = _lint_imports(copy.parent, tmp_path)
    assert done.returncode != 0, done.stdout[-4000:]
    assert "binlake.testing is test tooling: no production module imports it BROKEN" in done.stdout
    assert "binlake.stack.supervisor -> binlake.testing.devcluster" in done.stdout


def test_a_new_module_must_be_placed_in_a_layer(tmp_path: pathlib.Path) -> None:
    copy = tmp_path / "src" / "binlake"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(CHECKOUT / "pyproject.toml", tmp_path / "pyproject.toml")
    (copy / "unplaced.py").write_text('"""A module no layer names."""\n')
    done = _lint_imports(copy.parent, tmp_path)
    assert done.returncode != 0, done.stdout[-4000:]
    assert "binlake.unplaced" in done.stdout + done.stderr
