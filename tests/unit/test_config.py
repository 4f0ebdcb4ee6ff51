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


def _tables(doc: dict[str, object], prefix: str = "") -> set[str]:
    """The dotted names of every table in a TOML document."""
    names = set()
    for key, value in doc.items():
        if isinstance(value, dict):
            names.add(prefix + key)
            names |= _tables(value, f"{prefix}{key}.")
    return names


def test_sample_has_every_section_and_nothing_unknown(tmp_path: pathlib.Path) -> None:
    """Every section of the model is a table of the sample and every table a section;
    with its commented examples uncommented the sample still validates (no unknown key,
    no example value the model refuses)."""
    import tomllib

    assert _tables(tomllib.loads(SAMPLE.read_text())) == set(config.SECTIONS.values())
    config.check_file(SAMPLE)
    examples = tmp_path / "examples.toml"
    examples.write_text(re.sub(r"^# ?([a-z_]+ = )", r"\1", SAMPLE.read_text(), flags=re.M))
    config.check_file(examples)
    for cls in config.SECTIONS:
        config.load(cls, examples)


def test_every_field_has_a_description() -> None:
    for cls in config.SECTIONS:
        for name, field in cls.model_fields.items():
            assert field.description, f"{cls.__name__}.{name} has no description"


@pytest.mark.parametrize(("env", "value", "cls", "field", "want"), [
    ("BINLAKE_LAKE_DIR", "/l", config.LakeSettings, "dir", "/l"),
    ("BINLAKE_REGISTRY", "r1:8230,r2:8230", config.ClusterSettings, "registry", "r1:8230,r2:8230"),
    ("BINLAKE_CLIENT_REGISTRY", "c:8230", config.ClusterSettings, "registry", "c:8230"),
    ("BINLAKE_SAFE_TS_POLL_S", "0.5", config.IngestSettings, "safe_ts_poll_s", 0.5),
    ("BINLAKE_INGEST_MODE", " InProcess ", config.IngestSettings, "mode", "inprocess"),
    ("BINLAKE_NATIVE_DECODE", "0", config.NativeSettings, "decode", False),
    ("BINLAKE_READ_BURST_MS", "0", config.SourceSettings, "read_burst_ms", 0.0),
    ("BINLAKE_GC_MARGIN_HOURS", "2", config.MaintenanceSettings, "gc_margin_hours", 2.0),
    ("AWS_REGION", "eu-west-3", config.S3Settings, "region", "eu-west-3"),
    ("BINLAKE_LAKE_S3_REGION", "eu-west-1", config.S3Settings, "region", "eu-west-1"),
])
def test_the_documented_variables_set_the_model(monkeypatch: pytest.MonkeyPatch, env: str, value: str,
                                                cls: type, field: str, want: object) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "BINLAKE_REGISTRY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(env, value)
    assert getattr(config.load(cls), field) == want


def test_the_aws_variables_win_over_binlake_s3_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINLAKE_LAKE_S3_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    assert config.load(config.S3Settings).region == "eu-west-3"
    monkeypatch.setenv("AWS_REGION", "")  # empty counts as unset
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    assert config.load(config.S3Settings).region == "eu-west-1"


def test_a_bad_variable_is_one_line_naming_it_and_its_airflow_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINLAKE_SAFE_TS_POLL_S", "0")
    with pytest.raises(errors.ConfigError) as caught:
        config.load(config.IngestSettings)
    message = str(caught.value)
    assert "\n" not in message and isinstance(caught.value, errors.BinlakeError)
    assert "[ingest] safe_ts_poll_s / BINLAKE_SAFE_TS_POLL_S / Airflow Variable binlake_safe_ts_poll_s" in message


def test_a_drill_webhook_is_an_http_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINLAKE_DRILL_WEBHOOK", "hooks.example.com/x")
    with pytest.raises(errors.ConfigError) as caught:
        config.load(config.DrillSettings)
    assert "BINLAKE_DRILL_WEBHOOK / Airflow Variable binlake_drill_webhook" in str(caught.value)
    assert "is not an http(s) URL" in str(caught.value)
    monkeypatch.setenv("BINLAKE_DRILL_WEBHOOK", "https://hooks.example.com/x")
    assert config.load(config.DrillSettings).webhook == "https://hooks.example.com/x"


def test_a_commands_file_and_exports_reach_later_loads_and_children(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[spark]\nmaster = "local[2]"\n')
    monkeypatch.delenv("BINLAKE_SPARK_MASTER", raising=False)
    try:
        config.use_file(f)
        assert config.load(config.SparkSettings).master == "local[2]"
        config.export(config.SparkSettings, {"master": "local[2]", "ship_code": False})
        env = config.child_env({"PATH": "/bin"})
        assert env == {"PATH": "/bin", "BINLAKE_SPARK_MASTER": "local[2]", "BINLAKE_SPARK_SHIP_CODE": "false"}
        assert "BINLAKE_SPARK_MASTER" not in __import__("os").environ
    finally:
        config.reset()
    assert config.load(config.SparkSettings).master is None and config.exported() == {}


# Named BINLAKE_* but no setting: the crash-test failpoint (binlake.failpoint) and the
# flush-less benchmark's switch (bench/noflush/sitecustomize.py, set for its Pump
# children only), each read by its own module on purpose, and a psycopg2 type's name.
NOT_SETTINGS = {"BINLAKE_FAILPOINT", "BINLAKE_BENCH_NO_FLUSH", "BINLAKE_TEXT"}


def test_every_binlake_variable_named_anywhere_is_the_models() -> None:
    """The variables the code, the DAGs, the compose file, the sample, the README and the
    documentation site name are fields of the model (its env names): there is no other reader."""
    known = {env for cls in config.SECTIONS for name in cls.model_fields for env in config.env_names(cls, name)}
    files = [ROOT / "docker-compose.yaml", ROOT / "README.md", SAMPLE, *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("include", "plugins", "dags", "jobs", "scripts", "bench"):
        files += sorted((ROOT / folder).rglob("*.py"))
    unknown: dict[str, str] = {}
    for path in files:
        for name in re.findall(r"(?<![A-Z0-9_])BINLAKE_[A-Z0-9_]*[A-Z0-9]\b(?!_)", path.read_text()):
            if name not in known and name not in NOT_SETTINGS:
                unknown.setdefault(name, str(path.relative_to(ROOT)))
    assert not unknown, f"BINLAKE_* variables that are no setting of binlake.config: {unknown}"
