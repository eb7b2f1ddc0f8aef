"""Batches whose prompts were padded to different widths join once each is left-padded to the widest."""

import numpy as np
import torch

from hybridflow.data.collate import collate_to_dataproto
from hybridflow.protocol import DataProto
from hybridflow.protocol.prompt_padding import concat_left_padded
from hybridflow.rollout.sequences import pack_outputs

PAD = 0


def _prompts(*token_lists):
    return collate_to_dataproto([{"input_ids": torch.tensor(ids)} for ids in token_lists], pad_token_id=PAD)


def _samples(prompts: DataProto, responses: list[list[int]]) -> DataProto:
    outputs = [(ids, [1] * len(ids), [-0.5] * len(ids)) for ids in responses]
    tensors = pack_outputs(prompts.batch, outputs, 1, 4, PAD, True)
    return DataProto.from_dict(tensors, non_tensors={"uid": np.array([str(r) for r in responses], dtype=object)})


def test_prompts_and_samples_of_different_widths_join_as_if_collated_together():
    short, long = _prompts([5, 6]), _prompts([7, 8, 9, 10], [11])
    joined = concat_left_padded([short, long], PAD)
    together = _prompts([5, 6], [7, 8, 9, 10], [11])
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert torch.equal(joined.batch[key], together.batch[key]), key
    samples = concat_left_padded([_samples(short, [[20, 21]]), _samples(long, [[22], [23, 24, 25]])], PAD)
    expected = _samples(together, [[20, 21], [22], [23, 24, 25]])
    assert set(samples.batch.keys()) == set(expected.batch.keys())
    for key in expected.batch.keys():
        assert torch.equal(samples.batch[key], expected.batch[key]), key
    assert list(samples.non_tensor_batch["uid"]) == list(expected.non_tensor_batch["uid"])
