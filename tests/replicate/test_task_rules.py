"""The task file (its validation and the sample's completeness) and the rules
it defines: filters, event filters and routes decide exactly what they say."""

from __future__ import annotations

import pathlib
import re
import tomllib

import pytest

from binlake import errors
from binlake.replicate import rules, task
from binlake.sql import schema as sc

SAMPLE = pathlib.Path(__file__).resolve().parents[2] / "config" / "task.sample.toml"
MINIMAL = 'name = "replica1"\nlake = "data/lake"\ntarget = "sqlite:///data/replica.db"\nmode = "consistent"\n'


def write(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    p = tmp_path / "task.toml"
    p.write_text(text)
    return p


def test_minimal_task_file_works_as_is(tmp_path: pathlib.Path) -> None:
    t = task.load(write(tmp_path, MINIMAL))
    assert (t.name, t.lake, t.target, t.mode) == ("replica1", "data/lake", "sqlite:///data/replica.db", "consistent")
    assert t.filter.allow == [] and t.routes == [] and t.start_after_ts == 0


def _keys(model: type[task.BaseModel], prefix: str = "") -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        out.add(prefix + name)
        ann = field.annotation
        inner = getattr(ann, "__args__", (ann,))
        for t in inner:
            if isinstance(t, type) and issubclass(t, task.BaseModel):
                out |= _keys(t, prefix + name + ".")
    return out


def test_sample_lists_every_key_and_parses() -> None:
    text = SAMPLE.read_text()
    uncommented = "\n".join(line.removeprefix("# ") for line in text.splitlines()
                            if not line.startswith("# ") or re.match(r"# (\[\[|\w+ = )", line))
    doc = tomllib.loads(uncommented)
    t = task.parse(doc, "sample")  # every key (commented ones included) is valid
    documented = set(doc) | {f"filter.{k}" for k in doc["filter"]}
    for section in ("event_filters", "routes", "expr_filters"):
        documented |= {f"{section}.{k}" for item in doc[section] for k in item}
    wanted = _keys(task.Task) | {f"{s}.{k}" for s, m in (("event_filters", task.EventFilter),
                                                           ("routes", task.Route),
                                                           ("expr_filters", task.ExprFilter))
                                 for k in m.model_fields}
    assert wanted - documented == set()
    # the defaults in the sample are the model's
    defaults = task.Task(name="x", lake="l", target="sqlite:///x", mode="consistent")
    plain = tomllib.loads(text)
    for k, v in plain.items():
        if k not in ("name", "lake", "target", "mode", "filter"):
            assert getattr(defaults, k) == v, k
    assert t.mode == "consistent"


@pytest.mark.parametrize("extra, message", [
    ('colour = "red"\n', r"task file .*: colour: unknown key"),
    ('[filter]\nallow = ["app.~orders_(\\\\d+"]\n', r"filter.allow: .*not a valid regular expression"),
    ('[filter]\nallow = ["orders"]\n', r"filter.allow: a table pattern is SCHEMA.TABLE"),
    ('batch_rows = 0\n', r"batch_rows: Input should be greater than or equal to 1"),
    ('[[event_filters]]\ntables = ["a.b"]\nignore = ["upsert"]\n', r"event_filters.0.ignore: unknown event 'upsert'"),
    ('[[routes]]\nschema_pattern = "a"\nbogus = 1\n', r"routes.0.bogus: unknown key"),
    ('[[expr_filters]]\ntable = "a.b"\n', r"expr_filters.0: .*at least one of insert_value_expr"),
])
def test_bad_task_files_name_the_key(tmp_path: pathlib.Path, extra: str, message: str) -> None:
    text = MINIMAL.replace('mode = "consistent"\n', 'mode = "consistent"\n' + extra) if not extra.startswith("[") \
        else MINIMAL + extra
    with pytest.raises(errors.InvalidArgument, match=message) as info:
        task.load(write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_bad_mode_missing_key_and_missing_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(errors.InvalidArgument, match=r"mode: Input should be 'consistent' or 'parallel'.*'fast'"):
        task.load(write(tmp_path, MINIMAL.replace('"consistent"', '"fast"')))
    with pytest.raises(errors.InvalidArgument, match=r"target: required key is missing"):
        task.load(write(tmp_path, MINIMAL.replace('target = "sqlite:///data/replica.db"\n', "")))
    with pytest.raises(errors.InvalidArgument, match="does not exist"):
        task.load(tmp_path / "nope.toml")


def make_rules(**kw: object) -> rules.Rules:
    return rules.Rules(task.Task(name="t", lake="l", target="sqlite:///x", mode="consistent", **kw))


def test_allow_then_block_case_insensitive_and_regex() -> None:
    r = make_rules(filter={"allow": ["App.~orders_\\d+", "app.users"], "block": ["app.orders_13", "*.USERS"]})
    assert r.replicated("app", "orders_01") and r.replicated("APP", "ORDERS_02")
    assert not r.replicated("app", "orders_13")  # blocked after being allowed
    assert not r.replicated("app", "users")  # allowed, then blocked by *.USERS
    assert not r.replicated("app", "orders_x") and not r.replicated("other", "orders_01")
    everything = make_rules(filter={"block": ["~tmp\\d*.*"]})
    assert everything.replicated("app", "x") and not everything.replicated("tmp1", "x")


def test_event_filters() -> None:
    r = make_rules(event_filters=[{"tables": ["app.audit"], "ignore": ["delete"]},
                                  {"tables": ["app.~a.*"], "ignore": ["DDL"]}])
    assert r.ignored("app", "audit") >= {"delete", "create table", "alter table", "drop table"}
    assert "insert" not in r.ignored("app", "audit")
    assert r.ignored("app", "accounts") >= {"truncate table", "rename table"} and "delete" not in r.ignored("app", "accounts")
    assert r.ignored("app", "users") == frozenset()


def test_routes_rename_and_merge_shards_with_extract_column() -> None:
    r = make_rules(routes=[{"schema_pattern": "app", "table_pattern": "~orders_\\d+", "target_table": "orders",
                            "extract_table_column": "source_table"},
                           {"schema_pattern": "app", "table_pattern": "users", "target_table": "customers"}])
    assert r.place("app", "orders_07") == rules.Placement("orders", "app", "source_table", "orders_07")
    assert r.place("app", "users") == rules.Placement("customers", "app")
    assert r.place("app", "items") == rules.Placement("items", "app")
    info = sc.new_table(7, "app", "orders_07", [sc.ColumnDef("id", "int"), sc.ColumnDef("v", "string")],
                        ["id"], None, 1)
    out = r.target_info(info)
    assert out.name == "orders" and [c.name for c in out.columns] == ["id", "v", "source_table"]
    assert [c.name for c in out.columns if c.id in out.primary_key] == ["id", "source_table"]
    assert info.name == "orders_07"  # the upstream definition is untouched


def test_ddl_kind() -> None:
    a = sc.new_table(7, "app", "t", [sc.ColumnDef("id", "int")], ["id"], None, 1)
    b = sc.new_table(7, "app", "t", [sc.ColumnDef("id", "int"), sc.ColumnDef("x", "int")], ["id"], None, 2)
    assert rules.ddl_kind(None, a) == "create table"
    assert rules.ddl_kind(a, b) == "alter table"
    c = type(a)()
    c.CopyFrom(a)
    c.name = "u"
    assert rules.ddl_kind(a, c) == "rename table"
    c.dropped = True
    assert rules.ddl_kind(a, c) == "drop table"
    d = type(a)()
    d.CopyFrom(a)
    d.table_id, d.previous_table_id = 8, 7
    assert rules.ddl_kind(a, d) == "truncate table"
