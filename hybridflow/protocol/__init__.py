"""The data protocol between the driver and the worker groups: ``DataProto`` (see data_proto.py)."""

from hybridflow.protocol.data_proto import DataProto, DataProtoItem
from hybridflow.protocol.errors import (
    DataProtoError,
    KeySetMismatchError,
    LengthMismatchError,
    MetaInfoConflictError,
    MissingKeyError,
    NestedLayoutError,
    NotDivisibleError,
    ShapeMismatchError,
    UnionConflictError,
)

__all__ = [
    "DataProto",
    "DataProtoItem",
    "DataProtoError",
    "KeySetMismatchError",
    "LengthMismatchError",
    "MetaInfoConflictError",
    "MissingKeyError",
    "NestedLayoutError",
    "NotDivisibleError",
    "ShapeMismatchError",
    "UnionConflictError",
]
