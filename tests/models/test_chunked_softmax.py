"""Chunked log-prob and entropy equal the naive full log-softmax: values and gradients."""

import math

import pytest
import torch

from hybridflow.models.chunked_softmax import (
    default_chunk_size,
    entropy_from_logits,
    log_probs_and_entropy,
    log_probs_from_logits,
    sum_pi_squared_from_logits,
)


def _naive(logits, labels, temperature=1.0):
    log_softmax = (logits.float() / temperature).log_softmax(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_softmax.gather(-1, labels.unsqueeze(-1)).squeeze(-1), entropy


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
    torch.testing.assert_close(log_probs_from_logits(logits, labels, temperature, chunk_size), naive_log_probs)
    torch.testing.assert_close(entropy_from_logits(logits, temperature, chunk_size), naive_entropy)


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
    log_probs_from_logits(logits, torch.arange(9), chunk_size=4).sum().backward()
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
