"""A validation's samples as text: the table ``trainer.log_val_generations`` logs and the jsonl files
``trainer.validation_data_dir`` receives (verl's ``_maybe_log_val_generations`` and ``_dump_generations``).

:class:`ValidationGenerations` keeps each scored validation batch as it comes; the decoding to text happens
only when a table or a dump asks for it.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from hybridflow.protocol import DataProto

# verl's fixed seed for the shuffle that picks the logged samples: the same prompts every validation.
TABLE_SEED = 42


class ValidationGenerations:
    """The scored samples of one validation: ``prompts``, ``responses``, ``attention_mask``,
    ``token_level_scores`` and the reward manager's extra values of every batch."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.batches: list[tuple[DataProto, dict[str, list]]] = []

    def add(self, batch: DataProto, reward_extra_infos: dict[str, list] | None) -> None:
        self.batches.append((batch, dict(reward_extra_infos or {})))

    def texts(self) -> tuple[list[str], list[str], list[float]]:
        """Prompt text, response text (special tokens dropped, as verl decodes them) and score per sample."""
        inputs, outputs, scores = [], [], []
        for batch, _ in self.batches:
            tensors = batch.batch
            prompt_length = tensors["prompts"].shape[-1]
            real = tensors["attention_mask"].bool()
            sequences = tensors["input_ids"]
            inputs += [self._decode(row[:prompt_length][mask[:prompt_length]]) for row, mask in zip(sequences, real)]
            outputs += [self._decode(row[prompt_length:][mask[prompt_length:]]) for row, mask in zip(sequences, real)]
            scores += tensors["token_level_scores"].sum(-1).tolist()
        return inputs, outputs, scores

    def _decode(self, token_ids: Any) -> str:
        return self.tokenizer.decode(token_ids.tolist(), skip_special_tokens=True)

    def table(self, count: int) -> list[tuple[str, str, float]]:
        """``count`` (input, output, score) rows, chosen as verl chooses them: the samples sorted by input,
        shuffled by a ``RandomState(42)``, the first ``count`` taken."""
        samples = sorted(zip(*self.texts()), key=lambda sample: sample[0])
        np.random.RandomState(TABLE_SEED).shuffle(samples)
        return [tuple(sample) for sample in samples[:count]]

    def dump(self, out_dir: str | pathlib.Path, step: int) -> pathlib.Path:
        """``<out_dir>/<step>.jsonl``, one line per sample with verl's fields: ``input``, ``output``, ``gts``
        (the ground truth), ``score``, ``step``, ``reward`` (the score again) and the reward manager's extras."""
        inputs, outputs, scores = self.texts()
        ground_truths, extras = [], {"reward": list(scores)}
        for batch, batch_extras in self.batches:
            reward_models = batch.non_tensor_batch.get("reward_model", [None] * len(batch))
            ground_truths += [_ground_truth(reward_model) for reward_model in reward_models]
            for key, values in batch_extras.items():
                extras.setdefault(key, []).extend(np.asarray(values).tolist())
        count = len(scores)
        columns = {"input": inputs, "output": outputs, "gts": ground_truths, "score": scores, "step": [step] * count}
        # An extra some batch lacked cannot be lined up with the samples: left out, as verl does.
        columns |= {key: values for key, values in extras.items() if len(values) == count}
        path = pathlib.Path(out_dir) / f"{step}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as out:
            for row in range(count):
                record = {key: values[row] for key, values in columns.items()}
                out.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        return path


def _ground_truth(reward_model: Any) -> Any:
    return reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
