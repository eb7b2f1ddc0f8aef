import functools
import logging
import re
import threading

import pytest
import torch

from hybridflow.registry import UnknownNameError
from hybridflow.rewards.managers import (
    FAILED_SHARE_METRIC,
    REWARD_MANAGERS,
    SCORE_ERRORS_METRIC,
    SCORE_TIMEOUTS_METRIC,
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    RewardCallError,
    RewardFunctionError,
    build_reward_manager,
    overlong_penalty,
)
from hybridflow.rewards.response_batch import RewardInputError
from hybridflow.rewards.scoring import UnknownDataSourceError

from .conftest import rollout_batch


@pytest.fixture
def managers():
    """Close every manager a test builds, so idle scoring threads do not pile up across tests."""
    built = []

    def build(name, tokenizer, compute_score=None, **options):
        manager = build_reward_manager(name, tokenizer, compute_score, **options)
        built.append(manager)
        return manager

    yield build
    for manager in built:
        manager.close()


def test_naive_places_each_score_on_the_last_response_token(tokenizer, managers):
    batch = rollout_batch(
        tokenizer,
        ["#### 4", "wrong #### 5", "#### 1 2 3"],
        ["arithmetic", "openai/gsm8k", "sorting"],
        ["4", "4", "1 2 3"],
        response_width=16,
    )
    scores, extra, metrics = managers("naive", tokenizer)(batch)
    lengths = [7, 13, 11]  # characters + EOS
    expected = torch.zeros(3, 16)
    expected[0, lengths[0] - 1] = 1.0
    expected[2, lengths[2] - 1] = 1.0
    assert scores.dtype == torch.float32 and torch.equal(scores, expected)
    assert extra["score"] == [1.0, 0.0, 1.0] and extra["acc"] == [1.0, 0.0, 1.0]
    assert extra["pred"] == ["4", "5", "1 2 3"]  # decoded without the EOS special token
    assert metrics == {SCORE_ERRORS_METRIC: 0.0, SCORE_TIMEOUTS_METRIC: 0.0, FAILED_SHARE_METRIC: 0.0}


def test_custom_functions_get_verls_arguments(tokenizer, managers):
    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return float(len(solution_str)) if data_source == "len" else {"score": 0.5, "tag": data_source}

    extra_infos = [{"index": 4}, {"k": 1}]
    batch = rollout_batch(tokenizer, ["abc", "xy"], ["len", "private"], ["g1", "g2"], extra_infos=extra_infos)
    scores, extra, _ = managers("naive", tokenizer, compute_score)(batch)
    assert sorted(seen, key=str) == [("len", "abc", "g1", {"index": 4}), ("private", "xy", "g2", {"k": 1})]
    assert scores[0, 3].item() == 3.0 and scores[1, 2].item() == 0.5
    assert extra == {"score": [3.0, 0.5], "tag": [0.0, "private"]}


def test_raising_and_hanging_functions_cost_only_their_sample(tokenizer, managers, caplog):
    release = threading.Event()

    def compute_score(data_source, solution_str, ground_truth, extra_info):
        if solution_str == "raise":
            raise ValueError("bad input")
        if solution_str == "hang":
            release.wait(30)
        if solution_str == "none":
            return None
        return 1.0

    batch = rollout_batch(tokenizer, ["ok", "raise", "hang", "none", "ok"], ["d"] * 5, ["x"] * 5)
    manager = managers("naive", tokenizer, compute_score, timeout_s=0.3, max_workers=2)
    with caplog.at_level(logging.WARNING, logger="hybridflow.rewards.failures"):
        scores, extra, metrics = manager(batch)
    release.set()
    assert extra["score"] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert scores.sum().item() == 2.0
    assert metrics == {SCORE_ERRORS_METRIC: 2.0, SCORE_TIMEOUTS_METRIC: 1.0, FAILED_SHARE_METRIC: 0.6}
    assert "scoring failed for 3 of 5 samples" in caplog.text and "ValueError: bad input" in caplog.text


