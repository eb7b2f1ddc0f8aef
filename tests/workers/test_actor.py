"""The actor part through ActorRolloutRefWorker, in this process on a 1-rank group: PPO update, metrics,
split invariance, KL loss, LoRA, rollout correction's bypass-mode loss."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformers import AutoConfig

from hybridflow.algos import BypassCorrection, CorrectionSettings
from hybridflow.models.loading import load_causal_lm
from hybridflow.models.log_probs import forward_log_probs
from hybridflow.workers import ActorRolloutRefWorker, MissingPartError
from hybridflow.workers import actor as actor_module
from hybridflow.workers import ref as ref_module
from hybridflow.workers.training import UpdateBatchError, local_loss_counts
from tests.float_bounds import longest_reduction, model_output_bound

from .helpers import (
    actor_rollout_ref_config,
    assert_same_adamw_steps,
    assert_same_update_metrics,
    full_parameters,
    gradient_bound,
    rollout_batch,
)

pytestmark = pytest.mark.usefixtures("process_group")

ACTOR_METRICS = {"pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy", "grad_norm", "lr"}


def make_worker(model_dir, role="actor", **overrides) -> ActorRolloutRefWorker:
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir, **overrides), role)
    worker.init_model()
    return worker


def batch_for(worker, num_samples=8, seed=0):
    batch = rollout_batch(num_samples, seed=seed)
    return batch.union(worker.compute_log_prob(batch, calculate_entropy=True))


def test_ppo_update_reduces_the_loss_on_a_fixed_batch_and_reports_metrics(tiny_model_dir):
    worker = make_worker(tiny_model_dir, role="actor_rollout_ref", actor={"use_kl_loss": True, "ppo_epochs": 2})
    batch = batch_for(worker)
    batch = batch.union(worker.compute_ref_log_prob(batch))
    losses = []
    for _ in range(4):
        metrics = worker.update_actor(batch).meta_info["metrics"]
        losses.append(metrics["pg_loss"][0])
    assert ACTOR_METRICS | {"kl_loss", "kl_coef"} <= set(metrics)
    assert len(metrics["pg_loss"]) == len(metrics["grad_norm"]) == 2  # 2 epochs x 1 mini-batch
    assert all(math.isfinite(value) for key in ACTOR_METRICS - {"lr"} for value in metrics[key])
    assert metrics["lr"] == pytest.approx(1e-3)
    # The first step of the first call starts at the data's own policy: ratio 1, nothing clipped.
    assert losses[-1] < losses[0] - 0.05
    assert metrics["kl_loss"][-1] > 0
    assert 0.0 <= metrics["pg_clipfrac"][-1] <= 1.0


def test_an_optimizer_step_with_a_non_finite_gradient_norm_is_skipped_and_reported(tiny_model_dir):
    """lr=1e6: the first of two mini-batch steps moves every weight by ~1e6 (Adam's first step is lr x sign);
    the second's forward pass overflows, its gradient norm is NaN and the step is not taken. A later update
    with every norm NaN leaves the weights bit for bit."""
    worker = make_worker(tiny_model_dir, actor={"optim": {"lr": 1e6}, "ppo_mini_batch_size": 4})
    first = worker.update_actor(batch_for(worker)).meta_info["metrics"]
    assert math.isfinite(first["grad_norm"][0]) and math.isnan(first["grad_norm"][1])
    assert first["nonfinite_skip_frac"] == [0.0, 1.0]
    before = full_parameters(worker.parts["actor"].module)
    assert max(float(weights.abs().max()) for weights in before.values()) > 1e5
    second = worker.update_actor(batch_for(worker, seed=1)).meta_info["metrics"]
    assert second["nonfinite_skip_frac"] == [1.0, 1.0]
    after = full_parameters(worker.parts["actor"].module)
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_old_log_probs_and_entropy_shapes_and_padding(tiny_model_dir):
    worker = make_worker(tiny_model_dir)
    batch = rollout_batch(6, seed=3)
    output = worker.compute_log_prob(batch, calculate_entropy=True)
    log_probs, entropys = output.batch["old_log_probs"], output.batch["entropys"]
    assert log_probs.shape == entropys.shape == batch.batch["responses"].shape
    padding = batch.batch["response_mask"] == 0
    assert torch.all(log_probs[padding] == 0) and torch.all(log_probs[~padding] < 0)
    assert torch.all(entropys[~padding] > 0)


def test_sum_pi_squared_only_when_the_actor_is_asked_for_it(tiny_model_dir):
    batch = rollout_batch(6, seed=3)
    assert "sum_pi_squared" not in make_worker(tiny_model_dir).compute_log_prob(batch).batch.keys()
    worker = make_worker(tiny_model_dir, actor={"calculate_sum_pi_squared": True})
    output = worker.compute_log_prob(batch)
    sum_pi_squared = output.batch["sum_pi_squared"]
    assert sum_pi_squared.shape == batch.batch["responses"].shape
    padding = batch.batch["response_mask"] == 0
    # a distribution's sum of squared probabilities lies in [1/V, 1], and is at least the sampled token's pi^2
    pi, vocab_size = output.batch["old_log_probs"].exp(), worker.parts["actor"].hf_config.vocab_size
    assert torch.all(sum_pi_squared[padding] == 0)
    assert torch.all((sum_pi_squared[~padding] >= 1 / vocab_size - 1e-6) & (sum_pi_squared[~padding] <= 1 + 1e-6))
    assert torch.all(sum_pi_squared[~padding] >= pi[~padding] ** 2 - 1e-6)


@pytest.mark.parametrize(
    "actor_batching",
    [{"ppo_micro_batch_size_per_gpu": 1}, {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 24}],
    ids=["micro-1", "token-budget"],
)
def test_update_does_not_depend_on_the_micro_batch_split(tiny_model_dir, actor_batching):
    reference = make_worker(tiny_model_dir, actor={"ppo_micro_batch_size_per_gpu": 8})
    other = make_worker(tiny_model_dir, actor=actor_batching)
    batch = batch_for(reference)
    reference_metrics = reference.update_actor(batch).meta_info["metrics"]
    other_metrics = other.update_actor(batch).meta_info["metrics"]
    assert_same_one_step_update(other, reference, other_metrics, reference_metrics, batch, tiny_model_dir)


def assert_same_one_step_update(
    worker, reference, metrics, expected, batch, model_dir, keys=("pg_loss", "entropy", "ppo_kl", "grad_norm")
) -> None:
    """Two workers that took one optimizer step on ``batch`` (one mini-batch) with the same float32 sums in
    other orders (micro-batches of other sizes): metrics and weights agree within ``float_bounds``."""
    num_terms = longest_reduction(AutoConfig.from_pretrained(model_dir))
    log_prob_bound = model_output_bound(batch.batch["old_log_probs"], num_terms)
    assert_same_update_metrics(
        metrics, expected, batch, log_prob_bound, num_terms, mini_batch_rows=len(batch), keys=keys
    )
    assert_same_adamw_steps(
        weights_of(worker),
        weights_of(reference),
        steps=1,
        lr=1e-3,
        gradient_rel_bound=gradient_bound(log_prob_bound, num_terms),
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {"actor": {"fsdp_config": {"param_offload": True, "optimizer_offload": True}}},
        {"model": {"enable_gradient_checkpointing": True, "use_remove_padding": False}},
        {"actor": {"entropy_from_logits_with_chunking": True, "entropy_from_logits_chunk_size": 3}},
    ],
    ids=["offload", "checkpointing-padded", "entropy-chunks-of-3-rows"],
)
def test_memory_options_keep_the_update(tiny_model_dir, overrides):
    reference = make_worker(tiny_model_dir)
    other = make_worker(tiny_model_dir, **overrides)
    batch = batch_for(reference)
    expected = reference.update_actor(batch).meta_info["metrics"]
    metrics = other.update_actor(batch).meta_info["metrics"]
    assert_same_one_step_update(other, reference, metrics, expected, batch, tiny_model_dir)


def test_use_torch_compile_compiles_the_actor(tiny_model_dir):
    # That compiling keeps a model's outputs is tests/models/test_training_options.py's (with dynamo's eager
    # backend: inductor costs tens of seconds on CPU); here, that the key reaches the actor's module.
    assert make_worker(tiny_model_dir, actor={"use_torch_compile": True}).parts["actor"].module._compiled_call_impl
    assert make_worker(tiny_model_dir).parts["actor"].module._compiled_call_impl is None


def test_lora_actor_trains_only_the_adapter_and_its_reference_is_the_base_model(tiny_model_dir):
    worker = make_worker(tiny_model_dir, role="actor_rollout_ref", model={"lora_rank": 4, "lora_alpha": 8})
    actor = worker.parts["actor"]
    before = full_parameters(actor.module)
    batch = batch_for(worker)
    worker.update_actor(batch)
    after = full_parameters(actor.module)
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    trainable = {name for name, param in actor.module.named_parameters() if param.requires_grad}
    assert trainable and all(".lora_" in name for name in trainable)
    assert changed and changed <= trainable

    plain = load_causal_lm(tiny_model_dir)
    tensors = batch.batch
    with torch.no_grad():
        base_log_probs, _ = forward_log_probs(
            plain, tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"], response_length=5
        )
    ref_log_prob = worker.compute_ref_log_prob(batch).batch["ref_log_prob"]
    # The adapter is off (its B is 0), but the sharded model runs its sums in micro-batches of another size.
    num_terms = longest_reduction(plain.config)
    torch.testing.assert_close(ref_log_prob, base_log_probs, rtol=0, atol=model_output_bound(base_log_probs, num_terms))
    new_log_probs = worker.compute_log_prob(batch).batch["old_log_probs"]
    assert (new_log_probs - ref_log_prob).abs().max() > 1e-3


def test_lora_actor_starts_from_a_saved_adapter_and_its_reference_is_still_the_base(tiny_model_dir, saved_adapter):
    from peft import PeftModel

    worker = make_worker(tiny_model_dir, role="actor_rollout_ref", model={"lora_adapter_path": str(saved_adapter)})
    actor = worker.parts["actor"]
    assert (actor.lora_config.r, actor.lora_config.lora_alpha) == (4, 8)
    assert {name for name, p in actor.module.named_parameters() if p.requires_grad} == {
        name for name, _ in actor.module.named_parameters() if ".lora_" in name
    }
    batch = rollout_batch(8, seed=2)
    tensors = batch.batch
    inputs = (tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"])
    with torch.no_grad():
        adapted, _ = forward_log_probs(
            PeftModel.from_pretrained(load_causal_lm(tiny_model_dir), saved_adapter), *inputs, response_length=5
        )
        base, _ = forward_log_probs(load_causal_lm(tiny_model_dir), *inputs, response_length=5)
    assert (adapted - base).abs().max() > 1e-2  # the saved adapter changes the policy
    torch.testing.assert_close(worker.compute_log_prob(batch).batch["old_log_probs"], adapted, rtol=0, atol=1e-5)
    torch.testing.assert_close(worker.compute_ref_log_prob(batch).batch["ref_log_prob"], base, rtol=0, atol=1e-5)


def test_a_method_outside_the_role_names_the_missing_part(tiny_model_dir):
    worker = make_worker(tiny_model_dir, role="actor")
    with pytest.raises(MissingPartError, match="compute_ref_log_prob needs the ref part.*role='actor'"):
        worker.compute_ref_log_prob(rollout_batch(2))


def assert_same_weights(params: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Equal to 1e-6 relative: both updates ran the same float operations (their gradients are all zero)."""
    assert params.keys() == expected.keys()
    for name, tensor in params.items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-6, atol=1e-9, msg=name)


