"""Typed errors raised by DataProto; each message names the offending key and the sizes involved."""


class DataProtoError(ValueError):
    """Base class for every DataProto error."""


class LengthMismatchError(DataProtoError):
    """Two columns (or two DataProtos) that must share a batch size do not."""


class ShapeMismatchError(DataProtoError):
    """Tensors to be concatenated differ beyond the batch dimension."""


class UnionConflictError(DataProtoError):
    """A key present in both DataProtos of a union holds different values."""


class MetaInfoConflictError(DataProtoError):
    """DataProtos to be concatenated hold different values under one meta_info key (other than ``metrics``)."""


class NestedLayoutError(DataProtoError):
    """A row operation met a nested tensor whose layout torch cannot index by row (``torch.strided``)."""


class KeySetMismatchError(DataProtoError):
    """DataProtos to be concatenated do not hold the same keys."""


class NotDivisibleError(DataProtoError):
    """A batch cannot be cut into equal parts of the requested size."""


class MissingKeyError(DataProtoError, KeyError):
    """A requested key is not in the DataProto."""

    def __str__(self) -> str:
        # KeyError.__str__ would wrap the message in quotes.
        return str(self.args[0]) if self.args else ""