def test_an_unknown_data_source_is_a_config_error_not_a_zero(tokenizer, managers):
    batch = rollout_batch(tokenizer, ["#### 4"], ["my/private_set"], ["4"])
    with pytest.raises(UnknownDataSourceError, match="custom_reward_function.path"):
        managers("naive", tokenizer)(batch)


def test_the_sources_a_manager_cannot_score_are_those_without_a_rule_unless_the_function_is_the_users(
    tokenizer, managers
):
    assert managers("naive", tokenizer).unscored_sources(["b", "gsm8k", "a", "b"]) == ["a", "b"]
    assert managers("naive", tokenizer, lambda *args: 1.0).unscored_sources(["b", "gsm8k"]) == []


def test_batch_manager_makes_one_call_with_lists(tokenizer, managers):
    calls = []

    def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
        calls.append((data_sources, solution_strs, ground_truths))
        return [float(s == g) for s, g in zip(solution_strs, ground_truths)]

    batch = rollout_batch(tokenizer, ["a", "b", "c"], ["d"] * 3, ["a", "x", "c"])
    scores, extra, metrics = managers("batch", tokenizer, compute_score)(batch)
    assert calls == [(["d"] * 3, ["a", "b", "c"], ["a", "x", "c"])]
    assert extra["score"] == [1.0, 0.0, 1.0] and scores[:, 1].tolist() == [1.0, 0.0, 1.0]
    assert metrics[SCORE_ERRORS_METRIC] == 0.0


def test_batch_manager_counts_a_wrong_length_result_for_every_sample(tokenizer, managers):
    batch = rollout_batch(tokenizer, ["a", "b"], ["d"] * 2, ["a", "b"])
    with pytest.raises(
        RewardFunctionError, match=r"failed on 2 of 2 samples.*returned \[1.0\], expected a list of 2 scores"
    ):
        managers("batch", tokenizer, lambda **lists: [1.0])(batch)


def half_fail(data_source, solution_str, ground_truth, extra_info):
    if solution_str in ("a", "b"):
        return 1.0
    raise KeyError("no answer")


def test_a_step_stops_once_the_failed_share_reaches_the_limit(tokenizer, managers):
    """Below max_failed_share the failures score 0 and are counted; at it the run stops with the first one."""
    batch = rollout_batch(tokenizer, ["a", "b", "c", "d"], ["d"] * 4, ["a"] * 4)
    _, extra, metrics = managers("naive", tokenizer, half_fail, max_failed_share=0.75)(batch)
    assert extra["score"] == [1.0, 1.0, 0.0, 0.0] and metrics[SCORE_ERRORS_METRIC] == 2.0
    assert metrics[FAILED_SHARE_METRIC] == 0.5
    with pytest.raises(RewardFunctionError, match=r"2 of 4 samples.*max_failed_share=0.5.*KeyError: 'no answer'"):
        managers("naive", tokenizer, half_fail, max_failed_share=0.5)(batch)


def returns_text(data_source, solution_str, ground_truth, extra_info):
    return "abc"


def test_a_batch_that_failed_entirely_stops_with_the_function_its_file_the_first_failure_and_the_fix(
    tokenizer, managers
):
    batch = rollout_batch(tokenizer, ["a", "b"], ["d", "e"], ["x"] * 2)
    with pytest.raises(RewardFunctionError) as raised:
        managers("naive", tokenizer, returns_text)(batch)
    line = returns_text.__code__.co_firstlineno
    assert str(raised.value) == (
        f"the reward function returns_text in {__file__}:{line} failed on 2 of 2 samples, at least "
        "reward_model.reward_kwargs.max_failed_share=1 of them; first: data_source 'd': returned 'abc' (str), "
        "expected a float or a dict with 'score'; fix it (custom_reward_function.path and .name choose it)"
    )


