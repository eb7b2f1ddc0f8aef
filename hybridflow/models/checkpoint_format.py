"""A model's tensors under the names and layout of its checkpoint files.

transformers 5 holds some families in another layout than their files: a mixture-of-experts layer's experts as
one stacked tensor per projection (``mlp.experts.gate_up_proj``: every expert's gate and up rows), where the files,
and vLLM's loaders that read them, have one tensor per expert and projection (``mlp.experts.3.gate_proj.weight``).
The way back is transformers' own, the one ``save_pretrained`` applies (``revert_weight_conversion``).
"""

from __future__ import annotations

from typing import Iterable, Iterator

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig
from transformers.core_model_loading import revert_weight_conversion


class CheckpointFormat:
    """Renames and splits ``(name, tensor)`` pairs of a causal LM of ``config`` into its files' format, one tensor
    at a time (each stacked tensor holds whole experts, so no other tensor is needed): views, no copies."""

    def __init__(self, config: PretrainedConfig):
        with torch.device("meta"):
            self._model = AutoModelForCausalLM.from_config(config)
        names = dict(self._model.state_dict())
        self.converts = revert_weight_conversion(self._model, names).keys() != names.keys()

    def __call__(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        if not self.converts:
            yield from named_tensors
            return
        for name, tensor in named_tensors:
            yield from revert_weight_conversion(self._model, {name: tensor}).items()