def weights_of(worker) -> dict[str, torch.Tensor]:
    return full_parameters(worker.parts["actor"].module)


def on_policy_batch(num_samples=8, seed=0):
    """A batch without old log-probs, for an update with ``old_log_probs_from_update=True``."""
    return rollout_batch(num_samples, seed=seed)


def test_an_on_policy_update_without_old_log_probs_equals_the_one_with_the_separate_pass(tiny_model_dir):
    separate, on_policy = make_worker(tiny_model_dir), make_worker(tiny_model_dir)
    batch = batch_for(separate)
    expected = separate.update_actor(batch).meta_info["metrics"]
    metrics = on_policy.update_actor(on_policy_batch(), old_log_probs_from_update=True).meta_info["metrics"]
    assert metrics["pg_clipfrac"] == [0.0] and metrics["ppo_kl"] == [0.0]  # the ratio is exactly 1
    # The separate pass ran its forward in another micro-batch size: its ratio is 1 within the log-prob bound.
    assert_same_one_step_update(on_policy, separate, metrics, expected, batch, tiny_model_dir)


def test_old_log_probs_from_the_update_are_refused_unless_the_update_is_on_policy(tiny_model_dir):
    worker = make_worker(tiny_model_dir, actor={"ppo_mini_batch_size": 4})
    with pytest.raises(UpdateBatchError, match="ppo_epochs=1 and 8 rows on this rank for mini-batches of 4"):
        worker.update_actor(on_policy_batch(), old_log_probs_from_update=True)
    with pytest.raises(KeyError, match="old_log_probs"):
        worker.update_actor(rollout_batch(4))


