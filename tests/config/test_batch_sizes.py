"""Batch-size rules: verl's deprecated global micro-batch keys beside their ``*_per_gpu`` forms."""

from hybridflow.config.batch_sizes import micro_batch_sizes
from hybridflow.config.load import load_config
from hybridflow.config.plan import describe
from tests.trainer.helpers import compose_config, config_errors, plan_of

ROLLOUT = "actor_rollout_ref.rollout"


def test_global_micro_batch_keys_are_divided_over_the_ranks(base):
    overrides = base + [
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
        "actor_rollout_ref.actor.ppo_micro_batch_size=4",
        f"{ROLLOUT}.log_prob_micro_batch_size=6",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=5",
    ]
    config = load_config(compose_config(overrides))
    sizes, errors = micro_batch_sizes(config.actor_rollout_ref, config.critic, world=2)
    assert errors == []
    assert sizes["actor_rollout_ref.actor.ppo_micro_batch_size"] == 2  # 4 samples over 2 ranks
    assert sizes[f"{ROLLOUT}.log_prob_micro_batch_size"] == 3
    assert sizes["actor_rollout_ref.ref.log_prob_micro_batch_size"] == 5  # the per-rank form as given
    assert sizes["critic.forward_micro_batch_size"] is None


def test_a_global_key_beside_its_per_gpu_form_or_below_one_sample_per_rank_is_refused(base):
    errors = config_errors(
        base
        + [
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size=4",
            f"{ROLLOUT}.log_prob_micro_batch_size=1",
            "critic.ppo_micro_batch_size=0",
        ]
    )
    assert errors == [
        "both actor_rollout_ref.actor.ppo_micro_batch_size=4 and actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"
        " are set; remove actor_rollout_ref.actor.ppo_micro_batch_size (the deprecated global form)",
        f"{ROLLOUT}.log_prob_micro_batch_size=1 gives each of the 2 ranks less than one sample; set it to at least 2"
        f" or use {ROLLOUT}.log_prob_micro_batch_size_per_gpu",
        "critic.ppo_micro_batch_size=0 must be a positive integer (or null)",
    ]


def test_the_global_form_is_checked_against_the_mini_batch_like_the_per_gpu_one(base):
    errors = config_errors(
        base
        + [
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
            "actor_rollout_ref.actor.ppo_micro_batch_size=3",
        ]
    )
    assert len(errors) == 1 and "=3 does not divide the 4 samples per rank of a mini-batch" in errors[0]


def test_derived_sizes_name_the_old_log_prob_and_reference_micro_batches(base):
    overrides = base + [
        f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=99",
    ]
    lines = describe(plan_of(overrides))
    assert "old-log-prob micro-batches: 4 samples per rank" in lines
    assert "reference micro-batches: by token budget 99 per rank" in lines
