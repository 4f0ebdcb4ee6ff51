"""The replication task file: which lake, which target, how, and the rules.

A TOML file in the manner of a DM task file; ``config/task.sample.toml``
documents every key with its default. Four keys are enough::

    name = "replica1"
    lake = "data/lake"
    target = "sqlite:///data/replica.db"
    mode = "consistent"

Unknown keys, bad patterns and bad values are refused with one line that
names the key and says what is expected (``errors.InvalidArgument``).
"""

from __future__ import annotations

import pathlib
import re
import tomllib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from binlake import errors

MODES = ("consistent", "parallel")
EVENTS = ("insert", "update", "delete", "ddl", "create table", "drop table", "truncate table",
          "rename table", "alter table")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$")


def check_pattern(value: Any) -> str:
    """A name pattern: ``*`` (anything), an exact name (case-insensitive), or
    ``~regex`` (Python syntax, matched in full, case-insensitive)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"a pattern is a non-empty string (a name, * or ~regex), got {value!r}")
    if value.startswith("~"):
        try:
            re.compile(value[1:])
        except re.error as exc:
            raise ValueError(f"{value!r} is not a valid regular expression: {exc}") from None
    return value


def check_table_pattern(value: Any) -> str:
    """``SCHEMA.TABLE`` where each part is a pattern (split at the first dot)."""
    if not isinstance(value, str) or "." not in value:
        raise ValueError(f"a table pattern is SCHEMA.TABLE (each part a name, * or ~regex), got {value!r}")
    schema, _, table = value.partition(".")
    check_pattern(schema)
    check_pattern(table)
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Filter(_Strict):
    """Table allow and block lists (allow list first, then block list)."""

    allow: list[str] = Field(default_factory=list, description="SCHEMA.TABLE patterns; empty: every table")
    block: list[str] = Field(default_factory=list, description="SCHEMA.TABLE patterns removed after allow")

    @field_validator("allow", "block")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        return [check_table_pattern(p) for p in v]


class EventFilter(_Strict):
    """Ignore some kinds of change on the matching tables."""

    tables: list[str] = Field(min_length=1, description="SCHEMA.TABLE patterns")
    ignore: list[str] = Field(min_length=1, description=f"event kinds: {', '.join(EVENTS)}")

    @field_validator("tables")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        return [check_table_pattern(p) for p in v]

    @field_validator("ignore")
    @classmethod
    def _events(cls, v: list[str]) -> list[str]:
        out = []
        for e in v:
            e2 = " ".join(str(e).lower().split())
            if e2 not in EVENTS:
                raise ValueError(f"unknown event {e!r}: use {', '.join(EVENTS)}")
            out.append(e2)
        return out


class Route(_Strict):
    """Rename matching tables, or merge shards into one target table."""

    schema_pattern: str = Field(description="pattern of the upstream schema")
    table_pattern: str = Field("*", description="pattern of the upstream table")
    target_schema: str | None = Field(None, description="new schema name (default: unchanged)")
    target_table: str | None = Field(None, description="new table name (default: unchanged)")
    extract_table_column: str | None = Field(
        None, description="column added to the target table holding the upstream table's name")

    @field_validator("schema_pattern", "table_pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        return check_pattern(v)

    @field_validator("target_table", "extract_table_column")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$", v):
            raise ValueError(f"{v!r} is not a valid table/column name (letters, digits, _)")
        return v


class ExprFilter(_Strict):
    """Skip row changes whose image matches a Spark SQL predicate (DM's expression filter)."""

    table: str = Field(description="SCHEMA.TABLE pattern")
    insert_value_expr: str | None = Field(None, description="skip inserts whose new row matches")
    update_old_value_expr: str | None = Field(None, description="skip updates whose old row matches")
    update_new_value_expr: str | None = Field(None, description="skip updates whose new row matches")
    delete_value_expr: str | None = Field(None, description="skip deletes whose old row matches")

    @field_validator("table")
    @classmethod
    def _pattern(cls, v: str) -> str:
        return check_table_pattern(v)

    @model_validator(mode="after")
    def _one(self) -> ExprFilter:
        if not any((self.insert_value_expr, self.update_old_value_expr, self.update_new_value_expr,
                    self.delete_value_expr)):
            raise ValueError("an expression filter needs at least one of insert_value_expr, "
                             "update_old_value_expr, update_new_value_expr, delete_value_expr")
        return self


class Task(_Strict):
    """One replication task: the lake's change table applied to one target."""

    name: str = Field(description="task name: the key of its checkpoint in the target")
    lake: str = Field(description="lake directory or URI (the ingest's)")
    target: str = Field(description="SQLAlchemy URL, or an Airflow Connection id when run by the DAG")
    mode: Literal["consistent", "parallel"] = Field(description="consistent | parallel")
    start_after_ts: int = Field(
        0, ge=0, description="with no checkpoint yet, apply changes committed after this ts (a restored snapshot's)")
    safe_mode_until_ts: int = Field(
        0, ge=0, description="windows starting below this ts are applied in safe mode (upsert / delete-if-exists)")
    batch_rows: int = Field(1000, ge=1, le=100_000, description="rows per statement")
    parallel_tasks: int = Field(4, ge=1, le=256, description="worker threads applying groups concurrently (parallel mode)")
    diff_source: str | None = Field(None, description="database to diff the target against after each apply")
    filter: Filter = Field(default_factory=Filter)
    event_filters: list[EventFilter] = Field(default_factory=list)
    routes: list[Route] = Field(default_factory=list)
    expr_filters: list[ExprFilter] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _task_name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r} is not a valid task name (letters, digits, _ . -; at most 63)")
        return v

    @field_validator("lake", "target")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @property
    def target_is_url(self) -> bool:
        return "://" in self.target


def parse(doc: dict[str, Any], where: str = "task") -> Task:
    """A Task from a parsed TOML document; one-line InvalidArgument naming the key."""
    try:
        return Task.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "?"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (config/task.sample.toml lists every key)"
        elif err["type"] == "missing":
            msg = "required key is missing"
        elif err["type"] == "literal_error":
            msg = f"{msg} (got {err.get('input')!r})"
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise errors.InvalidArgument(f"{where}: {key}: {msg}{more}") from None


def load(path: str | pathlib.Path) -> Task:
    """Read and validate a task file."""
    p = pathlib.Path(path)
    if p.is_dir():
        raise errors.InvalidArgument(f"task file {p} is a directory: give the task's TOML file")
    if not p.is_file():
        raise errors.InvalidArgument(f"task file {p} does not exist (see config/task.sample.toml)")
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise errors.InvalidArgument(f"task file {p} is not valid TOML: {exc}") from None
    return parse(doc, f"task file {p}")
