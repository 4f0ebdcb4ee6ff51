"""``binlake lake status`` shows the ``[memory]`` bounds in force, in its report and in
its JSON, as the environment sets them."""

from __future__ import annotations

import json
import pathlib

import pytest

from binlake import cli
from binlake.registry.server import RegistryServer


def test_lake_status_shows_the_memory_settings_in_force(
        tmp_path: pathlib.Path, registry: RegistryServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    monkeypatch.setenv("BINLAKE_MEMORY_DRIVER", "3G")
    monkeypatch.setenv("BINLAKE_MEMORY_PARTITION_ROWS", "75000")
    args = ["lake", "status", "--lake", str(lake), "--registry", registry.addr]
    assert cli.main([*args, "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    # partition_bytes in force: its default, the driver heap / 32.
    assert memory == {"driver": "3g", "executor": "1g", "partition_rows": 75000, "partition_bytes": 96 << 20,
                      "batch_rows": 10000, "direct_rows": 50000, "read_budget": 200000, "diff_keys": 100}
    assert cli.main(args) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("memory ")]
    assert line.split(None, 1)[1] == (
        "driver 3g, executor 1g, partition_rows 75000, partition_bytes 100663296, batch_rows 10000, direct_rows 50000, "
        "read_budget 200000, "
        "diff_keys 100  ([memory], BINLAKE_MEMORY_*)")
    monkeypatch.setenv("BINLAKE_MEMORY_EXECUTOR", "lots")
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "executor" in err[0] and "512m or 2g" in err[0], err
