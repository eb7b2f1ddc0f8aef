import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.algos.scan import reverse_linear_scan, shift_left


def _loop(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    x = torch.zeros_like(a)
    following = torch.zeros_like(a[:, 0])
    for t in range(a.shape[1] - 1, -1, -1):
        following = a[:, t] + c[:, t] * following
        x[:, t] = following
    return x


def test_hand_case_discounted_sum():
    a = torch.tensor([[1.0, 2.0, 4.0]])
    c = torch.tensor([[0.5, 0.5, 0.5]])
    # x_2 = 4, x_1 = 2 + 2 = 4, x_0 = 1 + 2 = 3
    assert reverse_linear_scan(a, c).tolist() == [[3.0, 4.0, 4.0]]


def test_zero_coefficient_cuts_the_chain():
    a = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    c = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    assert reverse_linear_scan(a, c).tolist() == [[2.0, 1.0, 2.0, 1.0]]


def test_shift_left():
    assert shift_left(torch.tensor([[1, 2, 3]])).tolist() == [[2, 3, 0]]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 5), length=st.integers(1, 70))
def test_chunked_scan_equals_the_sequential_loop(seed, batch, length):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(batch, length, generator=generator, dtype=torch.float64)
    c = torch.rand(batch, length, generator=generator, dtype=torch.float64) * 1.2
    c[torch.rand(batch, length, generator=generator) < 0.2] = 0.0
    torch.testing.assert_close(reverse_linear_scan(a, c), _loop(a, c))
