"""RewardModelWorker: the reward model's sequence score, placed on each sample's last response token."""

from __future__ import annotations

import pytest
import torch

from hybridflow.models.value_model import load_reward_model
from hybridflow.workers import RewardModelWorker, WorkerConfigError
from hybridflow.workers.reward_model import place_on_last_response_token
from tests.float_bounds import longest_reduction, score_head_bound

from .helpers import rollout_batch

pytestmark = pytest.mark.usefixtures("process_group")


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny LM's body with a seeded random score head, saved as a reward model folder."""
    torch.manual_seed(0)
    model = load_reward_model(tiny_model_dir)
    folder = tmp_path_factory.mktemp("reward_model")
    model.save_pretrained(folder)
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
