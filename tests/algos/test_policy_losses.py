import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

import hybridflow.algos  # noqa: F401  (registers every loss)
from hybridflow.algos.masked_stats import LOSS_AGG_MODES
from hybridflow.algos.policy_losses import (
    POLICY_LOSSES,
    PolicyLossConfig,
    PolicyLossConfigError,
    PolicyLossModeConfig,
    aggregate_policy_loss,
    compute_policy_loss_cispo,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gspo,
    compute_policy_loss_reinforce,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    loss_metrics,
    register_policy_loss,
)
from hybridflow.registry import DuplicateNameError, UnknownNameError

LN = math.log


def _ppo_tokens():
    """Four masked-in tokens covering every PPO branch, plus one masked token holding garbage."""
    ratios = [1.5, 0.5, 0.5, 5.0]
    log_prob = torch.tensor([[LN(r) for r in ratios] + [30.0]])
    old_log_prob = torch.zeros(1, 5)
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1e6]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    return old_log_prob, log_prob, advantages, mask


def test_vanilla_ppo_dual_clip_hand_case():
    old_log_prob, log_prob, advantages, mask = _ppo_tokens()
    loss, metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, mask, config=PolicyLossConfig())
    # A=+1 r=1.5 -> -1.2 (clipped); A=+1 r=0.5 -> -0.5; A=-1 r=0.5 -> 0.8 (clipped); A=-1 r=5 -> 3 (dual clip)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 3.0) / 4)
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(0.25)
    assert metrics["ppo_kl"] == pytest.approx(-0.157152, abs=1e-6)


def test_vanilla_asymmetric_clip_higher():
    old_log_prob, log_prob, advantages, mask = _ppo_tokens()
    config = PolicyLossConfig(clip_ratio_high=0.28)
    loss, _ = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, mask, config=config)
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 3.0) / 4)


def _resolved(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, policy_loss=None, **actor_keys):
    """``PolicyLossConfig.resolve`` from actor keys as the actor section holds them (verl's defaults)."""
    keys = dict(clip_ratio_c=3.0, loss_agg_mode="token-mean", loss_scale_factor=None, **actor_keys)
    mode = policy_loss or PolicyLossModeConfig()
    return PolicyLossConfig.resolve(mode, clip_ratio, clip_ratio_low, clip_ratio_high, **keys)


def test_vanilla_none_bounds_fall_back_to_clip_ratio():
    old_log_prob, log_prob, advantages, mask = _ppo_tokens()
    config = _resolved(clip_ratio=0.1)
    assert (config.clip_ratio_low, config.clip_ratio_high) == (0.1, 0.1)
    loss, _ = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, mask, config=config)
    assert loss.item() == pytest.approx((-1.1 - 0.5 + 0.9 + 3.0) / 4)


def test_vanilla_rollout_is_weights_multiply_the_token_loss():
    old_log_prob, log_prob, advantages, mask = _ppo_tokens()
    weights = torch.tensor([[2.0, 1.0, 1.0, 0.5, 7.0]])
    loss, _ = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, mask, rollout_is_weights=weights)
    assert loss.item() == pytest.approx((-2.4 - 0.5 + 0.8 + 1.5) / 4)


def test_vanilla_clamps_log_ratio_at_twenty():
    loss, _ = compute_policy_loss_vanilla(
        torch.zeros(1, 1),
        torch.tensor([[50.0]]),
        torch.tensor([[1.0]]),
        torch.ones(1, 1),
        config=PolicyLossConfig(clip_ratio_low=1.0, clip_ratio_high=1e9),
    )
    assert loss.item() == pytest.approx(-math.exp(20.0), rel=1e-5)


def test_dual_clip_bound_not_above_one_is_refused_by_the_config():
    with pytest.raises(PolicyLossConfigError, match="clip_ratio_c=1.0 must be > 1"):
        PolicyLossConfig(clip_ratio_c=1.0)


