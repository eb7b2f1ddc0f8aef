"""Token-budget micro-batches: balanced, within budget, order restored, full-batch gradient kept."""

import numpy as np
import pytest
import torch

from hybridflow.algos.masked_stats import seq_mean_token_mean, token_mean
from hybridflow.data.micro_batches import (
    TokenBudgetError,
    balanced_partition,
    loss_denominators,
    restore_order,
    split_by_token_budget,
)
from hybridflow.models.loading import load_causal_lm
from hybridflow.models.log_probs import forward_log_probs
from hybridflow.protocol import DataProto

PROMPT_WIDTH, RESPONSE_WIDTH = 6, 5


@pytest.fixture(autouse=True)
def one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _rollout_batch(prompt_lengths, response_lengths, seed=0):
    """A DataProto shaped like a rollout: left-padded prompts, right-padded responses, a uid column."""
    generator = torch.Generator().manual_seed(seed)
    rows = len(prompt_lengths)
    input_ids = torch.randint(0, 256, (rows, PROMPT_WIDTH + RESPONSE_WIDTH), generator=generator)
    attention_mask = torch.zeros_like(input_ids)
    for row, (prompt, response) in enumerate(zip(prompt_lengths, response_lengths)):
        attention_mask[row, PROMPT_WIDTH - prompt : PROMPT_WIDTH + response] = 1
    return DataProto.from_dict(
        {
            "input_ids": input_ids.masked_fill(attention_mask == 0, 256),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
            "response_mask": attention_mask[:, PROMPT_WIDTH:],
            "advantages": torch.randn(rows, RESPONSE_WIDTH, generator=generator),
        },
        non_tensors={"uid": np.array([f"row{row}" for row in range(rows)], dtype=object)},
    )


def test_balanced_partition_covers_every_row_once_and_balances():
    lengths = [9, 1, 8, 2, 7, 3, 0, 0]
    groups = balanced_partition(lengths, 3)
    assert sorted(row for group in groups for row in group) == list(range(8))
    assert all(groups) and [sum(lengths[row] for row in group) for group in groups] == [10, 10, 10]
    with pytest.raises(TokenBudgetError, match="8 rows into 9"):
        balanced_partition(lengths, 9)


def test_split_respects_the_budget_with_the_fewest_micro_batches():
    batch = _rollout_batch([6, 1, 4, 2, 5, 3, 6, 1], [5, 1, 3, 5, 2, 0, 4, 2])
    lengths = batch.batch["attention_mask"].sum(-1).tolist()  # 50 tokens in all, longest row 11
    micro_batches, indices = split_by_token_budget(batch, max_token_len=17)
    assert len(micro_batches) == 3  # ceil(50 / 17)
    for micro_batch, group in zip(micro_batches, indices):
        assert int(micro_batch.batch["attention_mask"].sum()) <= 17
        assert list(micro_batch.non_tensor_batch["uid"]) == [f"row{row}" for row in group]
    assert sum(len(group) for group in indices) == len(lengths)
    assert len(split_by_token_budget(batch, max_token_len=100, min_num_micro_batches=4)[0]) == 4


def test_a_row_longer_than_the_budget_is_refused():
    with pytest.raises(TokenBudgetError, match="11 tokens.*max_token_len=10"):
        split_by_token_budget(_rollout_batch([6, 1], [5, 1]), max_token_len=10)


def test_restore_order_for_tensors_and_dataprotos():
    batch = _rollout_batch([6, 1, 4, 2, 5], [5, 1, 3, 5, 2])
    micro_batches, indices = split_by_token_budget(batch, max_token_len=12)
    assert any(group != sorted(group) or group[0] != 0 for group in indices[1:])
    outputs = [micro_batch.batch["advantages"] * 2 for micro_batch in micro_batches]
    torch.testing.assert_close(restore_order(outputs, indices), batch.batch["advantages"] * 2)
    restored = restore_order(micro_batches, indices)
    assert list(restored.non_tensor_batch["uid"]) == list(batch.non_tensor_batch["uid"])
    assert torch.equal(restored.batch["input_ids"], batch.batch["input_ids"])


@pytest.mark.parametrize("aggregate", [token_mean, seq_mean_token_mean])
def test_accumulated_micro_batch_gradient_equals_full_batch_gradient(tiny_model_dir, aggregate):
    model = load_causal_lm(tiny_model_dir)
    batch = _rollout_batch([6, 1, 4, 2, 5, 3], [5, 1, 3, 5, 2, 4])

    def loss_of(part, **denominators):
        tensors = part.batch
        log_probs, _ = forward_log_probs(
            model, tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"], RESPONSE_WIDTH
        )
        return aggregate(-tensors["advantages"] * log_probs, tensors["response_mask"], **denominators)

    loss_of(batch).backward()
    full_gradient = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    micro_batches, _ = split_by_token_budget(batch, max_token_len=20)
    assert len(micro_batches) >= 3
    denominators = loss_denominators(batch)
    for micro_batch in micro_batches:
        loss_of(micro_batch, **denominators).backward()
    for accumulated, full in zip((p.grad for p in model.parameters()), full_gradient):
        torch.testing.assert_close(accumulated, full, atol=1e-6, rtol=1e-5)
