"""On-policy distillation's math: the top-k log-probs and the gathered log-softmax equal a full log-softmax (values
and gradients); forward_kl_topk and the reverse-KL estimators on pinned numbers; the loss section's checks."""

import math

import pytest
import torch

from hybridflow.algos.distillation import (
    DistillationLossConfig,
    forward_kl_topk,
    log_probs_at,
    reverse_kl_estimate,
    topk_log_probs,
    topk_metrics,
)


@pytest.mark.parametrize("chunk_size", [1, 5, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_topk_and_gathered_log_probs_equal_a_full_log_softmax(chunk_size, temperature):
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 7, 53, generator=generator) * 3).requires_grad_()
    full = (logits.detach() / temperature).log_softmax(-1)
    top = topk_log_probs(logits, 4, temperature, chunk_size)
    expected = full.topk(4, -1)
    torch.testing.assert_close(top.log_probs, expected.values)
    assert torch.equal(top.ids, expected.indices)
    ids = torch.randint(0, 53, (2, 7, 3), generator=generator)
    weights = torch.randn(2, 7, 3, generator=generator)
    (log_probs_at(logits, ids, temperature, chunk_size) * weights).sum().backward()
    reference = logits.detach().clone().requires_grad_()
    naive = (reference / temperature).log_softmax(-1).gather(-1, ids)
    (naive * weights).sum().backward()
    torch.testing.assert_close(log_probs_at(logits.detach(), ids, temperature, chunk_size), naive.detach())
    torch.testing.assert_close(logits.grad, reference.grad)


def test_forward_kl_topk_pinned():
    # Teacher top-2 p = (0.5, 0.25) at ids (3, 1); student q = (0.25, 0.5) there; the student's own top-2 (1, 7)
    teacher = torch.tensor([[[math.log(0.5), math.log(0.25)]]])
    student = torch.tensor([[[math.log(0.25), math.log(0.5)]]], requires_grad=True)
    divergence = forward_kl_topk(student, teacher, torch.tensor([[[3, 1]]]), torch.tensor([[[1, 7]]]))
    # 0.5 ln 2 - 0.25 ln 2 = 0.25 ln 2
    torch.testing.assert_close(divergence.loss, torch.tensor([[0.25 * math.log(2)]]))
    torch.testing.assert_close(divergence.student_mass, torch.tensor([[0.75]]))
    torch.testing.assert_close(divergence.teacher_mass, torch.tensor([[0.75]]))
    assert divergence.overlap_count.tolist() == [[1]]
    # the overlapping id 1: -0.25 (ln 0.25 - ln 0.5) = 0.25 ln 2
    torch.testing.assert_close(divergence.overlap_token_advantage, torch.tensor([[0.25 * math.log(2)]]))
    divergence.loss.sum().backward()
    torch.testing.assert_close(student.grad, torch.tensor([[[-0.5, -0.25]]]))
    # A student with more mass than the teacher on the top-k: the sum is negative, clamped to 0
    low = torch.tensor([[[math.log(0.1), math.log(0.1)]]])
    high = torch.tensor([[[math.log(0.5), math.log(0.4)]]])
    assert forward_kl_topk(high, low, torch.tensor([[[3, 1]]]), torch.tensor([[[3, 1]]])).loss.item() == 0.0
    # log_prob_min_clamp=-1 floors the student's ln 0.25 and the teacher's ln 0.25 at -1
    clamped = forward_kl_topk(student.detach(), teacher, torch.tensor([[[3, 1]]]), torch.tensor([[[3, 1]]]), -1.0)
    expected = 0.5 * (math.log(0.5) + 1.0) + math.exp(-1.0) * (-1.0 - math.log(0.5))
    torch.testing.assert_close(clamped.loss, torch.tensor([[expected]]))
    metrics = topk_metrics(divergence, torch.ones(1, 1), 2)
    assert metrics["distillation/overlap_ratio"] == 0.5
    assert metrics["distillation/student_mass"] == pytest.approx(0.75)


def test_reverse_kl_estimators_pinned():
    student, teacher = torch.tensor([-1.0]), torch.tensor([-2.0])
    assert reverse_kl_estimate(student, teacher, "k1").item() == pytest.approx(1.0)
    # k3: exp(t - s) - (t - s) - 1 = e^-1 + 1 - 1
    assert reverse_kl_estimate(student, teacher, "k3").item() == pytest.approx(math.exp(-1.0))
    assert reverse_kl_estimate(student, teacher, "k2").item() == pytest.approx(0.5)


def test_loss_config_errors_name_the_key():
    assert DistillationLossConfig().errors() == []
    errors = DistillationLossConfig(loss_mode="k1").errors()
    assert len(errors) == 1 and "use_policy_gradient=true" in errors[0]
    assert DistillationLossConfig(loss_mode="k1", use_policy_gradient=True).errors() == []
    assert "loss_mode='js'" in DistillationLossConfig(loss_mode="js").errors()[0]
    assert "policy_loss_mode='gspo'" in DistillationLossConfig(policy_loss_mode="gspo").errors()[0]
    assert "topk=0" in DistillationLossConfig(loss_mode="forward_kl_topk", topk=0).errors()[0]
