"""Ulysses sequence parallelism through the whole driver on a real Ray group: two PPO steps with a critic and a
reference on 2 ranks, once data-parallel and once as one group of 2 (actor, critic and reference each split every
row in two). The steps must agree within the float32 bounds of tests/float_bounds.py: the values feed the
advantages, the reference the KL loss, and both the actor's weights. Once for the tiny model, once for a tiny
Qwen3-Next, whose linear-attention layers run their heads across the group
(``hybridflow/models/sequence_parallel_recurrent.py``) and which generates with the ``hf`` engine from the same
workers."""

import pytest
from transformers import AutoConfig

from hybridflow.tracking import metric_names as names
from tests.float_bounds import longest_reduction, reordered_sum_bound
from tests.workers.helpers import assert_same_adamw_steps, gradient_bound

from .cli import DENSE_REWARD
from .helpers import two_rank_steps
from .test_ppo_trainer import _trained_weights, log_prob_magnitude

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def linear_attention_model_dir(tmp_path_factory):
    """The tiny Qwen3-Next with dense MLPs: a router's top-k could pick another expert for rounding alone."""
    import torch
    from transformers import Qwen3NextForCausalLM

    from hybridflow.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3_next"), family="qwen3_next")
    config = AutoConfig.from_pretrained(path)
    config.mlp_only_layers = list(range(config.num_hidden_layers))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Qwen3NextForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(params=["tiny", "qwen3_next"])
def model_dir(request, tiny_model_dir):
    return tiny_model_dir if request.param == "tiny" else request.getfixturevalue("linear_attention_model_dir")


def test_ulysses_steps_equal_the_data_parallel_ones(ray_cluster, model_dir, tiny_parquet, tmp_path):
    base = two_rank_steps(model_dir, tiny_parquet, "gae", DENSE_REWARD) + [
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_coef=0.1",
        "critic.optim.lr=1e-3",
    ]
    runs = {}
    for size in (1, 2):
        sizes = [f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={size}"]
        sizes.append(f"critic.ulysses_sequence_parallel_size={size}")
        run_dir = tmp_path / str(size)
        runs[size] = _trained_weights(base + sizes + [f"trainer.default_local_dir={run_dir}"], run_dir)
    (weights, records), (expected, expected_records) = runs[2], runs[1]
    config = AutoConfig.from_pretrained(model_dir)
    num_terms = longest_reduction(config)
    log_prob_bound = reordered_sum_bound(log_prob_magnitude(expected, config), num_terms)
    for record, expected_record in zip(records, expected_records):
        assert record["actor/lr"] == expected_record["actor/lr"]
        assert record["actor/grad_norm"] > 0 and record["critic/grad_norm"] > 0
        # The advantages come from the critic's values: equal within the log-probs' bound here too, so the loss
        # differs by the advantages' size times it (the bound of test_ppo_trainer's skipping test).
        term = 1.2 * max(abs(expected_record[names.stat(names.ADVANTAGES, reduction)]) for reduction in ("max", "min"))
        pg_loss_bound = term * log_prob_bound + reordered_sum_bound(term, 64)
        assert record["actor/pg_loss"] == pytest.approx(expected_record["actor/pg_loss"], rel=0, abs=pg_loss_bound)
    grad_bound = gradient_bound(log_prob_bound, num_terms)
    assert_same_adamw_steps(weights, expected, steps=2, lr=1e-3, gradient_rel_bound=grad_bound)
