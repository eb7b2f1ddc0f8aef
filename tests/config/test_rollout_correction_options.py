"""``algorithm.rollout_correction``: verl's keys reach the schema, every bad value is one line naming the key,
and the corrections switch off the exact shortcuts they would make inexact."""

import pytest

from hybridflow.algos import BypassCorrection, CorrectionSettings, RejectionBound, WeightBounds
from hybridflow.config.exact_skips import skips_old_log_prob, skips_zero_signal_samples
from hybridflow.config.load import load_config
from hybridflow.config.plan import build_plan
from hybridflow.config.rollout_correction_options import bypass_correction, correction_settings
from tests.trainer.helpers import compose_config, config_errors

KEY = "algorithm.rollout_correction"
ENGINE_LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs=true"
ONE_MINI_BATCH = "actor_rollout_ref.actor.ppo_mini_batch_size=4"  # on-policy: both exact shortcuts apply


def _config(base, *overrides):
    return load_config(compose_config(base + list(overrides)))


def test_verls_defaults_correct_nothing(base):
    config = _config(base)
    assert correction_settings(config) == CorrectionSettings()
    assert bypass_correction(config) is None


def test_verls_multi_rs_script_settings_parse(base):
    # examples/rollout_correction/run_qwen2_5_7b_fsdp_multi_rs.sh quotes both strings for Hydra
    config = _config(
        base,
        ENGINE_LOG_PROBS,
        f"{KEY}.rollout_is=token",
        f"{KEY}.rollout_rs='token_k1,seq_max_k2'",
        f"{KEY}.rollout_rs_threshold='0.6_1.6,2.5'",
        f"{KEY}.bypass_mode=true",
        f"{KEY}.loss_type=ppo_clip",
    )
    settings = CorrectionSettings(
        "token", WeightBounds(2.0), False, (RejectionBound("token_k1", 1.6, 0.6), RejectionBound("seq_max_k2", 2.5))
    )
    assert bypass_correction(config) == BypassCorrection(settings, "ppo_clip")


def test_the_rloo_script_settings_parse(base):
    config = _config(
        base,
        ENGINE_LOG_PROBS,
        "algorithm.adv_estimator=rloo",
        f"{KEY}.rollout_is=sequence",
        f"{KEY}.rollout_is_threshold=2.0",
        f"{KEY}.rollout_is_batch_normalize=true",
        f"{KEY}.rollout_rs=null",
        f"{KEY}.rollout_rs_threshold=null",
        f"{KEY}.bypass_mode=true",
        f"{KEY}.loss_type=reinforce",
    )
    assert bypass_correction(config) == BypassCorrection(
        CorrectionSettings("sequence", WeightBounds(2.0), True), "reinforce"
    )
    old_log_prob = build_plan(config, train_prompts=16).phases["old_log_prob"]
    assert not old_log_prob.runs and old_log_prob.why.startswith("algorithm.rollout_correction.bypass_mode=true")


@pytest.mark.parametrize(
    "overrides, error",
    [
        (
            [f"{KEY}.rollout_is=token"],
            f"{KEY}.rollout_is='token' needs the rollout engine's token log-probs; "
            "set actor_rollout_ref.rollout.calculate_log_probs=true",
        ),
        (
            [f"{KEY}.rollout_rs=token_k1", f"{KEY}.rollout_rs_threshold=2.0", f"{KEY}.bypass_mode=true"],
            f"{KEY}.rollout_rs='token_k1' and bypass_mode=true needs the rollout engine's token log-probs; "
            "set actor_rollout_ref.rollout.calculate_log_probs=true",
        ),
        (
            [ENGINE_LOG_PROBS, f"{KEY}.rollout_is=geometric"],
            f"{KEY}.rollout_is='geometric' must be one of ['token', 'sequence'] or null",
        ),
        (
            [ENGINE_LOG_PROBS, f"{KEY}.rollout_is=token", f"{KEY}.rollout_is_threshold=-1"],
            f"{KEY}.rollout_is_threshold='-1' must be > 0",
        ),
        (
            [ENGINE_LOG_PROBS, f"{KEY}.rollout_rs=token_k2"],
            f"{KEY}.rollout_rs_threshold=None must be set for rollout_rs='token_k2': a number or a string with one "
            "entry per option (e.g. '0.6_1.6,2.5')",
        ),
        (
            [f"{KEY}.rollout_is_threshold=5.0"],
            f"{KEY}.rollout_is_threshold is read only with {KEY}.rollout_is; set rollout_is or remove it",
        ),
        (
            [f"{KEY}.rollout_rs_threshold=2.0"],
            f"{KEY}.rollout_rs_threshold is read only with {KEY}.rollout_rs; set rollout_rs or remove it",
        ),
        (
            [f"{KEY}.loss_type=reinforce"],
            f"{KEY}.loss_type='reinforce' is read only in bypass mode; set {KEY}.bypass_mode=true or remove it",
        ),
        (
            [ENGINE_LOG_PROBS, f"{KEY}.bypass_mode=true", f"{KEY}.loss_type=ppo"],
            f"{KEY}.loss_type='ppo' is not one of [ppo_clip, reinforce]",
        ),
        (
            [f"{KEY}.rollout_is_batch_normalize=true"],
            f"{KEY}.rollout_is_batch_normalize=true normalises importance weights, but {KEY}.rollout_is is null; "
            "set rollout_is=token or sequence, or remove it",
        ),
        (
            [ENGINE_LOG_PROBS, f"{KEY}.bypass_mode=true", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"],
            f"{KEY}.bypass_mode=true trains with its loss_type (ppo_clip), not "
            "actor_rollout_ref.actor.policy_loss.loss_mode='gspo'; set loss_mode=vanilla",
        ),
    ],
)
def test_each_bad_setting_is_one_line_naming_the_key(base, overrides, error):
    assert config_errors(base + overrides) == [error]


def test_decoupled_correction_needs_every_samples_old_log_probs(base):
    config = _config(base, ONE_MINI_BATCH, ENGINE_LOG_PROBS, f"{KEY}.rollout_is=token")
    assert not skips_old_log_prob(config) and not skips_zero_signal_samples(config)
    # The mismatch metrics alone do not block the shortcuts: they are logged where the pass runs.
    config = _config(base, ONE_MINI_BATCH, ENGINE_LOG_PROBS)
    assert skips_old_log_prob(config) and skips_zero_signal_samples(config)
    errors = config_errors(
        base
        + [
            ONE_MINI_BATCH,
            ENGINE_LOG_PROBS,
            f"{KEY}.rollout_is=token",
            "actor_rollout_ref.actor.skip_old_log_prob=true",
        ]
    )
    assert errors == [
        "actor_rollout_ref.actor.skip_old_log_prob=true is not exact here: algorithm.rollout_correction "
        "(rollout_is/rollout_rs) weighs and masks every sample by old_log_probs; set it to null (skip only where "
        "exact) or false"
    ]


def test_bypass_mode_has_no_pass_to_skip_and_keeps_every_sample(base):
    config = _config(base, ONE_MINI_BATCH, ENGINE_LOG_PROBS, f"{KEY}.bypass_mode=true")
    assert not skips_old_log_prob(config) and not skips_zero_signal_samples(config)
