"""RewardModelWorker: the reward model's sequence score, placed on each sample's last response token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.data.reward_model_inputs import reward_model_chat
from hybridflow.models.loading import load_tokenizer
from hybridflow.models.value_model import forward_reward_scores, load_reward_model
from hybridflow.workers import RewardModelWorker, WorkerConfigError
from hybridflow.workers.reward_model import place_on_last_response_token
from tests.float_bounds import longest_reduction, score_head_bound

from .helpers import rollout_batch

pytestmark = pytest.mark.usefixtures("process_group")


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny LM's body with a seeded random score head, saved as a reward model folder with the LM's tokenizer."""
    torch.manual_seed(0)
    model = load_reward_model(tiny_model_dir)
    folder = tmp_path_factory.mktemp("reward_model")
    model.save_pretrained(folder)
    load_tokenizer(tiny_model_dir).save_pretrained(folder)
    return folder


def test_rm_scores_equal_the_model_score_at_the_last_real_token(reward_model_dir):
    worker = RewardModelWorker(
        {"enable": True, "model": {"path": str(reward_model_dir)}, "micro_batch_size_per_gpu": 3}
    )
    worker.init_model()
    batch = rollout_batch(7, seed=8)
    rm_scores = worker.compute_rm_score(batch).batch["rm_scores"]

    model = load_reward_model(reward_model_dir)
    tensors = batch.batch
    with torch.no_grad():
        logits = model(
            input_ids=tensors["input_ids"],
            attention_mask=tensors["attention_mask"],
            position_ids=tensors["position_ids"],
        ).logits[..., 0]
    last_response_column = tensors["response_mask"].sum(dim=1) - 1
    expected = logits[torch.arange(7), tensors["prompts"].shape[1] + last_response_column]
    assert rm_scores.shape == tensors["responses"].shape
    # The worker runs the same sums in micro-batches of 3 (tests/float_bounds.py).
    bound = score_head_bound(model, longest_reduction(model.config))
    torch.testing.assert_close(rm_scores[torch.arange(7), last_response_column], expected, rtol=0, atol=bound)
    assert torch.count_nonzero(rm_scores) == 7


def test_place_on_last_response_token():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    placed = place_on_last_response_token(torch.tensor([1.0, 2.0, 3.0]), mask)
    assert torch.equal(placed, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [3.0, 0.0, 0.0]]))


def test_missing_reward_model_path_is_named():
    worker = RewardModelWorker({"enable": True})
    with pytest.raises(WorkerConfigError, match="reward_model.model.path"):
        worker.init_model()


def test_the_same_tokenizer_reads_the_policys_tokens_as_they_are(reward_model_dir, tiny_model_dir):
    config = {"enable": True, "model": {"path": str(reward_model_dir), "input_tokenizer": str(tiny_model_dir)}}
    worker = RewardModelWorker(config)
    worker.init_model()
    assert worker.switch is None


def with_raw_prompts(batch):
    """``batch`` with a ``raw_prompt`` column: one user turn per sample."""
    raw = np.empty(len(batch), dtype=object)
    raw[:] = [[{"role": "user", "content": f"What is {row}+{row}?"}] for row in range(len(batch))]
    batch.non_tensor_batch["raw_prompt"] = raw
    return batch


def test_a_reward_model_with_its_own_tokenizer_scores_the_chat_in_its_template(tiny_model_dir, tiny_reward_model_dir):
    config = {"path": str(tiny_reward_model_dir), "input_tokenizer": str(tiny_model_dir)}
    worker = RewardModelWorker({"enable": True, "model": config, "micro_batch_size_per_gpu": 2, "max_length": 64})
    worker.init_model()
    batch = with_raw_prompts(rollout_batch(5, seed=3))  # policy ids below 256: bytes
    rm_scores = worker.compute_rm_score(batch).batch["rm_scores"]

    policy, reward = load_tokenizer(tiny_model_dir), load_tokenizer(tiny_reward_model_dir)
    model = load_reward_model(tiny_reward_model_dir)
    tensors = batch.batch
    expected = []
    for row in range(5):
        response = policy.decode(tensors["responses"][row][tensors["response_mask"][row].bool()])
        text = reward_model_chat(reward, batch.non_tensor_batch["raw_prompt"][row], response)
        ids = torch.tensor([reward(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            expected.append(forward_reward_scores(model, ids, torch.ones_like(ids), torch.arange(ids.shape[1])[None]))
    last_response_column = tensors["response_mask"].sum(dim=1) - 1
    torch.testing.assert_close(rm_scores[torch.arange(5), last_response_column], torch.cat(expected), rtol=0, atol=1e-4)
    assert torch.count_nonzero(rm_scores) == 5


def test_re_tokenizing_needs_the_prompts_messages(tiny_model_dir, tiny_reward_model_dir):
    config = {"path": str(tiny_reward_model_dir), "input_tokenizer": str(tiny_model_dir)}
    worker = RewardModelWorker({"enable": True, "model": config})
    worker.init_model()
    with pytest.raises(WorkerConfigError, match="set data.return_raw_chat=true"):
        worker.compute_rm_score(rollout_batch(2))