def test_gspo_sequence_ratio_hand_case_and_token_gradient():
    log_prob = torch.tensor([[LN(2.0), LN(2.0)], [LN(0.25), 9.0]])
    advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, metrics = compute_policy_loss_gspo(torch.zeros(2, 2), log_prob, advantages, mask)
    # s_0 = 2 -> clipped to 1.2, loss -1.2; s_1 = 0.25 -> clipped to 0.8, loss 0.8; mean over sequences
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert metrics["pg_clipfrac"] == 1.0 and metrics["ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    unclipped = torch.tensor([[LN(1.1), LN(1.1)]], requires_grad=True)
    loss, _ = compute_policy_loss_gspo(torch.zeros(1, 2), unclipped, torch.ones(1, 2), torch.ones(1, 2))
    loss.backward()
    # d/d log_prob_t of -A * s * pi_t / sg(pi_t), averaged over the 2 tokens: -A * s / |y|
    assert unclipped.grad.tolist() == [pytest.approx([-0.55, -0.55])]


def test_geo_mean_hand_case():
    log_prob = torch.tensor([[LN(1.5), 0.0], [LN(0.5), 0.0]])
    advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    loss, metrics = compute_policy_loss_geo_mean(torch.zeros(2, 2), log_prob, advantages, torch.ones(2, 2))
    # log-ratios clipped on the harmful side to 0.2 / -0.2: ratios exp(0.1) and exp(-0.1)
    assert loss.item() == pytest.approx((-math.exp(0.1) + math.exp(-0.1)) / 2)
    assert metrics["pg_clipfrac"] == 0.25 and metrics["pg_clipfrac_lower"] == 0.25


def test_sapo_gate_hand_case_and_unit_slope():
    log_prob = torch.zeros(2, 1, requires_grad=True)
    advantages = torch.tensor([[1.0], [-1.0]])
    loss, metrics = compute_policy_loss_sapo(torch.zeros(2, 1), log_prob, advantages, torch.ones(2, 1))
    # at r = 1 the gate is 2 / tau: -2 * 1 for tau_pos = 1, +2 / 1.05 for tau_neg = 1.05
    assert loss.item() == pytest.approx((-2.0 + 2.0 / 1.05) / 2, abs=1e-6)
    loss.backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx([-0.5, 0.5])
    assert metrics["pg_clipfrac"] == 0.0


def test_cispo_hand_case_keeps_gradient_of_clipped_tokens():
    log_prob = torch.tensor([[LN(1.5), LN(0.5)]], requires_grad=True)
    advantages = torch.tensor([[1.0, -1.0]])
    loss, metrics = compute_policy_loss_cispo(torch.zeros(1, 2), log_prob, advantages, torch.ones(1, 2))
    assert loss.item() == pytest.approx((-1.2 * LN(1.5) + 0.8 * LN(0.5)) / 2)
    assert metrics["pg_clipfrac"] == 1.0
    loss.backward()
    assert log_prob.grad.tolist() == [pytest.approx([-0.6, 0.4])]


def test_dro_hand_case_penalises_the_squared_log_ratio():
    log_prob = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old_log_prob = torch.tensor([[-1.5, -1.5]])
    advantages = torch.tensor([[1.0, -1.0]])
    config = PolicyLossConfig(loss_mode="dro", dro_beta=1.0)
    loss, metrics = compute_policy_loss_dro(old_log_prob, log_prob, advantages, torch.ones(1, 2), config=config)
    # token 1: -(1 * -1 - 0.5 * 0.25) = 1.125; token 2: -(-1 * -2 - 0.5 * 0.25) = -1.875; mean -0.375
    assert loss.item() == pytest.approx(-0.375)
    assert metrics["ppo_kl"] == pytest.approx(0.0)
    loss.backward()
    # d/dlp of -(A lp - b/2 (lp - old)^2) / 2 = (-A + b (lp - old)) / 2: (-1 + 0.5) / 2 and (1 - 0.5) / 2
    assert log_prob.grad.tolist() == [pytest.approx([-0.25, 0.25])]
    with pytest.raises(PolicyLossConfigError, match="dro_beta"):
        PolicyLossConfig(loss_mode="dro")


def test_reinforce_and_gpg_hand_case():
    log_prob = torch.tensor([[-1.0, -2.0]])
    advantages = torch.tensor([[1.0, -1.0]])
    old_log_prob = torch.tensor([[-1.5, -1.5]])
    loss, metrics = compute_policy_loss_reinforce(old_log_prob, log_prob, advantages, torch.ones(1, 2))
    assert loss.item() == pytest.approx(-0.5)
    assert metrics["ppo_kl"] == pytest.approx(0.0)
    weighted, _ = get_policy_loss_fn("gpg")(
        old_log_prob, log_prob, advantages, torch.ones(1, 2), rollout_is_weights=torch.tensor([[2.0, 0.5]])
    )
    assert weighted.item() == pytest.approx(0.5)


def _random_inputs(seed: int, batch: int, length: int):
    generator = torch.Generator().manual_seed(seed)
    old_log_prob = -torch.rand(batch, length, generator=generator) * 3
    log_prob = old_log_prob + torch.randn(batch, length, generator=generator) * 0.3
    advantages = torch.randn(batch, length, generator=generator)
    weights = torch.rand(batch, length, generator=generator) + 0.5
    mask = torch.rand(batch, length, generator=generator) < 0.7
    mask[:, 0] = True
    return generator, old_log_prob, log_prob, advantages, weights, mask


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 5),
    length=st.integers(1, 6),
    name=st.sampled_from(sorted(POLICY_LOSSES.names())),
)
def test_masked_tokens_never_change_loss_or_metrics(seed, batch, length, name):
    generator, old_log_prob, log_prob, advantages, weights, mask = _random_inputs(seed, batch, length)
    noise = torch.randn(batch, length, generator=generator) * 5 * ~mask
    loss_fn = get_policy_loss_fn(name)
    torch.manual_seed(0)
    config = PolicyLossConfig(dro_beta=0.5)  # only dro reads it, and dro needs one
    clean = loss_fn(old_log_prob, log_prob, advantages, mask, config=config, rollout_is_weights=weights)
    torch.manual_seed(0)
    noisy = loss_fn(
        old_log_prob - noise,
        log_prob + noise,
        advantages + noise,
        mask,
        config=config,
        rollout_is_weights=weights + noise.abs(),
    )
    torch.testing.assert_close(noisy[0], clean[0])
    assert noisy[1] == pytest.approx(clean[1])


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    num_splits=st.integers(2, 4),
    name=st.sampled_from(["vanilla", "cispo", "reinforce", "sapo", "gspo", "geo_mean", "dppo_tv", "dppo_kl"]),
    loss_agg_mode=st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]),
)
def test_micro_batch_losses_with_global_counts_sum_to_whole_batch(seed, num_splits, name, loss_agg_mode):
    _, old_log_prob, log_prob, advantages, weights, mask = _random_inputs(seed, 8, 5)
    loss_fn = get_policy_loss_fn(name)
    config = PolicyLossConfig(loss_agg_mode=loss_agg_mode)
    whole, _ = loss_fn(old_log_prob, log_prob, advantages, mask, config, rollout_is_weights=weights)
    counts = {"global_token_count": mask.sum(), "global_seq_count": mask.shape[0]}
    parts = [
        loss_fn(*tensors[:4], config, rollout_is_weights=tensors[4], **counts)[0]
        for tensors in zip(*(t.tensor_split(num_splits) for t in (old_log_prob, log_prob, advantages, mask, weights)))
    ]
    torch.testing.assert_close(sum(parts), whole)


