"""A KV cache whose layers keep room for the next tokens, so a decode step writes one column in place.

transformers' ``DynamicLayer`` appends by ``torch.cat``, copying the whole cache on every decode step (the
largest op after the matmuls in a profile of bench_vs_trl's decode steps; its wall-time share is smaller).
``RoomyLayer`` holds each layer's keys and values in buffers with ``headroom`` spare columns; ``keys``/``values``
are views of the filled part, so the model's attention reads them as it reads a ``DynamicLayer``'s.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class RoomyLayer(DynamicLayer):
    """A ``DynamicLayer`` over buffers of shape [b, heads, filled + room, d]."""

    def __init__(self, headroom: int):
        super().__init__()
        self.headroom = headroom
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        filled, new = self.get_seq_length(), key_states.shape[-2]
        if self._key_buffer is None or filled + new > self._key_buffer.shape[-2]:
            self._key_buffer = _with_room(key_states, self.keys, filled, new + self.headroom)
            self._value_buffer = _with_room(value_states, self.values, filled, new + self.headroom)
        self._key_buffer[:, :, filled : filled + new] = key_states
        self._value_buffer[:, :, filled : filled + new] = value_states
        self._show(filled + new)
        return self.keys, self.values

    def set_states(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold copies of ``keys``/``values`` [b, heads, T, d], with ``headroom`` spare columns."""
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        filled = keys.shape[-2]
        self._key_buffer = _with_room(keys, keys, filled, self.headroom)
        self._value_buffer = _with_room(values, values, filled, self.headroom)
        self._show(filled)

    def reorder_cache(self, indices: torch.Tensor) -> None:
        filled = self.get_seq_length()
        if filled > 0:
            self._key_buffer, self._value_buffer = self._key_buffer[indices], self._value_buffer[indices]
            self._show(filled)

    def drop_left(self, columns: int) -> None:
        """Forget the first ``columns`` positions (padding for every row); the buffers keep their spare room."""
        filled = self.get_seq_length()
        self._key_buffer = self._key_buffer[:, :, columns:]
        self._value_buffer = self._value_buffer[:, :, columns:]
        self._show(filled - columns)

    def _show(self, filled: int) -> None:
        self.keys = self._key_buffer[:, :, :filled]
        self.values = self._value_buffer[:, :, :filled]


def _with_room(like: torch.Tensor, states: torch.Tensor, filled: int, room: int) -> torch.Tensor:
    """A buffer shaped as ``like`` but ``filled + room`` long in time, starting with ``states``' first columns."""
    buffer = like.new_empty(*like.shape[:2], filled + room, like.shape[-1])
    if filled:
        buffer[:, :, :filled] = states[:, :, :filled]
    return buffer


def roomy_cache(model_config, headroom: int) -> DynamicCache | None:
    """A ``DynamicCache`` for ``model_config`` of ``RoomyLayer``s, or None when a layer is not a plain
    ``DynamicLayer`` (sliding windows and other kinds keep transformers' own layers)."""
    cache = DynamicCache(config=model_config)
    if not all(type(layer) is DynamicLayer for layer in cache.layers):
        return None
    cache.layers = [RoomyLayer(headroom) for _ in cache.layers]
    return cache


def cache_bytes(cache: DynamicCache) -> int:
    """Bytes the cache's key and value tensors hold (a ``RoomyLayer`` counts its spare room)."""
    tensors = [
        tensor
        for layer in cache.layers
        for tensor in (
            (layer._key_buffer, layer._value_buffer) if isinstance(layer, RoomyLayer) else (layer.keys, layer.values)
        )
        if tensor is not None
    ]
    return sum(t.numel() * t.element_size() for t in tensors)
