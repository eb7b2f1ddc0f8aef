"""Validation samples as text: verl's choice of the logged samples and its jsonl dump."""

import json

import numpy as np
import torch

from hybridflow.protocol import DataProto
from hybridflow.trainer.val_generations import ValidationGenerations

PAD = 0


class CharTokenizer:
    """Token id ``i`` is ``chr(i)``; id 0 is the special padding token."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == PAD))


def _batch(prompts, responses, scores, ground_truths):
    """Left-padded prompts and right-padded responses of ``width`` 3, the score on the first response token."""

    def pad(texts, left):
        rows = [[ord(ch) for ch in text] for text in texts]
        return torch.tensor([[PAD] * (3 - len(r)) + r if left else r + [PAD] * (3 - len(r)) for r in rows])

    prompt_ids, response_ids = pad(prompts, left=True), pad(responses, left=False)
    scores_tensor = torch.zeros(len(scores), 3)
    scores_tensor[:, 0] = torch.tensor(scores)
    return DataProto.from_dict(
        {
            "prompts": prompt_ids,
            "responses": response_ids,
            "input_ids": torch.cat([prompt_ids, response_ids], 1),
            "attention_mask": torch.cat([prompt_ids, response_ids], 1).ne(PAD).long(),
            "token_level_scores": scores_tensor,
        },
        non_tensors={"reward_model": np.array([{"ground_truth": gt} for gt in ground_truths], dtype=object)},
    )


def _generations():
    generations = ValidationGenerations(CharTokenizer())
    generations.add(_batch(["cc", "a"], ["x", "yy"], [1.0, 0.0], ["1", "2"]), {"acc": [1.0, 0.0]})
    generations.add(_batch(["bbb"], ["zzz"], [0.5], ["3"]), {"acc": [0.5]})
    return generations


def test_texts_drop_the_padding():
    assert _generations().texts() == (["cc", "a", "bbb"], ["x", "yy", "zzz"], [1.0, 0.0, 0.5])


def test_the_table_takes_verls_samples_sorted_by_input_then_shuffled_with_seed_42():
    by_input = [("a", "yy", 0.0), ("bbb", "zzz", 0.5), ("cc", "x", 1.0)]
    shuffled = [by_input[index] for index in np.random.RandomState(42).permutation(3)]
    assert _generations().table(2) == shuffled[:2]
    assert _generations().table(10) == shuffled  # fewer samples than asked: all of them


def test_the_dump_writes_verls_fields_one_line_per_sample(tmp_path):
    path = _generations().dump(tmp_path / "val", step=7)
    assert path == tmp_path / "val" / "7.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {"input": "cc", "output": "x", "gts": "1", "score": 1.0, "step": 7, "reward": 1.0, "acc": 1.0}
    assert [line["input"] for line in lines] == ["cc", "a", "bbb"] and [line["gts"] for line in lines] == [
        "1",
        "2",
        "3",
    ]
