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
from hybridflow.protocol.parts import Part, join_parts

__all__ = [
    "DataProto",
    "DataProtoItem",
    "Part",
    "join_parts",
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