def _drop_rows_case(seed: int, loss_agg_mode: str):
    """8 random rows, 3 of them with advantage 0 on every token; the kept rows and the whole batch's counts."""
    _, old_log_prob, log_prob, advantages, weights, mask = _random_inputs(seed, 8, 5)
    advantages[[1, 4, 5]] = 0.0
    kept = torch.tensor([0, 2, 3, 6, 7])
    counts = {"global_token_count": mask.sum(), "global_seq_count": mask.shape[0]}
    return old_log_prob, log_prob, advantages, mask, weights, kept, counts


def _loss_and_grad(loss_fn, old_log_prob, log_prob, advantages, mask, weights, loss_agg_mode, counts):
    log_prob = log_prob.clone().requires_grad_(True)
    torch.manual_seed(0)
    config = PolicyLossConfig(loss_agg_mode=loss_agg_mode)
    loss, _ = loss_fn(old_log_prob, log_prob, advantages, mask, config, rollout_is_weights=weights, **counts)
    loss.backward()
    return loss.detach(), log_prob.grad


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    name=st.sampled_from(sorted(n for n in POLICY_LOSSES.names() if POLICY_LOSSES.traits(n)["zero_at_zero_advantage"])),
    loss_agg_mode=st.sampled_from(
        ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
    ),
)
def test_losses_zero_at_zero_advantage_give_the_same_loss_and_gradient_without_those_rows(seed, name, loss_agg_mode):
    """The promise of ``zero_at_zero_advantage``: rows with advantage 0 change nothing but the counts."""
    old_log_prob, log_prob, advantages, mask, weights, kept, counts = _drop_rows_case(seed, loss_agg_mode)
    loss_fn = get_policy_loss_fn(name)
    whole, whole_grad = _loss_and_grad(
        loss_fn, old_log_prob, log_prob, advantages, mask, weights, loss_agg_mode, counts
    )
    part, part_grad = _loss_and_grad(
        loss_fn, *(t[kept] for t in (old_log_prob, log_prob, advantages, mask, weights)), loss_agg_mode, counts
    )
    torch.testing.assert_close(part, whole)
    torch.testing.assert_close(part_grad, whole_grad[kept])
    assert not whole_grad[[1, 4, 5]].any()


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_covariance_losses_depend_on_zero_advantage_rows(name):
    """Why clip_cov and kl_cov are not flagged: their token choice is taken over the whole batch."""
    old_log_prob, log_prob, advantages, mask, weights, kept, counts = _drop_rows_case(3, "token-mean")
    config = PolicyLossConfig(
        clip_cov_ratio=0.2, kl_cov_ratio=0.2, clip_cov_lb=-10.0, clip_cov_ub=10.0, ppo_kl_coef=1.0
    )
    loss_fn = get_policy_loss_fn(name)
    torch.manual_seed(0)
    whole, _ = loss_fn(old_log_prob, log_prob, advantages, mask, config=config, **counts)
    torch.manual_seed(0)
    part, _ = loss_fn(*(t[kept] for t in (old_log_prob, log_prob, advantages, mask)), config=config, **counts)
    assert not torch.isclose(part, whole)
    assert not POLICY_LOSSES.traits(name)["zero_at_zero_advantage"]