@pytest.mark.parametrize(
    "result, first",
    [
        ({"acc": 1.0}, "returned a dict with no 'score' (keys ['acc']), expected a float or a dict with 'score'"),
        ({"score": "high"}, "returned a dict with 'score': 'high' (str) (keys ['score']), expected a float or"),
        (None, "returned None (NoneType), expected a float or a dict with 'score'"),
        (ValueError("line one\nline two"), "ValueError: line one line two; fix it"),  # one line
    ],
)
def test_each_kind_of_failure_is_named_as_it_happened(tokenizer, managers, result, first):
    def compute_score(data_source, solution_str, ground_truth, extra_info):
        if isinstance(result, Exception):
            raise result
        return result

    batch = rollout_batch(tokenizer, ["a", "b"], ["d"] * 2, ["x"] * 2)
    with pytest.raises(RewardFunctionError, match=f"first: data_source 'd': {re.escape(first)}"):
        managers("naive", tokenizer, compute_score)(batch)


def test_a_batch_that_timed_out_names_the_time_limit_key(tokenizer, managers):
    release = threading.Event()
    batch = rollout_batch(tokenizer, ["a"], ["d"], ["x"])
    manager = managers("naive", tokenizer, lambda *sample: release.wait(30), timeout_s=0.2)
    try:
        with pytest.raises(
            RewardFunctionError,
            match=r"first: data_source 'd': still running after 0.2 s.*; make it "
            r"faster or raise \+reward_model.reward_kwargs.timeout_s \(now 0.2 s\)$",
        ):
            manager(batch)
    finally:
        release.set()


def test_a_registered_scorer_that_fails_points_at_the_ground_truth(tokenizer, managers):
    batch = rollout_batch(tokenizer, ["1+2"], ["countdown"], [None])
    with pytest.raises(
        RewardFunctionError,
        match=r"^the reward function compute_score in .*countdown.py:\d+ failed on 1 "
        r".*TypeError: .*check the rows' reward_model.ground_truth for "
        r"data_source 'countdown'",
    ):
        managers("naive", tokenizer)(batch)


@pytest.mark.parametrize(
    "name, function",
    [
        ("naive", lambda text: 1.0),
        ("naive", lambda a, b, c, d, e: 1.0),
        ("batch", lambda data_source, solution_str, ground_truth, extra_info: [1.0]),
    ],
)
def test_a_reward_function_that_cannot_take_the_managers_call_is_refused_when_built(
    tokenizer, managers, name, function
):
    with pytest.raises(RewardCallError, match="cannot be called as"):
        managers(name, tokenizer, function)


def test_reward_kwargs_the_function_does_not_take_are_refused_when_built(tokenizer, managers):
    """inspect.signature refuses such a partial (ValueError): its function is checked with the keywords."""
    function = functools.partial(returns_text, scale=2)
    with pytest.raises(
        RewardCallError,
        match=re.escape(
            "cannot be called as returns_text(_, _, _, _, scale=...) (got an unexpected keyword argument 'scale'); "
            "change its parameters to match (custom_reward_function.name names it, .reward_kwargs adds keywords)"
        ),
    ):
        managers("naive", tokenizer, function)


def test_batch_manager_defaults_to_the_registered_functions(tokenizer, managers):
    batch = rollout_batch(tokenizer, ["#### 4", "#### 3"], ["arithmetic", "gsm8k"], ["4", "4"])
    _, extra, _ = managers("batch", tokenizer)(batch)
    assert extra["acc"] == [1.0, 0.0]


@pytest.mark.parametrize("length, expected", [(10, 0.0), (12, 0.0), (13, -0.25), (14, -0.5), (16, -1.0), (20, -1.0)])
def test_overlong_penalty_by_hand(length, expected):
    # max 16, buffer 4: free up to 12 tokens, then -1/4 per token down to -1 at 16, and -1 past it as in the
    # paper (verl's manager would give 20 tokens -2.0).
    assert overlong_penalty(length, max_resp_len=16, overlong_buffer_len=4, penalty_factor=1.0) == expected
    assert overlong_penalty(length, 16, 4, penalty_factor=0.5) == expected * 0.5