def only_rows(batch, rows, whole):
    """``batch[rows]`` and ``whole``'s loss counts, as the trainer sends the rows with signal."""
    part = batch[rows] if len(rows) else batch[0:0]
    return part, dataclasses.asdict(local_loss_counts(whole.batch["response_mask"]))


# One row per micro-batch: the update sums per-row gradients in row order, so leaving out rows whose
# gradient is exactly 0 changes no float operation that remains.
ROW_MICRO_BATCHES = {"actor": {"ppo_micro_batch_size_per_gpu": 1, "optim": {"weight_decay": 0.01}}}


@pytest.mark.parametrize("on_policy", [False, True], ids=["old-log-probs", "on-policy"])
def test_an_update_of_the_rows_with_signal_equals_the_whole_batch_update(tiny_model_dir, on_policy):
    whole, part = make_worker(tiny_model_dir, **ROW_MICRO_BATCHES), make_worker(tiny_model_dir, **ROW_MICRO_BATCHES)
    batch = batch_for(whole)
    batch.batch["advantages"][[1, 4, 5]] = 0.0
    expected = whole.update_actor(batch).meta_info["metrics"]
    sent, counts = only_rows(on_policy_batch() if on_policy else batch, [0, 2, 3, 6, 7], whole=batch)
    metrics = part.update_actor(sent, old_log_probs_from_update=on_policy, loss_counts=counts).meta_info["metrics"]
    # On-policy, the ratio is exactly 1 where the whole update's is 1 within the log-prob bound.
    assert_same_one_step_update(part, whole, metrics, expected, batch, tiny_model_dir, keys=("pg_loss", "grad_norm"))