# ---------------------------------------------------------------------------------------- the typed options
def test_defaults_equal_verl_and_the_policy_loss_section():
    config = PolicyLossConfig()
    assert (config.loss_mode, config.clip_ratio_low, config.clip_ratio_high) == ("vanilla", 0.2, 0.2)
    assert (config.clip_ratio_c, config.loss_agg_mode, config.tau_pos, config.tau_neg) == (3.0, "token-mean", 1.0, 1.05)
    assert (config.clip_cov_ratio, config.clip_cov_lb, config.clip_cov_ub) == (0.0002, 1.0, 5.0)
    assert (config.kl_cov_ratio, config.ppo_kl_coef) == (0.0002, 0.1)
    section = dataclasses.asdict(PolicyLossModeConfig())
    assert {name: getattr(config, name) for name in section} == section


def test_every_section_field_has_help():
    assert all(f.metadata.get("help") for f in dataclasses.fields(PolicyLossModeConfig))


def test_all_errors_are_collected_into_one_exception():
    with pytest.raises(PolicyLossConfigError) as error:
        PolicyLossConfig(clip_ratio_c=0.5, tau_neg=0.0, loss_agg_mode="mean")
    message = str(error.value)
    assert "clip_ratio_c=0.5 must be > 1" in message
    assert "tau_neg=0.0 must be > 0" in message
    assert "loss_agg_mode='mean' must be one of [" in message
    assert len(error.value.errors) == 3


def test_resolve_takes_the_actor_keys_from_a_structured_section():
    merged = OmegaConf.merge(OmegaConf.structured(PolicyLossModeConfig), {"kl_cov_ratio": 0.01})
    config = _resolved(clip_ratio=0.3, clip_ratio_high=0.28, policy_loss=OmegaConf.to_object(merged))
    assert (config.clip_ratio_low, config.clip_ratio_high, config.kl_cov_ratio) == (0.3, 0.28, 0.01)
    with pytest.raises(PolicyLossConfigError, match=r"clip_ratio_low=1.5 must be in \(0, 1\]"):
        _resolved(clip_ratio=1.5)


def test_the_config_is_frozen_and_its_aggregation_resolved_once():
    config = PolicyLossConfig(loss_agg_mode="seq-mean-token-mean")
    assert config.aggregate is LOSS_AGG_MODES.get("seq-mean-token-mean")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.clip_ratio_low = 0.1


