"""Log-probs of the response tokens: forward_log_probs with entropy and temperature; the chunked statistics equal
the naive full log-softmax (values and gradients); the last decoder layer run only where logits are kept gives
the full layer's log-probs, entropies and gradients up to float32 order, in every layout."""

import contextlib
import math

import pytest
import torch

from hybridflow.models import log_probs as log_probs_module
from hybridflow.models.layouts import choose_layout
from hybridflow.models.log_probs import (
    default_chunk_size,
    forward_log_probs,
    forward_token_statistics,
    kept_positions_only,
    last_decoder_layer,
    log_probs_and_entropy,
    response_prediction_mask,
    sum_pi_squared_from_logits,
)
from tests.float_bounds import longest_reduction, model_output_bound
from tests.models.test_layouts import GROUPS, assert_gradients_agree, grouped_batch


def _naive(logits, labels, temperature=1.0):
    log_softmax = (logits.float() / temperature).log_softmax(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_softmax.gather(-1, labels.unsqueeze(-1)).squeeze(-1), entropy


def test_prediction_mask_marks_the_columns_before_real_response_tokens():
    attention_mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    assert response_prediction_mask(attention_mask, 2).int().tolist() == [[0, 0, 1, 0, 0], [0, 0, 1, 1, 0]]
    with pytest.raises(ValueError, match="response_length=5"):
        response_prediction_mask(attention_mask, 5)


def test_forward_log_probs_entropy_only_when_asked_and_temperature_applied(tiny_model, padded_batch):
    input_ids, attention_mask, position_ids, _ = padded_batch([4, 2], [3, 1], 4, 3)
    with torch.no_grad():
        log_probs, entropy = forward_log_probs(tiny_model, input_ids, attention_mask, position_ids, 3)
        hot, _ = forward_log_probs(tiny_model, input_ids, attention_mask, position_ids, 3, temperature=2.0)
        logits = tiny_model(input_ids[:1]).logits[0, 3:6]
    assert entropy is None and log_probs.shape == (2, 3)
    # One row alone against two in a batch: the same sums in other orders (tests/float_bounds.py).
    bound = model_output_bound(hot, longest_reduction(tiny_model.config))
    torch.testing.assert_close(hot[0], _naive(logits, input_ids[0, 4:7], 2.0)[0], atol=bound, rtol=0)


@pytest.mark.parametrize("use_remove_padding", [True, False])
def test_batch_without_response_tokens_gives_zeros_and_backpropagates(tiny_model, use_remove_padding):
    input_ids = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0]])
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    log_probs, entropy = forward_log_probs(
        tiny_model,
        input_ids,
        attention_mask,
        position_ids,
        3,
        use_remove_padding=use_remove_padding,
        calculate_entropy=True,
    )
    assert torch.equal(log_probs, torch.zeros(2, 3)) and torch.equal(entropy, torch.zeros(2, 3))
    (log_probs.sum() + entropy.sum()).backward()


@pytest.mark.parametrize("use_remove_padding", [True, False])
def test_sum_pi_squared_of_each_response_position(tiny_model, padded_batch, use_remove_padding):
    input_ids, attention_mask, position_ids, _ = padded_batch([4, 2], [3, 1], 4, 3)
    with torch.no_grad():
        layout = choose_layout(tiny_model, input_ids, attention_mask, 3, False, use_remove_padding)
        statistics = forward_token_statistics(
            tiny_model,
            input_ids,
            attention_mask,
            position_ids,
            3,
            layout,
            temperature=0.5,
            calculate_sum_pi_squared=True,
        )
        logits = tiny_model(input_ids[:1]).logits[0, 3:6]
    expected = ((logits.float() / 0.5).softmax(-1) ** 2).sum(-1)
    torch.testing.assert_close(statistics.sum_pi_squared[0], expected, atol=1e-5, rtol=0)
    # row 1 has one response token: its other two positions are padding
    assert statistics.sum_pi_squared[1, 1:].tolist() == [0.0, 0.0] and statistics.sum_pi_squared[1, 0] > 0
    assert statistics.entropy is None
    plain = forward_token_statistics(tiny_model, input_ids, attention_mask, position_ids, 3, layout, temperature=0.5)
    assert plain.sum_pi_squared is None
    torch.testing.assert_close(plain.log_probs, statistics.log_probs)


@pytest.mark.parametrize("chunk_size", [1, 7, 64, None])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_equals_naive(chunk_size, temperature):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 17, 301, generator=generator) * 4
    labels = torch.randint(0, 301, (3, 17), generator=generator)
    log_probs, entropy = log_probs_and_entropy(logits, labels, temperature, True, chunk_size)
    naive_log_probs, naive_entropy = _naive(logits, labels, temperature)
    torch.testing.assert_close(log_probs, naive_log_probs)
    torch.testing.assert_close(entropy, naive_entropy)
    alone, no_entropy = log_probs_and_entropy(logits, labels, temperature, False, chunk_size)
    torch.testing.assert_close(alone, naive_log_probs)
    assert no_entropy is None