def test_dapo_adds_the_overlong_penalty_to_the_score(tokenizer, managers):
    # Response lengths with EOS: 7 and 15 tokens; the second sits 3 tokens into a 4-token buffer.
    responses = ["#### 4", "#### 4" + " " * 8]
    batch = rollout_batch(tokenizer, responses, ["arithmetic"] * 2, ["4", "4"], response_width=16)
    manager = managers("dapo", tokenizer, max_resp_len=16, overlong_buffer_len=4, overlong_penalty_factor=1.0)
    scores, extra, metrics = manager(batch)
    assert extra["overlong_reward"] == [0.0, -0.75] and extra["overlong"] == [0.0, 1.0]
    assert scores[0, 6].item() == 1.0 and scores[1, 14].item() == 0.25
    assert metrics["reward/overlong_ratio"] == 0.5
    with pytest.raises(ValueError, match=r"overlong_buffer_len=0 must be in \(0, max_resp_len=16\]"):
        DAPORewardManager(tokenizer, max_resp_len=16, overlong_buffer_len=0)


def test_dapo_without_the_overlong_buffer_needs_no_length_and_scores_as_naive(tokenizer, managers):
    # verl's tests/workers/reward_manager/test_dapo_on_cpu.py: the buffer off needs no max_resp_len.
    batch = rollout_batch(tokenizer, ["#### 4", "#### 4" + " " * 8], ["arithmetic"] * 2, ["4", "4"], response_width=16)
    dapo = managers("dapo", tokenizer, max_resp_len=None)
    scores, extra, metrics = dapo(batch)
    naive_scores, naive_extra, naive_metrics = managers("naive", tokenizer)(batch)
    assert torch.equal(scores, naive_scores) and extra == naive_extra and metrics == naive_metrics
    assert "overlong_reward" not in extra and "reward/overlong_ratio" not in metrics


def test_dapo_with_the_overlong_buffer_needs_the_length(tokenizer):
    with pytest.raises(ValueError) as error:
        DAPORewardManager(tokenizer, max_resp_len=None, overlong_buffer_len=4)
    assert str(error.value) == (
        "overlong_buffer_len=4 needs max_resp_len, the response length limit the penalty counts back from; "
        "set data.max_response_length or reward_model.reward_kwargs.max_resp_len"
    )
    # verl's case: a limit shorter than the buffer is refused.
    with pytest.raises(ValueError, match=r"overlong_buffer_len=128 must be in \(0, max_resp_len=64\]"):
        DAPORewardManager(tokenizer, max_resp_len=64, overlong_buffer_len=128)


def test_reward_model_scores_pass_through(tokenizer, managers):
    batch = rollout_batch(tokenizer, ["a"], ["d"], ["a"])
    rm_scores = torch.zeros_like(batch.batch["responses"], dtype=torch.float32)
    rm_scores[0, 1] = 0.7
    batch.batch["rm_scores"] = rm_scores
    scores, _, _ = managers("naive", tokenizer)(batch)
    assert torch.equal(scores, rm_scores)


def test_an_empty_response_keeps_its_score_off_the_padding(tokenizer, managers):
    batch = rollout_batch(tokenizer, [""], ["d"], ["x"], response_width=4, eos=False)
    scores, _, _ = managers("naive", tokenizer, lambda *args: 1.0)(batch)
    assert scores.tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_a_batch_without_ground_truths_is_refused(tokenizer, managers):
    batch = rollout_batch(tokenizer, ["a"], ["d"], ["a"])
    batch.non_tensor_batch.pop("reward_model")
    with pytest.raises(RewardInputError, match="no non-tensor column 'reward_model'"):
        managers("naive", tokenizer)(batch)


def test_manager_names_and_options_are_checked(tokenizer):
    assert REWARD_MANAGERS.names() == ["batch", "dapo", "gdpo", "naive", "prime", "remote"]
    assert REWARD_MANAGERS.get("naive") is NaiveRewardManager and REWARD_MANAGERS.get("batch") is BatchRewardManager
    with pytest.raises(UnknownNameError) as error:
        build_reward_manager("prim", tokenizer)
    assert str(error.value).startswith("reward_model.reward_manager='prim' is not a registered reward manager")
    assert "prime" in str(error.value)
    with pytest.raises(TypeError, match=r"reward manager 'naive': .*'max_resp_len'.*its options are \[.*'timeout_s'"):
        build_reward_manager("naive", tokenizer, max_resp_len=3)


