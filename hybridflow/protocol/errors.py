"""Typed errors raised by DataProto; each message names the offending key and the sizes involved."""


class DataProtoError(ValueError):
    """Base class for every DataProto error."""


class LengthMismatchError(DataProtoError):
    """Two columns (or two DataProtos) that must share a batch size do not."""


class ShapeMismatchError(DataProtoError):
    """Tensors to be concatenated differ beyond the batch dimension."""


class UnionConflictError(DataProtoError):
    """A key present in both DataProtos of a union holds different values."""


class KeySetMismatchError(DataProtoError):
    """DataProtos to be concatenated do not hold the same keys."""


class NotDivisibleError(DataProtoError):
    """A batch cannot be cut into equal parts of the requested size."""


class MissingKeyError(DataProtoError, KeyError):
    """A requested key is not in the DataProto."""

    def __str__(self) -> str:
        # KeyError.__str__ would wrap the message in quotes.
        return str(self.args[0]) if self.args else ""
