"""Which exact shortcuts a config takes, and the one-line error when one is forced on where it is not exact."""

import pytest

from hybridflow.config.exact_skips import (
    old_log_prob_skip_blockers,
    skips_old_log_prob,
    skips_zero_signal_samples,
    zero_signal_skip_blockers,
)
from hybridflow.config.load import load_config
from hybridflow.config.phases import OLD_FROM_UPDATE
from hybridflow.config.plan import build_plan
from tests.trainer.helpers import compose_config, config_errors

ONE_MINI_BATCH = "actor_rollout_ref.actor.ppo_mini_batch_size=4"  # = data.train_batch_size of the base run


def _config(base, *overrides):
    return load_config(compose_config(base + list(overrides)))


def test_a_grpo_step_of_one_mini_batch_takes_both_shortcuts(base):
    config = _config(base, ONE_MINI_BATCH)
    assert skips_old_log_prob(config) and skips_zero_signal_samples(config)
    plan = build_plan(config, train_prompts=16)
    assert plan.old_log_probs == OLD_FROM_UPDATE and plan.skip_zero_signal
    assert not plan.phases["old_log_prob"].runs and "skip 3 to 7" in plan.phases["adv"].why


def test_several_mini_batches_block_both(base):
    config = _config(base)  # mini-batches of 2 prompts out of 4
    assert not skips_old_log_prob(config) and not skips_zero_signal_samples(config)
    assert old_log_prob_skip_blockers(config) == [
        "actor_rollout_ref.actor.ppo_mini_batch_size=2 < data.train_batch_size=4 takes several optimizer steps per "
        "batch"
    ]


@pytest.mark.parametrize(
    ("override", "old_log_prob", "zero_signal"),
    [
        ("actor_rollout_ref.actor.ppo_epochs=2", False, True),
        ("algorithm.use_kl_in_reward=true", False, False),
        ("actor_rollout_ref.actor.use_kl_loss=true", True, False),
        ("actor_rollout_ref.actor.entropy_coeff=0.01", True, False),
        ("algorithm.adv_estimator=gae", True, False),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov", True, False),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov", True, False),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=gspo", True, True),
        ("algorithm.adv_estimator=rloo", True, True),
        ("algorithm.filter_groups.enable=true", True, True),
        ("actor_rollout_ref.actor.skip_old_log_prob=false", False, True),
        ("algorithm.skip_zero_signal_samples=false", True, False),
    ],
)
def test_each_term_that_sees_every_sample_blocks_its_shortcut(base, override, old_log_prob, zero_signal):
    config = _config(base, ONE_MINI_BATCH, override)
    assert skips_old_log_prob(config) == old_log_prob
    assert skips_zero_signal_samples(config) == zero_signal


def test_the_engines_log_probs_beside_an_old_log_prob_pass_block_the_zero_signal_skip(base):
    """Phase 5 then compares every sample's old log-probs with the engine's (the mismatch metrics), so it cannot
    run first on the scores alone; without the pass (an on-policy update) there is nothing to compare."""
    engine = "actor_rollout_ref.rollout.calculate_log_probs=true"
    config = _config(base, ONE_MINI_BATCH, engine, "actor_rollout_ref.actor.ppo_epochs=2")
    assert not skips_old_log_prob(config) and not skips_zero_signal_samples(config)
    assert zero_signal_skip_blockers(config)[-1].startswith(f"{engine} compares every sample's old_log_probs")
    assert skips_zero_signal_samples(_config(base, ONE_MINI_BATCH, engine))


@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_the_optimal_token_baseline_needs_every_samples_log_prob_pass(base, estimator):
    sum_pi_squared = "actor_rollout_ref.actor.calculate_sum_pi_squared=true"
    config = _config(base, ONE_MINI_BATCH, f"algorithm.adv_estimator={estimator}", sum_pi_squared)
    reads = f"algorithm.adv_estimator={estimator} reads old_log_probs and sum_pi_squared of every sample"
    assert reads in old_log_prob_skip_blockers(config) and reads in zero_signal_skip_blockers(config)
    assert not skips_old_log_prob(config) and not skips_zero_signal_samples(config)
    # sum_pi_squared alone (for the variance_proxy metrics) also needs the pass on every sample
    config = _config(base, ONE_MINI_BATCH, sum_pi_squared)
    assert not skips_old_log_prob(config) and not skips_zero_signal_samples(config)


def test_forcing_a_shortcut_where_it_is_not_exact_is_one_error_naming_the_key_and_why(base):
    (error,) = config_errors(base + ["actor_rollout_ref.actor.skip_old_log_prob=true"])
    assert error.startswith("actor_rollout_ref.actor.skip_old_log_prob=true is not exact here: ")
    assert "ppo_mini_batch_size=2 < data.train_batch_size=4" in error and "\n" not in error
    (error,) = config_errors(
        base + [ONE_MINI_BATCH, "algorithm.skip_zero_signal_samples=true", "actor_rollout_ref.actor.use_kl_loss=true"]
    )
    assert error == (
        "algorithm.skip_zero_signal_samples=true is not exact here: actor_rollout_ref.actor.use_kl_loss=true adds a "
        "KL loss on every sample; set it to null (skip only where exact) or false"
    )


def test_forcing_a_shortcut_where_it_is_exact_or_leaving_it_null_is_no_error(base):
    forced = _config(
        base,
        ONE_MINI_BATCH,
        "actor_rollout_ref.actor.skip_old_log_prob=true",
        "algorithm.skip_zero_signal_samples=true",
    )
    assert skips_old_log_prob(forced) and skips_zero_signal_samples(forced)
    assert zero_signal_skip_blockers(_config(base, "actor_rollout_ref.actor.use_kl_loss=true"))
