from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BinlogType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PREWRITE: _ClassVar[BinlogType]
    COMMIT: _ClassVar[BinlogType]
    ROLLBACK: _ClassVar[BinlogType]

class MutationType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INSERT: _ClassVar[MutationType]
    UPDATE: _ClassVar[MutationType]
    DELETE_ROW: _ClassVar[MutationType]

class ColumnType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TYPE_UNSPECIFIED: _ClassVar[ColumnType]
    INT: _ClassVar[ColumnType]
    UINT: _ClassVar[ColumnType]
    FLOAT: _ClassVar[ColumnType]
    DECIMAL: _ClassVar[ColumnType]
    STRING: _ClassVar[ColumnType]
    BYTES: _ClassVar[ColumnType]
    DATE: _ClassVar[ColumnType]
    DATETIME: _ClassVar[ColumnType]
    TIME: _ClassVar[ColumnType]
    JSON: _ClassVar[ColumnType]
    BOOL: _ClassVar[ColumnType]
PREWRITE: BinlogType
COMMIT: BinlogType
ROLLBACK: BinlogType
INSERT: MutationType
UPDATE: MutationType
DELETE_ROW: MutationType
TYPE_UNSPECIFIED: ColumnType
INT: ColumnType
UINT: ColumnType
FLOAT: ColumnType
DECIMAL: ColumnType
STRING: ColumnType
BYTES: ColumnType
DATE: ColumnType
DATETIME: ColumnType
TIME: ColumnType
JSON: ColumnType
BOOL: ColumnType

class Binlog(_message.Message):
    __slots__ = ("tp", "start_ts", "commit_ts", "prewrite_key", "prewrite_value", "ddl_query", "ddl_job_id", "ddl_table")
    TP_FIELD_NUMBER: _ClassVar[int]
    START_TS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    PREWRITE_KEY_FIELD_NUMBER: _ClassVar[int]
    PREWRITE_VALUE_FIELD_NUMBER: _ClassVar[int]
    DDL_QUERY_FIELD_NUMBER: _ClassVar[int]
    DDL_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DDL_TABLE_FIELD_NUMBER: _ClassVar[int]
    tp: BinlogType
    start_ts: int
    commit_ts: int
    prewrite_key: bytes
    prewrite_value: bytes
    ddl_query: bytes
    ddl_job_id: int
    ddl_table: TableInfo
    def __init__(self, tp: _Optional[_Union[BinlogType, str]] = ..., start_ts: _Optional[int] = ..., commit_ts: _Optional[int] = ..., prewrite_key: _Optional[bytes] = ..., prewrite_value: _Optional[bytes] = ..., ddl_query: _Optional[bytes] = ..., ddl_job_id: _Optional[int] = ..., ddl_table: _Optional[_Union[TableInfo, _Mapping]] = ...) -> None: ...

class PrewriteValue(_message.Message):
    __slots__ = ("schema_version", "mutations")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    MUTATIONS_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    mutations: _containers.RepeatedCompositeFieldContainer[TableMutation]
    def __init__(self, schema_version: _Optional[int] = ..., mutations: _Optional[_Iterable[_Union[TableMutation, _Mapping]]] = ...) -> None: ...

class TableMutation(_message.Message):
    __slots__ = ("table_id", "inserted_rows", "updated_rows", "deleted_rows", "sequence")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    INSERTED_ROWS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_ROWS_FIELD_NUMBER: _ClassVar[int]
    DELETED_ROWS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    inserted_rows: _containers.RepeatedScalarFieldContainer[bytes]
    updated_rows: _containers.RepeatedScalarFieldContainer[bytes]
    deleted_rows: _containers.RepeatedScalarFieldContainer[bytes]
    sequence: _containers.RepeatedScalarFieldContainer[MutationType]
    def __init__(self, table_id: _Optional[int] = ..., inserted_rows: _Optional[_Iterable[bytes]] = ..., updated_rows: _Optional[_Iterable[bytes]] = ..., deleted_rows: _Optional[_Iterable[bytes]] = ..., sequence: _Optional[_Iterable[_Union[MutationType, str]]] = ...) -> None: ...

