"""The documentation site's generated reference pages follow the code, and its nav
matches docs/.

scripts/docs_reference.py makes the CLI, configuration, DAG, table and metric pages on
every ``make docs``. These tests check each page holds everything its source defines
(every command and flag, every setting, every DAG param, every table column, every
metric), that a change to the source (a flag added to a parser, a field to a settings
model, a param to a DAG file) changes the page, and that mkdocs.yml's nav and the files
under docs/ are the same set.
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import shutil
import sys
from types import ModuleType
from typing import Any

import pytest
import yaml
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from binlake import cli, config

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    """scripts/docs_reference.py (scripts/ is no package: put it on the path, as the hook does)."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    return importlib.import_module("docs_reference")


ref = _generator()


@pytest.fixture(scope="module")
def cli_page() -> str:
    return str(ref.cli_page())


def test_the_cli_page_holds_every_command_and_flag(cli_page: str) -> None:
    parser = cli.build_parser()
    commands = list(ref.walk_commands(parser))
    assert len(commands) > 30  # every subcommand, recursively (ctl, lake, source, bench, ...)
    for command in commands:
        assert f"## `{command.prog}`" in cli_page or f"# `{command.prog}`" in cli_page, command.prog
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
                continue
            for flag in action.option_strings:
                assert flag in cli_page, (command.prog, flag)
            if action.help and "%(" not in action.help:
                assert " ".join(action.help.split()).replace("|", "\\|") in cli_page, (command.prog, action.dest)


def test_the_cli_page_shows_defaults_and_choices() -> None:
    parser = ref.cli_page(_toy_parser())
    assert "| `--rows ROWS` | rows to write (default 7) | `7` |" in parser
    assert "| `--fast` | no fsync | `off` |" in parser


def _toy_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="toy")
    sub = p.add_subparsers(dest="cmd")
    run = sub.add_parser("run", help="run it")
    run.add_argument("--rows", type=int, default=7, help="rows to write (default %(default)s)")
    run.add_argument("--fast", action="store_true", help="no fsync")
    return p


def test_a_flag_added_to_a_parser_changes_the_cli_page() -> None:
    parser = cli.build_parser()
    before = ref.cli_page(parser)
    restore = next(c for c in ref.walk_commands(parser) if c.prog == "binlake restore")
    restore.add_argument("--as-of-yesterday", action="store_true", help="restore to yesterday's state")
    after = ref.cli_page(parser)
    assert "--as-of-yesterday" not in before
    assert "| `--as-of-yesterday` | restore to yesterday's state | `off` |" in after


def test_the_configuration_page_holds_every_setting() -> None:
    page = ref.config_page()
    for cls, section in config.SECTIONS.items():
        assert f"## `[{section}]`" in page
        for name, field in cls.model_fields.items():
            row = next((line for line in page.splitlines() if line.startswith(f"| `{name}` |")
                        and config.env_names(cls, name)[0] in line), None)
            assert row is not None, (section, name)
            if field.description:
                assert " ".join(field.description.split()).replace("|", "\\|") in row, (section, name)
            variable = config.airflow_variable(field)
            if variable:
                assert variable in row, (section, name)


def test_a_field_added_to_a_settings_model_changes_the_configuration_page() -> None:
    class Toy(BaseSettings):
        """A toy section."""

        model_config = SettingsConfigDict(env_prefix="BINLAKE_TOY_")
        depth: int = Field(3, description="How deep.")

    class Toy2(Toy):
        width: float = Field(1.5, description="How wide.")

    before = ref.config_page({Toy: "toy"})
    after = ref.config_page({Toy2: "toy"})
    assert "| `depth` | `BINLAKE_TOY_DEPTH` |  | `int` | `3` | How deep. |" in before
    assert "width" not in before
    assert "| `width` | `BINLAKE_TOY_WIDTH` |  | `float` | `1.5` | How wide. |" in after


def _params(dag_file: pathlib.Path) -> dict[str, Any]:
    return dict(ref.read_dag(dag_file)["params"])


