"""Decoding on several threads (``decode_threads``): the same samples as one thread, each prompt prefilled
once, each thread with its share of the torch threads and the caller's left as they were."""

import threading

import pytest
import torch

from hybridflow.rollout import GenerationRequest, SamplingParams, hf_engine
from tests.float_bounds import longest_reduction, model_output_bound


def grpo_requests(tokenizer, prompts=6, samples=4):
    return [
        GenerationRequest(
            tokenizer.encode(f"prompt number {p} " * (1 + p % 3)), SamplingParams(max_new_tokens=12, seed=10 * p + k)
        )
        for p in range(prompts)
        for k in range(samples)
    ]


@pytest.fixture
def two_torch_threads():
    torch.set_num_threads(2)  # the rollout conftest's fixture restores the previous count


def test_two_decode_threads_draw_the_samples_of_one_and_prefill_each_prompt_once(
    make_engine, tokenizer, two_torch_threads
):
    requests = grpo_requests(tokenizer)
    one = make_engine(decode_threads=1).generate_batch(requests)
    engine = make_engine(decode_threads=2)
    prefill_rows, seen = [], []

    def record(module, args, kwargs):
        seen.append((threading.current_thread().ident, torch.get_num_threads()))
        if kwargs["input_ids"].shape[1] > 1:
            prefill_rows.append(kwargs["input_ids"].shape[0])

    engine.model.register_forward_pre_hook(record, with_kwargs=True)
    two = engine.generate_batch(requests)

    assert sum(prefill_rows) == 6, "six distinct prompts, four samples each, split between the threads"
    threads = {ident for ident, _ in seen}
    assert len(threads) == 2 and {count for _, count in seen} == {1}, "two decode threads of one torch thread each"
    assert [r.token_ids for r in two] == [r.token_ids for r in one]
    expected = torch.tensor([lp for r in one for lp in r.log_probs])
    bound = model_output_bound(expected, longest_reduction(engine.model.config))
    torch.testing.assert_close(torch.tensor([lp for r in two for lp in r.log_probs]), expected, atol=bound, rtol=0)


def test_the_decode_threads_leave_the_callers_torch_threads_and_new_threads_default(make_engine, two_torch_threads):
    make_engine(decode_threads=2)
    in_new_thread = []
    thread = threading.Thread(target=lambda: in_new_thread.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert torch.get_num_threads() == 2 and in_new_thread == [2]


def test_decode_threads_zero_picks_one_per_torch_thread_for_small_models_only(
    make_engine, two_torch_threads, monkeypatch
):
    assert len(make_engine()._scheduler.schedulers) == 2
    assert len(make_engine(decode_threads=3)._scheduler.schedulers) == 3
    monkeypatch.setattr(hf_engine, "SMALL_MODEL_PARAMETERS", 1000)
    assert len(make_engine()._scheduler.schedulers) == 1


def test_lone_requests_of_one_prompt_go_to_one_decode_thread(make_engine, tokenizer, two_torch_threads):
    """The agent loop submits samples one by one: those of one prompt still meet in one batch."""
    engine = make_engine(decode_threads=2)
    received = []
    for index, scheduler in enumerate(engine._scheduler.schedulers):
        submit_all = scheduler.submit_all
        scheduler.submit_all = lambda requests, index=index, submit_all=submit_all: (
            received.extend((index, tuple(r.prompt_ids)) for r in requests) or submit_all(requests)
        )
    futures = [engine._scheduler.submit(request) for request in grpo_requests(tokenizer, prompts=4, samples=3)]
    assert all(future.result().token_ids for future in futures)
    by_prompt = {}
    for index, prompt in received:
        by_prompt.setdefault(prompt, set()).add(index)
    assert len(by_prompt) == 4 and all(len(indices) == 1 for indices in by_prompt.values())
