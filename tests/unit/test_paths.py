"""Files beside the package (jars, DAGs, plugins, benchmarks) come from settings with
the checkout as default, so an installed wheel can point elsewhere; the CLI loads
benchmarks from that folder without putting it on sys.path."""

from __future__ import annotations

import pathlib
import sys

import pytest

from binlake import cli, config
from binlake.lake.sparkenv import session as spark


def test_paths_default_to_the_checkout_and_follow_the_environment(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("JARS_DIR", "DAGS_FOLDER", "PLUGINS_FOLDER", "BENCH_DIR"):
        monkeypatch.delenv(f"BINLAKE_{name}", raising=False)
    p = config.paths()
    assert (p.dags(), p.plugins(), p.bench()) == (config.CHECKOUT / "dags", config.CHECKOUT / "plugins",
                                                  config.CHECKOUT / "bench")
    assert spark.jars_dir() == config.CHECKOUT / "jars" / "lib"
    monkeypatch.setenv("BINLAKE_JARS_DIR", str(tmp_path / "jars"))
    monkeypatch.setenv("BINLAKE_DAGS_FOLDER", str(tmp_path / "dags"))
    assert spark.jars_dir() == tmp_path / "jars" and config.paths().dags() == tmp_path / "dags"
    with pytest.raises(RuntimeError, match="no delta-spark jar in .*jars"):
        spark.delta_jars()


def test_bench_modules_load_from_the_bench_setting_without_sys_path(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "writer_bench.py").write_text(
        "import dataclasses\n\n@dataclasses.dataclass\nclass R:\n    n: int\n\n"
        "def main(args):\n    print('bench ran', args.seconds, R(1).n)\n    return 0\n")
    monkeypatch.setenv("BINLAKE_BENCH_DIR", str(tmp_path))
    before = list(sys.path)
    assert cli.main(["bench", "writer", "--seconds", "1.5"]) == 0
    assert "bench ran 1.5 1" in capsys.readouterr().out
    assert sys.path == before
    monkeypatch.setenv("BINLAKE_BENCH_DIR", str(tmp_path / "none"))
    assert cli.main(["bench", "writer"]) == 2
    assert "BINLAKE_BENCH_DIR" in capsys.readouterr().err