def test_bfloat16_logits_give_float32_statistics():
    logits = torch.randn(10, 50, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    labels = torch.arange(10)
    log_probs, entropy = log_probs_and_entropy(logits, labels, calculate_entropy=True, chunk_size=3)
    assert log_probs.dtype == entropy.dtype == torch.float32
    torch.testing.assert_close(log_probs, _naive(logits, labels)[0])


@pytest.mark.parametrize("log_prob_weight, entropy_weight", [(1.0, 0.0), (0.0, 1.0), (1.0, -0.3)])
def test_chunked_gradient_equals_naive_gradient(log_prob_weight, entropy_weight):
    generator = torch.Generator().manual_seed(2)
    base = torch.randn(40, 97, generator=generator) * 3
    labels = torch.randint(0, 97, (40,), generator=generator)
    weights = torch.randn(40, generator=generator)
    gradients = []
    for compute in (
        lambda logits: log_probs_and_entropy(logits, labels, 0.8, entropy_weight != 0, chunk_size=6),
        lambda logits: _naive(logits, labels, 0.8),
    ):
        logits = base.clone().requires_grad_(True)
        log_probs, entropy = compute(logits)
        loss = log_prob_weight * log_probs
        if entropy_weight:
            loss = loss + entropy_weight * entropy
        (loss * weights).sum().backward()
        gradients.append(logits.grad)
    torch.testing.assert_close(gradients[0], gradients[1])


def test_gradient_keeps_the_logits_dtype():
    logits = torch.randn(9, 31, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).requires_grad_(True)
    log_probs_and_entropy(logits, torch.arange(9), chunk_size=4)[0].sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    expected = torch.autograd.grad(_naive(logits, torch.arange(9))[0].sum(), logits)[0]
    torch.testing.assert_close(logits.grad, expected)


def test_default_chunk_bounds_the_block_size():
    assert default_chunk_size(151_936) == 6
    assert default_chunk_size(32_768) == 32
    assert default_chunk_size(2**21) == 1


def test_sum_pi_squared_hand_case():
    # uniform over 4: 4 * (1/4)^2 = 1/4; probabilities (3/4, 1/4): 9/16 + 1/16 = 5/8
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, -math.inf, -math.inf]])
    assert sum_pi_squared_from_logits(logits).tolist() == pytest.approx([0.25, 0.625], rel=1e-6)
    # temperature 2 halves the logits: ln 9 / 2 = ln 3 gives (3/4, 1/4) again
    hot = torch.tensor([[2 * math.log(3.0), 0.0]])
    assert sum_pi_squared_from_logits(hot, temperature=2.0).item() == pytest.approx(0.625, rel=1e-6)


@pytest.mark.parametrize("chunk_size", [1, 5, None])
def test_sum_pi_squared_equals_naive_softmax(chunk_size):
    logits = torch.randn(2, 9, 301, generator=torch.Generator().manual_seed(3)) * 4
    naive = ((logits / 0.7).softmax(-1) ** 2).sum(-1)
    torch.testing.assert_close(sum_pi_squared_from_logits(logits, 0.7, chunk_size), naive)


# share_prompts, use_remove_padding of each layout forward_log_probs can take
PATHS = {"shared": (True, False), "packed": (False, True), "padded": (False, False)}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_kept_positions_only_gives_the_full_layers_log_probs_and_gradients(tiny_model, padded_batch, path, monkeypatch):
    prompts, samples, response_lengths = GROUPS["grpo_groups"]
    batch = grouped_batch(padded_batch, prompts, samples, response_lengths)
    response_mask = batch[3]
    share_prompts, use_remove_padding = PATHS[path]
    mlp_rows = []
    last_decoder_layer(tiny_model).mlp.down_proj.register_forward_hook(
        lambda module, args, output: mlp_rows.append(args[0].shape[:-1].numel())
    )

    def run():
        tiny_model.zero_grad()
        log_probs, entropy = forward_log_probs(
            tiny_model,
            *batch[:3],
            6,
            use_remove_padding=use_remove_padding,
            calculate_entropy=True,
            share_prompts=share_prompts,
        )
        ((log_probs + 0.1 * entropy) * response_mask).sum().backward()
        return log_probs.detach(), entropy.detach(), [p.grad.clone() for p in tiny_model.parameters()]

    skipped_lp, skipped_entropy, skipped_grads = run()
    monkeypatch.setattr(log_probs_module, "kept_positions_only", lambda model, keep: contextlib.nullcontext())
    full_lp, full_entropy, full_grads = run()

    # Kept: the positions predicting a response token (a group's prompt end predicts each member's first token
    # once when shared), or in the padded rectangle its last R + 1 columns.
    predicted = int(response_mask.sum())
    expected = {"shared": predicted - len(response_lengths) + len(prompts), "packed": predicted, "padded": 12 * 7}
    kept_rows, all_rows = mlp_rows
    assert kept_rows == expected[path] and all_rows > kept_rows
    num_terms = longest_reduction(tiny_model.config)
    torch.testing.assert_close(skipped_lp, full_lp, atol=model_output_bound(full_lp, num_terms), rtol=0)
    torch.testing.assert_close(skipped_entropy, full_entropy, atol=model_output_bound(full_entropy, num_terms), rtol=0)
    assert_gradients_agree(skipped_grads, full_grads, num_terms + int(response_mask.sum()))


def test_the_layer_is_restored_after_the_block_and_left_alone_under_gradient_checkpointing(tiny_model):
    layer = last_decoder_layer(tiny_model)
    keep = torch.zeros(2, 5, dtype=torch.bool)
    keep[:, -2:] = True
    with kept_positions_only(tiny_model, keep):
        assert "forward" in vars(layer.mlp)
    assert all("forward" not in vars(part) for part in (layer.mlp, layer.self_attn.q_proj, layer.self_attn.o_proj))
    tiny_model.gradient_checkpointing_enable()
    with kept_positions_only(tiny_model, keep):
        assert "forward" not in vars(layer.mlp), "a recomputed layer must compute what its forward computed"
