"""``main_ppo`` scored by a learned reward model with a tokenizer and chat template of its own (the tiny reward
model): colocated and on a pool of its own on Ray, and in local mode. Every dumped sample's score is what the reward
model gives, in this process, to the sample's chat rendered by its own template; and the logged scores are those."""

import json

import pyarrow.parquet as pq
import pytest
import torch

from hybridflow.data.reward_model_inputs import reward_model_chat
from hybridflow.models.loading import load_tokenizer
from hybridflow.models.value_model import forward_reward_scores, load_reward_model
from hybridflow.tracking.trackers import read_metrics

from .cli import run_cli
from .helpers import tiny_run_overrides

STEPS = 2
MAX_LENGTH = 160  # tokens of a re-tokenized sample: room for the reward model's longer chat markup


def reward_model_overrides(model_dir, reward_model_dir, parquet, run_dir, *extra: str) -> list[str]:
    """A GRPO run of ``STEPS`` steps scored by the reward model, re-tokenizing from the policy's tokenizer, each
    step's samples dumped."""
    return tiny_run_overrides(model_dir, parquet, run_dir) + [
        f"trainer.total_training_steps={STEPS}",
        "trainer.val_before_train=false",
        f"trainer.rollout_data_dir={run_dir / 'rollouts'}",
        "reward_model.enable=true",
        f"reward_model.model.path={reward_model_dir}",
        f"reward_model.model.input_tokenizer={model_dir}",
        "reward_model.micro_batch_size_per_gpu=3",
        f"reward_model.max_length={MAX_LENGTH}",
        *extra,
    ]


def direct_scores(reward_model_dir, messages: list[list[dict]], responses: list[str]) -> torch.Tensor:
    """The reward model's score of each chat in this process, one sample at a time, as its template renders it.
    ``responses`` are the dump's text, decoded without special tokens where the worker keeps all but EOS: equal
    for these seeded runs, whose responses hold no special token but a final EOS."""
    tokenizer, model = load_tokenizer(reward_model_dir), load_reward_model(reward_model_dir)
    scores = []
    for chat, response in zip(messages, responses):
        ids = tokenizer(reward_model_chat(tokenizer, chat, response), add_special_tokens=False)["input_ids"]
        input_ids = torch.tensor([ids[:MAX_LENGTH]])
        ones = torch.ones_like(input_ids)
        with torch.no_grad():
            scores.append(forward_reward_scores(model, input_ids, ones, torch.arange(input_ids.shape[1])[None]))
    return torch.cat(scores)


def assert_scored_by_the_reward_model(run_dir, reward_model_dir, train_file):
    prompts = {row["extra_info"]["index"]: row["prompt"] for row in pq.read_table(train_file).to_pylist()}
    metrics = {record["step"]: record for record in read_metrics(run_dir)}
    assert sorted(metrics) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        samples = [json.loads(line) for line in (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
        logged = torch.tensor([sample["score"] for sample in samples])
        expected = direct_scores(
            reward_model_dir, [prompts[sample["index"]] for sample in samples], [s["response"] for s in samples]
        )
        torch.testing.assert_close(logged, expected, rtol=0, atol=1e-4)
        assert logged.std() > 0.1  # the reward model tells the samples apart
        assert metrics[step]["critic/score/mean"] == pytest.approx(logged.mean().item(), abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["colocated", "split"])
def test_ray_run_is_scored_by_the_reward_model(
    placement, tiny_model_dir, tiny_reward_model_dir, tiny_parquet, tmp_path
):
    run_dir = tmp_path / "run"
    overrides = reward_model_overrides(
        tiny_model_dir, tiny_reward_model_dir, tiny_parquet, run_dir, f"trainer.placement={placement}"
    )
    started = run_cli(overrides, tmp_path)
    pools = [line for line in started.stdout.splitlines() if line.startswith("[hybridflow] pool ")]
    own_pool = [line for line in pools if "reward_model" in line and "actor_rollout_ref" not in line]
    assert any("reward_model" in line for line in pools)  # the start-up banner: each pool and its roles
    assert len(own_pool) == (placement == "split"), pools
    assert_scored_by_the_reward_model(run_dir, tiny_reward_model_dir, tiny_parquet[0])


def test_local_run_is_scored_by_the_reward_model(tiny_model_dir, tiny_reward_model_dir, tiny_parquet, tmp_path):
    run_dir = tmp_path / "run"
    overrides = reward_model_overrides(
        tiny_model_dir, tiny_reward_model_dir, tiny_parquet, run_dir, "trainer.local_mode=true"
    )
    run_cli(overrides, tmp_path)
    assert_scored_by_the_reward_model(run_dir, tiny_reward_model_dir, tiny_parquet[0])