def test_an_update_of_no_rows_still_steps_adamw_like_a_batch_of_zero_advantages(tiny_model_dir):
    """Zero gradients move the weights through AdamW's momentum and weight decay; the schedule advances."""
    whole, part = make_worker(tiny_model_dir, **ROW_MICRO_BATCHES), make_worker(tiny_model_dir, **ROW_MICRO_BATCHES)
    first = batch_for(whole)
    whole.update_actor(first)
    part.update_actor(first)
    after_first = weights_of(whole)
    no_signal = batch_for(whole, seed=1)
    no_signal.batch["advantages"].zero_()
    expected = whole.update_actor(no_signal).meta_info["metrics"]
    sent, counts = only_rows(no_signal, [], whole=no_signal)
    metrics = part.update_actor(sent, loss_counts=counts).meta_info["metrics"]
    assert_same_weights(weights_of(part), weights_of(whole))
    assert any(not torch.equal(after_first[name], tensor) for name, tensor in weights_of(part).items())
    assert part.parts["actor"].trainer.update_count == whole.parts["actor"].trainer.update_count == 2
    assert expected["grad_norm"] == metrics["grad_norm"] == [0.0]
    assert metrics["pg_loss"] == [0.0] and "entropy" not in metrics


# Another micro-batching changes only which rows share a forward, so a matmul kernel may sum a row's dot
# products in another order. Such a sum of n float32 terms is off by at most n * 2**-24 times the sum of the
# terms' magnitudes (Higham, Accuracy and Stability of Numerical Algorithms, section 3.1); with n = 512 (the
# tiny model's widest dot product, its MLP) and log-probs and logits of magnitude below 8 (log 263 = 5.6):
LOG_PROB_ATOL = 512 * 2**-24 * 8


