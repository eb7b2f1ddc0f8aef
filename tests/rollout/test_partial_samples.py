"""Partial rollout on the hf engine: a call stops at the decode step where enough prompt groups have finished, the
rest keep what they drew, and a later call continues them to what one uninterrupted call draws."""

import dataclasses

import pytest
import torch

from hybridflow.rollout.partial_samples import PartialSample
from hybridflow.rollout.requests import FINISH_ABORT, FINISH_LENGTH
from tests.float_bounds import longest_reduction, model_output_bound

GREEDY = {"do_sample": False}


@pytest.fixture
def two_torch_threads():
    torch.set_num_threads(2)  # the rollout conftest's fixture restores the previous count


def samples_of(tokenizer, groups, n=2, required=()):
    return [
        PartialSample(
            tokenizer.encode(f"prompt number {g} " * (1 + g % 3)), seed=10 * g + k, group=g, required=g in required
        )
        for g in range(groups)
        for k in range(n)
    ]


def head_start(whole, group, drawn):
    """``whole``'s samples fresh, but those of ``group`` ``drawn`` tokens in (as an earlier call left them)."""
    return [
        dataclasses.replace(s, token_ids=s.token_ids[:drawn], log_probs=s.log_probs[:drawn], finish_reason=FINISH_ABORT)
        if s.group == group
        else dataclasses.replace(s, token_ids=[], log_probs=[], finish_reason=None)
        for s in whole
    ]


def test_a_call_ends_at_the_decode_step_where_enough_groups_have_finished(make_engine, tokenizer):
    engine = make_engine(response_length=16, ignore_eos=True)
    whole = engine.continue_samples(samples_of(tokenizer, groups=4), groups_needed=4, meta=GREEDY)
    # group 0 is 12 tokens in: it finishes after 4 more, and the others stop there, 4 tokens in
    out = engine.continue_samples(head_start(whole, group=0, drawn=12), groups_needed=1, meta=GREEDY)

    for sample in out:
        if sample.group == 0:
            assert sample.finish_reason == FINISH_LENGTH and len(sample.token_ids) == 16
        else:
            assert sample.finish_reason == FINISH_ABORT and len(sample.token_ids) == 4
        assert len(sample.log_probs) == len(sample.token_ids)
    assert engine.kv_cache_bytes() == 0, "the stop drops the KV cache"


def test_continued_samples_draw_what_one_uninterrupted_call_draws(make_engine, tokenizer):
    engine = make_engine(response_length=16, ignore_eos=True)
    whole = engine.continue_samples(samples_of(tokenizer, groups=4), groups_needed=4, meta=GREEDY)
    first = engine.continue_samples(head_start(whole, group=0, drawn=12), groups_needed=1, meta=GREEDY)
    rest = engine.continue_samples(first, groups_needed=4, meta=GREEDY)

    assert all(s.finished for s in whole + rest)
    assert [s.token_ids for s in rest] == [s.token_ids for s in whole]
    expected = torch.tensor([lp for s in whole for lp in s.log_probs])
    bound = model_output_bound(expected, longest_reduction(engine.model.config))
    torch.testing.assert_close(torch.tensor([lp for s in rest for lp in s.log_probs]), expected, atol=bound, rtol=0)


def test_two_decoders_each_stop_at_their_share_of_the_groups(make_engine, tokenizer, two_torch_threads):
    engine = make_engine(response_length=16, ignore_eos=True, decode_threads=2)
    whole = engine.continue_samples(samples_of(tokenizer, groups=4), groups_needed=4, meta=GREEDY)
    start = [
        dataclasses.replace(s, token_ids=s.token_ids[:12], log_probs=s.log_probs[:12], finish_reason=FINISH_ABORT)
        if s.group in (0, 1)
        else dataclasses.replace(s, token_ids=[], log_probs=[], finish_reason=None)
        for s in whole
    ]
    # groups 0 and 2 go to one decoder, 1 and 3 to the other (each group to the least loaded); one group each
    out = engine.continue_samples(start, groups_needed=2, meta=GREEDY)
    assert [len(s.token_ids) for s in out] == [16, 16, 16, 16, 4, 4, 4, 4]


def test_a_required_group_finishes_even_when_no_group_is_needed(make_engine, tokenizer):
    engine = make_engine(response_length=16, ignore_eos=True, max_num_seqs=2)
    out = engine.continue_samples(samples_of(tokenizer, groups=3, required=(2,)), groups_needed=0, meta=GREEDY)
    assert all(s.finished for s in out if s.group == 2)
    assert not any(s.required for s in out), "a call's requirement ends with it"


def test_finished_samples_are_returned_untouched(make_engine, tokenizer):
    engine = make_engine(response_length=8)
    done = PartialSample([1, 2, 3], seed=1, group=0, token_ids=[5], log_probs=[-0.5], finish_reason="eos")
    assert engine.continue_samples([done], groups_needed=1, meta={}) == [done]
