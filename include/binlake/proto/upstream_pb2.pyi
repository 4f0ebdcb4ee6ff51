from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TxnState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUNNING: _ClassVar[TxnState]
    COMMITTED: _ClassVar[TxnState]
    ROLLED_BACK: _ClassVar[TxnState]
RUNNING: TxnState
COMMITTED: TxnState
ROLLED_BACK: TxnState

class GetTxnStatusReq(_message.Message):
    __slots__ = ("start_ts",)
    START_TS_FIELD_NUMBER: _ClassVar[int]
    start_ts: int
    def __init__(self, start_ts: _Optional[int] = ...) -> None: ...

class GetTxnStatusResp(_message.Message):
    __slots__ = ("state", "commit_ts")
    STATE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    state: TxnState
    commit_ts: int
    def __init__(self, state: _Optional[_Union[TxnState, str]] = ..., commit_ts: _Optional[int] = ...) -> None: ...