def count_forwards(monkeypatch, module, name="log_prob_forward") -> list[tuple[int, int]]:
    """(rows, real tokens) of every call of ``module.<name>``: ``log_prob_forward`` (a DataProto) or the actor's
    old-log-prob statistics, ``forward_token_statistics`` (its tensors)."""
    calls, original = [], getattr(module, name)

    def counting(model, first, *args, **kwargs):
        attention_mask = first.batch["attention_mask"] if name == "log_prob_forward" else args[0]
        calls.append((len(first), int(attention_mask.sum())))
        return original(model, first, *args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


@pytest.mark.parametrize(
    "rollout_keys, rows",
    [
        ({"log_prob_micro_batch_size_per_gpu": 3}, [3, 3, 2]),
        ({"log_prob_micro_batch_size": 4}, [4, 4]),  # verl's global form, over this 1-rank group
        ({"log_prob_use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": 24}, None),
    ],
    ids=["per-gpu-3", "global-4", "token-budget-24"],
)
def test_old_log_probs_take_the_rollout_micro_batching_and_do_not_depend_on_it(
    tiny_model_dir, monkeypatch, rollout_keys, rows
):
    batch = rollout_batch(8, seed=0)
    calls = count_forwards(monkeypatch, actor_module, "forward_token_statistics")
    # The actor's update micro-batch size plays no part: with no rollout size the rank's 8 rows go in one forward.
    whole = make_worker(
        tiny_model_dir, actor={"ppo_micro_batch_size_per_gpu": 1}, rollout={"log_prob_micro_batch_size_per_gpu": None}
    )
    expected = whole.compute_log_prob(batch, calculate_entropy=True)
    assert calls == [(8, int(batch.batch["attention_mask"].sum()))]
    calls.clear()
    output = make_worker(tiny_model_dir, rollout=rollout_keys).compute_log_prob(batch, calculate_entropy=True)
    if rows is None:  # a token budget: as few forwards as hold at most 24 real tokens each
        total = sum(tokens for _, tokens in calls)
        assert len(calls) >= -(-total // 24) > 1 and max(tokens for _, tokens in calls) <= 24
    else:
        assert [count for count, _ in calls] == rows
    for key in ("old_log_probs", "entropys"):
        torch.testing.assert_close(output.batch[key], expected.batch[key], rtol=0, atol=LOG_PROB_ATOL, msg=key)


def test_each_pass_chooses_its_layout_once_and_runs_every_micro_batch_in_it(tiny_model_dir, monkeypatch):
    """The old-log-prob pass, the reference pass and the update choose one layout for the rank's whole batch."""
    chosen, used = [], []
    choose, forward = actor_module.choose_layout, actor_module.log_prob_forward
    monkeypatch.setattr(actor_module, "choose_layout", lambda *args: chosen.append(choose(*args)) or chosen[-1])
    for module in (actor_module, ref_module):
        monkeypatch.setattr(
            module,
            "log_prob_forward",
            lambda model, micro, layout, *args, **kwargs: (
                used.append(layout) or forward(model, micro, layout, *args, **kwargs)
            ),
        )
    worker = make_worker(tiny_model_dir, role="actor_ref", actor={"ppo_micro_batch_size_per_gpu": 2, "ppo_epochs": 2})
    batch = rollout_batch(8, seed=0)
    batch = batch.union(worker.compute_log_prob(batch)).union(worker.compute_ref_log_prob(batch))
    assert len(chosen) == 2 and used == [chosen[0]] * 4 + [chosen[1]] * 2  # micro-batches of 2, then of 4
    chosen.clear(), used.clear()
    worker.update_actor(batch)
    assert len(chosen) == 1 and used == [chosen[0]] * 8  # 2 epochs of 4 micro-batches


def bypass_worker(model_dir, settings, loss_type="ppo_clip"):
    worker = ActorRolloutRefWorker(
        actor_rollout_ref_config(model_dir), "actor", bypass=BypassCorrection(settings, loss_type)
    )
    worker.init_model()
    return worker


def test_bypass_mode_on_the_actors_own_log_probs_trains_as_vanilla_ppo(tiny_model_dir):
    """The rollout's log-probs (here the actor's own, bit for bit) are the old ones: the same PPO step."""
    vanilla, bypass = make_worker(tiny_model_dir), bypass_worker(tiny_model_dir, CorrectionSettings())
    batch = batch_for(vanilla)
    expected = vanilla.update_actor(batch).meta_info["metrics"]
    metrics = bypass.update_actor(batch).meta_info["metrics"]
    assert_same_weights(weights_of(bypass), weights_of(vanilla))
    assert metrics["pg_loss"] == pytest.approx(expected["pg_loss"], rel=1e-6)
    # the update's first forward equals the pass's: no mismatch, each token mean exactly 0
    assert metrics["rollout_corr/kl"] == [0.0] and metrics["rollout_corr/chi2_token"] == [0.0]


def test_bypass_mode_rejection_leaves_the_rejected_tokens_out_of_the_loss(tiny_model_dir):
    # old log-probs 0.1 above the actor's on every token: (0.1)^2 / 2 = 0.005 > 0.001 rejects them all
    worker = bypass_worker(
        tiny_model_dir, CorrectionSettings.from_keys(rollout_rs="token_k2", rollout_rs_threshold=0.001)
    )
    batch = batch_for(worker)
    batch.batch["old_log_probs"] = batch.batch["old_log_probs"] + 0.1
    metrics = worker.update_actor(batch).meta_info["metrics"]
    assert metrics["pg_loss"] == [0.0]
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == [pytest.approx(1.0)]
    assert metrics["rollout_corr/kl"] == [pytest.approx(0.1, rel=1e-5)]  # mean of log pi_rollout - log pi_theta