def test_the_dags_page_holds_every_dag_and_param() -> None:
    page = ref.dags_page()
    dag_files = sorted((ROOT / "dags").glob("binlake_*.py"))
    assert len(dag_files) >= 4
    for path in dag_files:
        assert f"## `{path.stem}`" in page, path.name
        for name, param in _params(path).items():
            assert f"| `{name}` |" in page, (path.name, name)
            assert param["description"] in page
    # The restore DAG's form, as its file declares it.
    assert set(_params(ROOT / "dags" / "binlake_restore.py")) >= {"commit_ts", "datetime", "tz", "tables", "out",
                                                                  "target", "verify", "replace"}


def test_a_param_added_to_a_dag_file_changes_the_dags_page(tmp_path: pathlib.Path) -> None:
    shutil.copy(ROOT / "dags" / "binlake_apply.py", tmp_path / "binlake_apply.py")
    before = ref.dags_page(tmp_path)
    path = tmp_path / "binlake_apply.py"
    text = path.read_text()
    marker = 'params={"until_ts": Param('
    assert marker in text
    path.write_text(text.replace(marker, 'params={"dry_run": Param(False, type="boolean", description="only print '
                                          'the plan"), "until_ts": Param('))
    after = ref.dags_page(tmp_path)
    assert "dry_run" not in before
    assert "| `dry_run` | `'boolean'` | `False` | only print the plan |" in after


def test_the_tables_page_holds_every_column_of_every_lake_table() -> None:
    from binlake.lake.decoding import rows
    from binlake.restore import layout

    page = ref.tables_page()
    for where, columns in (("LAKE/changes", rows.CHANGE_COLUMNS), ("LAKE/ddl_history", rows.DDL_COLUMNS),
                           ("LAKE/windows", rows.WINDOW_COLUMNS)):
        section = page.split(f"## `{where}`", 1)[1].split("\n## ", 1)[0]
        for name, kind in columns:
            assert f"| `{name}` | `{kind}` |" in section, (where, name)
    for where, ddl in (("LAKE/snapshots/_catalog", layout.SNAPSHOT_CATALOG_DDL),
                       ("LAKE/history/_catalog", layout.HISTORY_CATALOG_DDL)):
        section = page.split(f"## `{where}`", 1)[1].split("\n## ", 1)[0]
        for part in ddl.split(","):
            name, kind = part.split()
            assert f"| `{name}` | `{kind}` |" in section, (where, name)
    assert "| `_valid_from_ts` | `long` |" in page and "| `_op` | `string` |" in page
    # A column added where the code defines the table shows up.
    changed = ref.tables_page([("LAKE/changes", "x", [*rows.CHANGE_COLUMNS, ("region", "string")])])
    assert "| `region` | `string` |" in changed


def test_the_metrics_page_holds_every_metric() -> None:
    page = ref.metrics_page()
    for name in ("binlake_pump_safe_ts_lag_seconds", "binlake_pump_gc_forced_total", "binlake_pump_disk_free_bytes",
                 "binlake_lake_lag_seconds", "binlake_lake_windows_waiting", "binlake_lake_up",
                 "binlake_pump_write_latency_seconds"):
        assert f"| `{name}` |" in page, name


def test_the_errors_page_holds_every_refusal_and_follows_the_code(tmp_path: pathlib.Path) -> None:
    page = ref.errors_page()
    # The refusals the runbook explains, as the code writes them.
    for text in ("is above pump {pump}'s safe ts {tso.format_ts(safe_ts)}", "starts below pump {pump}'s GC ts",
                 "fewer than min_acks={w}", "refuses writes: {free} bytes free on its data disk"):
        assert text in page, text
    package = tmp_path / "binlake"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "mod.py").write_text(
        "from binlake import errors\n\ndef f(n):\n    raise errors.Conflict(f'window {n} is taken: ' + 'pick another')\n")
    found = ref.read_errors(package)
    assert found == [{"module": "binlake.sub.mod", "kind": "Conflict", "message": "window {n} is taken: pick another"}]


def _nav_files(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [f for item in node for f in _nav_files(item)]
    if isinstance(node, dict):
        return [f for value in node.values() for f in _nav_files(value)]
    return []


def test_the_nav_and_the_docs_files_match() -> None:
    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_files(site["nav"])
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
    generated = set(ref.PAGES)
    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert not on_disk & generated, "a generated page is committed: the build makes it"
    assert set(nav) == on_disk | generated
    # The hook that makes them is the one mkdocs.yml names.
    assert site["hooks"] == ["docs/hooks/reference.py"]