class Datum(_message.Message):
    __slots__ = ("is_null", "int_value", "uint_value", "float_value", "decimal_value", "string_value", "bytes_value", "date_micros", "datetime_micros", "time_micros", "json_value")
    IS_NULL_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    UINT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DECIMAL_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BYTES_VALUE_FIELD_NUMBER: _ClassVar[int]
    DATE_MICROS_FIELD_NUMBER: _ClassVar[int]
    DATETIME_MICROS_FIELD_NUMBER: _ClassVar[int]
    TIME_MICROS_FIELD_NUMBER: _ClassVar[int]
    JSON_VALUE_FIELD_NUMBER: _ClassVar[int]
    is_null: bool
    int_value: int
    uint_value: int
    float_value: float
    decimal_value: str
    string_value: str
    bytes_value: bytes
    date_micros: int
    datetime_micros: int
    time_micros: int
    json_value: str
    def __init__(self, is_null: _Optional[bool] = ..., int_value: _Optional[int] = ..., uint_value: _Optional[int] = ..., float_value: _Optional[float] = ..., decimal_value: _Optional[str] = ..., string_value: _Optional[str] = ..., bytes_value: _Optional[bytes] = ..., date_micros: _Optional[int] = ..., datetime_micros: _Optional[int] = ..., time_micros: _Optional[int] = ..., json_value: _Optional[str] = ...) -> None: ...

class Column(_message.Message):
    __slots__ = ("id", "value")
    ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    id: int
    value: Datum
    def __init__(self, id: _Optional[int] = ..., value: _Optional[_Union[Datum, _Mapping]] = ...) -> None: ...

class Row(_message.Message):
    __slots__ = ("columns",)
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    columns: _containers.RepeatedCompositeFieldContainer[Column]
    def __init__(self, columns: _Optional[_Iterable[_Union[Column, _Mapping]]] = ...) -> None: ...

class UpdatedRow(_message.Message):
    __slots__ = ("old", "new")
    OLD_FIELD_NUMBER: _ClassVar[int]
    NEW_FIELD_NUMBER: _ClassVar[int]
    old: Row
    new: Row
    def __init__(self, old: _Optional[_Union[Row, _Mapping]] = ..., new: _Optional[_Union[Row, _Mapping]] = ...) -> None: ...

class ColumnInfo(_message.Message):
    __slots__ = ("id", "name", "type", "nullable", "sql_type", "default_value", "existing_value")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    NULLABLE_FIELD_NUMBER: _ClassVar[int]
    SQL_TYPE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_VALUE_FIELD_NUMBER: _ClassVar[int]
    EXISTING_VALUE_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    type: ColumnType
    nullable: bool
    sql_type: str
    default_value: ColumnDefault
    existing_value: Datum
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., type: _Optional[_Union[ColumnType, str]] = ..., nullable: _Optional[bool] = ..., sql_type: _Optional[str] = ..., default_value: _Optional[_Union[ColumnDefault, _Mapping]] = ..., existing_value: _Optional[_Union[Datum, _Mapping]] = ...) -> None: ...

class ColumnDefault(_message.Message):
    __slots__ = ("value", "expr")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPR_FIELD_NUMBER: _ClassVar[int]
    value: Datum
    expr: str
    def __init__(self, value: _Optional[_Union[Datum, _Mapping]] = ..., expr: _Optional[str] = ...) -> None: ...

class UniqueKey(_message.Message):
    __slots__ = ("name", "column_ids")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COLUMN_IDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    column_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., column_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class TableInfo(_message.Message):
    __slots__ = ("table_id", "db", "name", "columns", "primary_key", "unique_keys", "schema_version", "dropped", "previous_table_id", "next_column_id", "snapshot_pending")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    DB_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_KEY_FIELD_NUMBER: _ClassVar[int]
    UNIQUE_KEYS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_COLUMN_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_PENDING_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    db: str
    name: str
    columns: _containers.RepeatedCompositeFieldContainer[ColumnInfo]
    primary_key: _containers.RepeatedScalarFieldContainer[int]
    unique_keys: _containers.RepeatedCompositeFieldContainer[UniqueKey]
    schema_version: int
    dropped: bool
    previous_table_id: int
    next_column_id: int
    snapshot_pending: bool
    def __init__(self, table_id: _Optional[int] = ..., db: _Optional[str] = ..., name: _Optional[str] = ..., columns: _Optional[_Iterable[_Union[ColumnInfo, _Mapping]]] = ..., primary_key: _Optional[_Iterable[int]] = ..., unique_keys: _Optional[_Iterable[_Union[UniqueKey, _Mapping]]] = ..., schema_version: _Optional[int] = ..., dropped: _Optional[bool] = ..., previous_table_id: _Optional[int] = ..., next_column_id: _Optional[int] = ..., snapshot_pending: _Optional[bool] = ...) -> None: ...
