"""Configuration: the sample documents every key; precedence; clear errors."""

from __future__ import annotations

import pathlib
import re

import pytest

from binlake import config, errors

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "config" / "binlake.toml"


@pytest.mark.parametrize("cls", list(config.SECTIONS))
def test_sample_names_every_key_with_its_default(cls: type) -> None:
    text = SAMPLE.read_text()
    section = config.SECTIONS[cls]
    body = text.split(f"[{section}]", 1)[1].split("\n[", 1)[0]
    named = set(re.findall(r"^#?\s?([a-z_]+) = ", body, flags=re.M))
    assert named == set(cls.model_fields), f"[{section}] keys differ from {cls.__name__}"
    loaded = config.load(cls, SAMPLE)
    assert loaded == cls(), f"[{section}] values in the sample differ from the defaults"


def test_precedence_flags_over_env_over_file(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[pump]\ntxn_timeout_s = 5.0\nheartbeat_interval_s = 7.0\ngc_retention_days = 3.0\n')
    monkeypatch.setenv("BINLAKE_PUMP_HEARTBEAT_INTERVAL_S", "9")
    monkeypatch.setenv("BINLAKE_PUMP_GC_RETENTION_DAYS", "4")
    s = config.load(config.PumpSettings, f, gc_retention_days=2.0, node_id=None)
    assert s.txn_timeout_s == 5.0  # file
    assert s.heartbeat_interval_s == 9.0  # env beats file
    assert s.gc_retention_days == 2.0  # flag beats env
    assert s.node_id is None  # an unset flag falls through


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ("[pump]\ntxn_timeout_s = -1\n", "txn_timeout_s"),
        ("[pump]\nmax_binlog_bytes = 4294967296\n", "max_binlog_bytes"),
        ("[pump]\naddr = \"nohost\"\n", "HOST:PORT"),
        ("[pump]\nno_such_key = 1\n", "unknown key"),
        ("[pump]\nfsync = \"sometimes\"\n", "fsync"),
        ("[client]\nstrategy = \"random\"\n", "strategy"),
        ("pump = 3\n", "must be a table"),
        ("[pump\n", "not valid TOML"),
    ],
)
def test_bad_values_are_named(tmp_path: pathlib.Path, toml: str, needle: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(toml)
    cls = config.ClientSettings if "[client]" in toml else config.PumpSettings
    with pytest.raises(errors.InvalidArgument) as exc:
        config.load(cls, f)
    assert needle in str(exc.value)


def test_missing_file_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(errors.InvalidArgument, match="does not exist"):
        config.load(config.PumpSettings, tmp_path / "nope.toml")


def test_bad_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINLAKE_CLIENT_MAX_FAILURES", "zero")
    with pytest.raises(errors.InvalidArgument, match="BINLAKE_CLIENT_MAX_FAILURES"):
        config.load(config.ClientSettings)
