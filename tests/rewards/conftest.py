"""Fixtures for the reward tests: the tiny tokenizer and rollout-shaped batches built from response texts."""

import pytest
import torch

from hybridflow.models.loading import load_tokenizer
from hybridflow.protocol import DataProto


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def rollout_batch(tokenizer, responses, data_sources, ground_truths, response_width=None, extra_infos=None, eos=True):
    """A DataProto shaped like generate_sequences output: left-padded 3-token prompts, right-padded responses
    (each ending in EOS when ``eos``), plus the non-tensor columns a reward manager reads."""
    prompt_ids = torch.tensor([[tokenizer.pad_token_id, 65, 66]] * len(responses))
    prompt_mask = torch.tensor([[0, 1, 1]] * len(responses))
    token_lists = [
        tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if eos else [])
        for text in responses
    ]
    width = response_width or max(len(tokens) for tokens in token_lists)
    response_ids = torch.full((len(responses), width), tokenizer.pad_token_id)
    response_mask = torch.zeros((len(responses), width), dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        tokens = tokens[:width]
        response_ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        response_mask[row, : len(tokens)] = 1
    return DataProto.from_dict(
        {
            "prompts": prompt_ids,
            "responses": response_ids,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        },
        {
            "data_source": list(data_sources),
            "reward_model": [{"style": "rule", "ground_truth": truth} for truth in ground_truths],
            "extra_info": list(extra_infos or [{"index": i} for i in range(len(responses))]),
        },
    )
