import torch

from hybridflow.rollout.config import SamplingParams
from hybridflow.rollout.sampling import RowSampling, sample_next_tokens


def _generators(count, seed=0):
    return [torch.Generator().manual_seed(seed + i) for i in range(count)]


def _draw(logits, params, draws, seed=0):
    rows = RowSampling.from_params([params])
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([sample_next_tokens(logits, rows, [generator])[0] for _ in range(draws)]).squeeze(1)


def test_greedy_rows_take_the_argmax_next_to_sampled_rows():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    params = [
        SamplingParams(do_sample=False),
        SamplingParams(),
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=3),
    ]
    tokens, log_probs = sample_next_tokens(logits, RowSampling.from_params(params), _generators(4))
    assert tokens[0] == logits[0].argmax() and tokens[2] == logits[2].argmax()
    assert tokens[3] in logits[3].topk(3).indices
    expected = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    torch.testing.assert_close(log_probs, expected)


def test_frequencies_follow_softmax_of_logits_over_temperature():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    tokens = _draw(logits, SamplingParams(temperature=0.5), 4000)
    frequencies = torch.bincount(tokens, minlength=4).float() / 4000
    torch.testing.assert_close(frequencies, torch.softmax(logits[0] / 0.5, dim=-1), atol=0.03, rtol=0)


def test_top_k_and_top_p_restrict_the_candidates():
    logits = torch.tensor([[3.0, 2.5, 2.0, 1.0, 0.0]])
    assert set(_draw(logits, SamplingParams(top_k=2), 300).tolist()) == {0, 1}
    probs = torch.softmax(logits[0], dim=-1)
    top_p = float(probs[:3].sum()) - 1e-3  # needs exactly the three most likely tokens
    assert set(_draw(logits, SamplingParams(top_p=top_p), 500).tolist()) == {0, 1, 2}
    assert set(_draw(logits, SamplingParams(top_p=0.01), 50).tolist()) == {0}


def test_log_probs_are_taken_before_filtering_at_the_temperature():
    logits = torch.tensor([[3.0, 2.5, 2.0, 1.0, 0.0]])
    rows = RowSampling.from_params([SamplingParams(temperature=0.8, top_k=2)])
    token, log_prob = sample_next_tokens(logits, rows, _generators(1))
    torch.testing.assert_close(log_prob, torch.log_softmax(logits / 0.8, dim=-1)[0, token])


def test_each_row_draws_from_its_own_generator():
    logits = torch.zeros(3, 1000)
    rows = RowSampling.from_params([SamplingParams()] * 3)
    together, _ = sample_next_tokens(logits, rows, _generators(3, seed=10))
    alone, _ = sample_next_tokens(logits[1:2], rows.select(torch.tensor([1])), [torch.Generator().manual_seed(11)])
    assert together[1] == alone[0]


def test_a_row_draws_the_same_whatever_its_neighbours_filter():
    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(5))
    plain = RowSampling.from_params([SamplingParams(), SamplingParams()])
    mixed = RowSampling.from_params([SamplingParams(), SamplingParams(top_k=5, top_p=0.5)])
    a, _ = sample_next_tokens(logits, plain, _generators(2))
    b, _ = sample_next_tokens(logits, mixed, _generators(2))
    assert a[0] == b[0]