# ------------------------------------------------------------------------------------------- the registry
BUILT_IN = {
    "vanilla",
    "gspo",
    "gpg",
    "clip_cov",
    "kl_cov",
    "geo_mean",
    "cispo",
    "sapo",
    "reinforce",
    "dppo_tv",
    "dppo_kl",
}


def test_every_built_in_loss_is_reachable_by_its_config_string():
    assert BUILT_IN <= set(POLICY_LOSSES.names())
    assert all(callable(get_policy_loss_fn(name)) for name in BUILT_IN)


def test_unknown_loss_mode_lists_every_registered_name_and_the_key():
    with pytest.raises(UnknownNameError) as error:
        get_policy_loss_fn("ppo")
    message = str(error.value)
    assert message.startswith("actor_rollout_ref.actor.policy_loss.loss_mode='ppo' is not a registered policy loss")
    assert all(name in message for name in BUILT_IN)


def test_user_loss_registers_by_name_and_duplicates_are_refused(monkeypatch):
    monkeypatch.setattr(POLICY_LOSSES, "_entries", dict(POLICY_LOSSES._entries))  # keep the registry clean
    monkeypatch.setattr(POLICY_LOSSES, "_traits", dict(POLICY_LOSSES._traits))

    @register_policy_loss("test_only_half_reinforce")
    def half_reinforce(old_log_prob, log_prob, advantages, response_mask, config=None, **kwargs):
        return -(advantages * log_prob * response_mask).sum() / 2, loss_metrics(0.0, 0.0, 0.0)

    assert get_policy_loss_fn("test_only_half_reinforce") is half_reinforce
    with pytest.raises(DuplicateNameError, match="'vanilla' is registered twice"):
        register_policy_loss("vanilla")(half_reinforce)


def test_aggregate_applies_weights_and_config_scale_factor():
    losses = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    weights = torch.tensor([[2.0, 1.0], [1.0, 100.0]])
    config = PolicyLossConfig(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=4)
    loss = aggregate_policy_loss(losses, mask, config, weights, None, None)
    # weighted token sums 4 and 3 over 2 sequences, divided by the scale factor 4
    assert loss.item() == pytest.approx(7 / 2 / 4)


def test_metrics_are_plain_floats():
    metrics = loss_metrics(torch.tensor(0.5), torch.tensor(0.1), 0.0)
    assert metrics == {"pg_clipfrac": 0.5, "ppo_kl": pytest.approx(0.1), "pg_clipfrac_lower": 0.0}
    assert all(type(value) is float for value in metrics.values())


def zero_at_zero_advantage(name: str) -> bool:
    return POLICY_LOSSES.traits(name)["zero_at_zero_advantage"]


def test_zero_at_zero_advantage_is_a_trait_of_the_entry_shared_by_aliases():
    flagged = {name for name in POLICY_LOSSES.names() if zero_at_zero_advantage(name)}
    assert flagged >= {"vanilla", "gspo", "geo_mean", "sapo", "cispo", "reinforce", "gpg"}
    assert not flagged & {"clip_cov", "kl_cov"}
    with pytest.raises(UnknownNameError, match="loss_mode='ppo'"):
        zero_at_zero_advantage("ppo")


def test_a_user_loss_is_not_flagged_unless_it_says_so(monkeypatch):
    monkeypatch.setattr(POLICY_LOSSES, "_entries", dict(POLICY_LOSSES._entries))
    monkeypatch.setattr(POLICY_LOSSES, "_aliases", dict(POLICY_LOSSES._aliases))
    monkeypatch.setattr(POLICY_LOSSES, "_traits", dict(POLICY_LOSSES._traits))

    def loss(old_log_prob, log_prob, advantages, response_mask, **kwargs):
        return -(advantages * log_prob * response_mask).sum(), loss_metrics(0.0, 0.0, 0.0)

    register_policy_loss("test_only_unflagged")(loss)
    register_policy_loss("test_only_flagged", "test_only_flagged_alias", zero_at_zero_advantage=True)(loss)
    assert not zero_at_zero_advantage("test_only_unflagged")
    assert zero_at_zero_advantage("test_only_flagged") and zero_at_zero_advantage("test_only_flagged_alias")
