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


def _broken_copy(tmp_path: pathlib.Path, module: str, line: str | None) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over a copy of the package with ``line`` appended to ``module``
    (a path under the package; a new module when ``line`` is None); it must fail."""
    copy = tmp_path / "src" / "binlake"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(CHECKOUT / "pyproject.toml", tmp_path / "pyproject.toml")
    if line is None:
        (copy / module).write_text('"""A module no layer names."""\n')
    else:
        with (copy / module).open("a") as f:
            f.write(f"\n{line}  # noqa: E402,F401\n")
    done = _lint_imports(copy.parent, tmp_path)
    assert done.returncode != 0, done.stdout[-4000:]
    return done


def test_an_import_up_a_layer_breaks_the_contract(tmp_path: pathlib.Path) -> None:
    # tso is a shared leaf: the command line is the top layer.
    done = _broken_copy(tmp_path, "tso.py", "import binlake.cli")
    assert "binlake's layers, from the command line down to the shared leaves BROKEN" in done.stdout
    assert "binlake.tso -> binlake.cli" in done.stdout


def test_production_code_importing_the_test_tooling_breaks_the_contract(tmp_path: pathlib.Path) -> None:
    done = _broken_copy(tmp_path, "stack/supervisor.py", "from binlake.testing import devcluster")
    assert "binlake.testing is test tooling: no production module imports it BROKEN" in done.stdout
    assert "binlake.stack.supervisor -> binlake.testing.devcluster" in done.stdout


def test_a_target_importing_a_role_breaks_the_contract(tmp_path: pathlib.Path) -> None:
    # The targets are shared SQL code: the apply uses them, never the reverse.
    done = _broken_copy(tmp_path, "sql/targets/duckdb.py", "from binlake.replicate import checkpoint")
    assert "binlake.sql.targets.duckdb -> binlake.replicate.checkpoint" in done.stdout


def test_a_new_module_must_be_placed_in_a_layer(tmp_path: pathlib.Path) -> None:
    done = _broken_copy(tmp_path, "unplaced.py", None)
    assert "binlake.unplaced" in done.stdout + done.stderr
