"""Optional per-step extras, attached at start-up so the training step itself never checks for them.

A hook has ``after_step(global_step, batch, metrics)``; it sees the finished step's batch (prompts,
responses, scores, advantages) and its metrics, and must not change them; a hook that measures something
adds its own metrics (``hybridflow.trainer.estimator_metrics``), which are logged with the step's.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Protocol

import numpy as np

from hybridflow.protocol import DataProto


class StepHook(Protocol):
    def after_step(self, global_step: int, batch: DataProto, metrics: dict[str, float]) -> None: ...


def _plain(value: Any) -> Any:
    """A JSON-friendly copy of a numpy/torch scalar or container."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(item) for item in value]
    if hasattr(value, "item"):
        return value.item()
    return value


class RolloutDump:
    """Every ``every`` steps, ``<out_dir>/step_<N>.jsonl``: one line per sample with its prompt, response,
    score, data_source, ground truth, the prompt's ``index`` in the data set and whatever else the reward manager
    returned (verl's ``trainer.rollout_data_dir``; the index shows which prompts each step trained on)."""

    BATCH_COLUMNS = ("data_source", "reward_model", "index", "uid")

    def __init__(
        self,
        out_dir: str | pathlib.Path,
        every: int,
        tokenizer: Any,
        reward_extra_keys: tuple[str, ...] = ("acc", "pred"),
    ):
        self.out_dir = pathlib.Path(out_dir)
        self.every = every
        self.tokenizer = tokenizer
        self.reward_extra_keys = reward_extra_keys

    def after_step(self, global_step: int, batch: DataProto, metrics: dict[str, float]) -> None:
        if global_step % self.every:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tensors, columns = batch.batch, batch.non_tensor_batch
        prompts, responses = tensors["prompts"], tensors["responses"]
        prompt_mask = tensors["attention_mask"][:, : prompts.shape[-1]].bool()
        response_mask = tensors["response_mask"].bool()
        scores = tensors["token_level_scores"].sum(-1).tolist()
        with (self.out_dir / f"step_{global_step}.jsonl").open("w") as out:
            for row in range(len(batch)):
                record = {
                    "step": global_step,
                    "prompt": self.tokenizer.decode(prompts[row][prompt_mask[row]], skip_special_tokens=False),
                    "response": self.tokenizer.decode(responses[row][response_mask[row]], skip_special_tokens=True),
                    "score": scores[row],
                }
                for key in (*self.BATCH_COLUMNS, *self.reward_extra_keys):
                    if key in columns:
                        record[key] = _plain(columns[key][row])
                out.write(json.dumps(record, default=str) + "\n")
