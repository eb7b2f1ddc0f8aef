"""The reference part through ActorRolloutRefWorker (role ``ref``): its own micro-batching keys."""

from __future__ import annotations

import pytest
import torch

from hybridflow.workers import ref as ref_module

from .helpers import rollout_batch
from .test_actor import LOG_PROB_ATOL, count_forwards, make_worker

pytestmark = pytest.mark.usefixtures("process_group")


@pytest.mark.parametrize(
    "ref_keys, rows",
    [
        ({"log_prob_micro_batch_size_per_gpu": 3}, [3, 3, 2]),
        ({"log_prob_micro_batch_size_per_gpu": None, "log_prob_micro_batch_size": 4}, [4, 4]),  # global form, 1 rank
        ({"log_prob_use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": 24}, None),
    ],
    ids=["per-gpu-3", "global-4", "token-budget-24"],
)
def test_reference_log_probs_take_the_ref_micro_batching_and_do_not_depend_on_it(
    tiny_model_dir, monkeypatch, ref_keys, rows
):
    batch = rollout_batch(8, seed=0)
    calls = count_forwards(monkeypatch, ref_module)
    # Neither the actor's nor the rollout's micro-batch keys reach the reference pass.
    whole = make_worker(
        tiny_model_dir,
        role="ref",
        ref={"log_prob_micro_batch_size_per_gpu": 8},
        actor={"ppo_micro_batch_size_per_gpu": 1},
        rollout={"log_prob_micro_batch_size_per_gpu": 1},
    )
    expected = whole.compute_ref_log_prob(batch).batch["ref_log_prob"]
    assert [count for count, _ in calls] == [8]
    calls.clear()
    log_probs = make_worker(tiny_model_dir, role="ref", ref=ref_keys).compute_ref_log_prob(batch).batch["ref_log_prob"]
    if rows is None:  # a token budget: as few forwards as hold at most 24 real tokens each
        total = sum(tokens for _, tokens in calls)
        assert len(calls) >= -(-total // 24) > 1 and max(tokens for _, tokens in calls) <= 24
    else:
        assert [count for count, _ in calls] == rows
    torch.testing.assert_close(log_probs, expected, rtol=0, atol=LOG_PROB_ATOL)