def test_num_examine_prints_samples_per_data_source(tokenizer, managers, capsys):
    batch = rollout_batch(tokenizer, ["#### 4", "#### 5", "#### 1"], ["arithmetic"] * 2 + ["sorting"], ["4", "4", "1"])
    managers("naive", tokenizer, num_examine=1)(batch)
    printed = capsys.readouterr().out
    assert printed.count("[arithmetic]") == 1 and printed.count("[sorting]") == 1
    assert "[response] '#### 4'" in printed


def test_a_manager_pickles_for_a_ray_actor_and_still_scores(tokenizer):
    from ray import cloudpickle

    manager = build_reward_manager("dapo", tokenizer, max_resp_len=16, overlong_buffer_len=4, timeout_s=5.0)
    manager(rollout_batch(tokenizer, ["#### 4"], ["arithmetic"], ["4"]))  # starts its scoring threads
    copy = cloudpickle.loads(cloudpickle.dumps(manager))
    _, extra, _ = copy(rollout_batch(tokenizer, ["#### 4"], ["arithmetic"], ["4"]))
    assert extra["score"] == [1.0] and copy.runner.timeout_s == 5.0
    manager.close()
    copy.close()


def test_verls_gdpo_manager_name_is_the_naive_manager():
    assert REWARD_MANAGERS.is_alias("gdpo") and REWARD_MANAGERS.get("gdpo") is REWARD_MANAGERS.get("naive")


def score_in_parts(manager, batch, parts):
    scoring = manager.start_batch()
    for rows in parts:
        scoring.add(rows, batch[rows])
    return scoring.finish(batch)


@pytest.mark.parametrize(
    "name, options",
    [("naive", {}), ("prime", {"timeout_s": 30.0}), ("dapo", {"max_resp_len": 16, "overlong_buffer_len": 4})],
)
def test_a_batch_scored_in_parts_as_they_finish_gets_the_whole_batchs_result(tokenizer, managers, name, options):
    responses = ["#### 4", "wrong #### 5", "#### 4" + " " * 8, "#### 1 2 3"]
    batch = rollout_batch(
        tokenizer,
        responses,
        ["arithmetic", "openai/gsm8k", "arithmetic", "sorting"],
        ["4", "4", "4", "1 2 3"],
        response_width=16,
    )
    manager = managers(name, tokenizer, **options)
    whole = manager(batch)
    parts = score_in_parts(manager, batch, [[3, 1], [0], [2]])
    assert torch.equal(parts.token_level_scores, whole.token_level_scores)
    assert parts.extra == whole.extra and parts.metrics == whole.metrics
    assert whole.extra["acc"] == [1.0, 0.0, 1.0, 1.0]


def test_parts_share_one_failure_count_and_must_cover_the_batch(tokenizer, managers):
    batch = rollout_batch(tokenizer, ["a", "b", "c", "d"], ["d"] * 4, ["a"] * 4)
    # Each part alone fails 1 of 2 samples; over the batch 2 of 4 failed: at max_failed_share=0.5, the run stops
    manager = managers("naive", tokenizer, half_fail, max_failed_share=0.5)
    with pytest.raises(RewardFunctionError, match=r"2 of 4 samples"):
        score_in_parts(manager, batch, [[0, 2], [1, 3]])
    with pytest.raises(RewardInputError, match="cover 3 row positions, not each of the batch's 4 rows once"):
        score_in_parts(managers("naive", tokenizer, half_fail), batch, [[0, 2], [1]])


def test_only_managers_that_score_each_sample_alone_stream(tokenizer, managers):
    streaming = {
        name: REWARD_MANAGERS.traits(name)["scores_each_sample"] for name in ("naive", "prime", "dapo", "batch")
    }
    assert streaming == {"naive": True, "prime": True, "dapo": True, "batch": False}
