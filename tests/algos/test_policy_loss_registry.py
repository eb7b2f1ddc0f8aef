import pytest
import torch

import hybridflow.algos  # noqa: F401  (registers every loss)
from hybridflow.algos.policy_loss_registry import (
    POLICY_LOSSES,
    aggregate_policy_loss,
    get_policy_loss_fn,
    loss_metrics,
    register_policy_loss,
)
from hybridflow.registry import DuplicateNameError, UnknownNameError

BUILT_IN = {
    "vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo", "sapo", "reinforce", "dppo_tv", "dppo_kl"
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
    def half_reinforce(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                       **kwargs):
        return -(advantages * log_prob * response_mask).sum() / 2, loss_metrics(0.0, 0.0, 0.0)

    assert get_policy_loss_fn("test_only_half_reinforce") is half_reinforce
    with pytest.raises(DuplicateNameError, match="'vanilla' is registered twice"):
        register_policy_loss("vanilla")(half_reinforce)


def test_aggregate_applies_weights_and_config_scale_factor():
    losses = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    weights = torch.tensor([[2.0, 1.0], [1.0, 100.0]])
    loss = aggregate_policy_loss(losses, mask, "seq-mean-token-sum-norm", {"loss_scale_factor": 4}, weights, None, None)
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
