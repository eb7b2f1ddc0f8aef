"""The remote judge (``reward_model.reward_manager=remote``) against a real HTTP server on the loopback address."""

import time

import pytest

from hybridflow.rewards import RemoteJudgeManager
from hybridflow.rewards.failures import RewardFunctionError
from hybridflow.rewards.managers import RewardCallError

from .conftest import rollout_batch
from .judge_server import dead_url, judge_server

RESPONSES, TRUTHS = ["the answer is 7", "it is 3", "maybe 12"], ["7", "4", "12"]


def remote(tokenizer, url, **options):
    """The manager with quick retries, as a test wants them."""
    return RemoteJudgeManager(tokenizer, url=url, **{"timeout_s": 5.0, "retry_backoff_s": 0.01, **options})


def batch_of(tokenizer, responses=RESPONSES, truths=TRUTHS):
    return rollout_batch(tokenizer, responses, ["arithmetic"] * len(responses), truths)


def failure_line(tokenizer, url, responses=RESPONSES, **options) -> tuple[str, float]:
    """The one line a batch that every request failed stops with, and the seconds it took."""
    start = time.monotonic()
    with pytest.raises(RewardFunctionError) as stopped:
        remote(tokenizer, url, **options)(batch_of(tokenizer, responses, TRUTHS[: len(responses)]))
    line = str(stopped.value)
    assert "\n" not in line and f"the remote judge at {url} failed on {len(responses)} of {len(responses)}" in line
    return line, time.monotonic() - start


def test_each_sample_is_posted_and_scored_by_the_server(tokenizer):
    with judge_server() as server:
        manager = remote(tokenizer, server.url)
        result = manager(batch_of(tokenizer))
        manager.close()
    samples = sorted(server.requests, key=lambda sample: sample["extra_info"]["index"])
    assert [sample["response"] for sample in samples] == manager.read(batch_of(tokenizer)).solution_strs
    assert result.extra["score"] == [1.0, 0.0, 1.0]
    assert result.token_level_scores.sum(-1).tolist() == [1.0, 0.0, 1.0]
    assert result.extra["length"] == [len(sample["response"]) for sample in samples]  # the answer's extra field
    assert [sample["ground_truth"] for sample in samples] == TRUTHS
    assert {sample["data_source"] for sample in samples} == {"arithmetic"}
    assert {sample["prompt"] for sample in samples} == {tokenizer.decode([65, 66])}  # padding left out
    assert result.metrics["reward/score_errors"] == result.metrics["reward/score_timeouts"] == 0.0


def test_a_batch_scored_in_parts_as_generation_finishes_them_scores_as_a_whole(tokenizer):
    batch = batch_of(tokenizer)
    with judge_server() as server:
        manager = remote(tokenizer, server.url)
        scoring = manager.start_batch()
        for rows in ([2], [0, 1]):
            scoring.add(rows, batch[rows])
        result = scoring.finish(batch)
    assert result.extra["score"] == [1.0, 0.0, 1.0] and len(server.requests) == 3
    assert result.extra["length"] == [len(text) for text in manager.read(batch).solution_strs]


def test_transient_503_answers_are_retried(tokenizer):
    with judge_server(fail_first=2) as server:
        result = remote(tokenizer, server.url, max_retries=2, max_concurrent=1)(batch_of(tokenizer))
    assert result.extra["score"] == [1.0, 0.0, 1.0]
    assert len(server.requests) == 3 + 2  # the first sample answered on its third attempt
    assert result.metrics["reward/score_errors"] == 0.0


def test_a_server_that_stays_busy_fails_after_every_attempt(tokenizer):
    with judge_server(fail_first=100) as server:
        line, _ = failure_line(tokenizer, server.url, max_retries=1)
    assert "failed on all 2 attempts (reward_model.reward_kwargs.max_retries=1)" in line
    assert "HTTP 503, body 'busy'" in line
    assert len(server.requests) == 2 * 3


@pytest.mark.parametrize(
    "max_concurrent, hold, expected",
    [(3, {"delay_s": 10, "gather": 3, "hold_s": 0.2}, 3), (64, {"delay_s": 10, "gather": 12}, 12)],
    ids=["bounded", "all-at-once"],
)
def test_requests_in_flight_are_bounded_and_a_batch_is_sent_together(tokenizer, max_concurrent, hold, expected):
    """12 samples, the first held until ``gather`` are in flight together (10 s at most): 3 of them with
    max_concurrent=3, never more though each stays 0.2 s; below the bound, all 12 at once."""
    responses = [f"answer {i}" for i in range(12)]
    batch = rollout_batch(tokenizer, responses, ["arithmetic"] * 12, [str(i) for i in range(12)])
    start = time.monotonic()
    with judge_server(**hold) as server:
        result = remote(tokenizer, server.url, max_concurrent=max_concurrent, timeout_s=20.0)(batch)
    assert server.max_in_flight == expected and time.monotonic() - start < 8
    assert len(server.requests) == 12 and result.extra["score"] == [1.0] * 12


def test_a_slow_server_hits_the_time_limit(tokenizer):
    with judge_server(delay_s=30) as server:
        line, seconds = failure_line(tokenizer, server.url, timeout_s=0.3)
        assert len(server.requests) == 3  # a request past the limit is not sent again
    assert f"POST {server.url} got no answer within 0.3 s (reward_model.reward_kwargs.timeout_s)" in line
    assert seconds < 5


def test_a_request_past_the_limit_scores_0_and_is_counted(tokenizer):
    """The reward managers' convention: a failed sample scores 0 and counts; the batch goes on."""
    with judge_server(delay_s=30, slow_when="slow") as server:
        batch = batch_of(tokenizer, ["slow 1", "fast 2"], ["1", "2"])
        result = remote(tokenizer, server.url, timeout_s=1.0)(batch)
    assert result.extra["score"] == [0.0, 1.0]
    assert result.metrics["reward/score_timeouts"] == 1.0 and result.metrics["reward/failed_share"] == 0.5


def test_a_dead_server_is_one_line_naming_the_url_and_the_attempts(tokenizer):
    url = dead_url()
    line, seconds = failure_line(tokenizer, url, max_retries=2)
    assert f"POST {url} failed on all 3 attempts" in line and "ConnectionRefusedError" in line
    assert "is the judge server up and answering at reward_model.reward_kwargs.url?" in line
    assert seconds < 5


@pytest.mark.parametrize("body", [b"<html>not a score</html>", b'{"verdict": "yes"}', b'{"score": true}'])
def test_a_malformed_answer_shows_the_start_of_the_body(tokenizer, body):
    with judge_server(body=body) as server:
        line, _ = failure_line(tokenizer, server.url)
    assert f"POST {server.url} answered a body that is not a JSON number or an object with a numeric 'score'" in line
    assert repr(body.decode()) in line
    assert len(server.requests) == 3  # an answer is not retried


def test_a_4xx_answer_is_not_retried(tokenizer):
    with judge_server(status=404, body=b"no such route") as server:
        line, _ = failure_line(tokenizer, server.url, max_retries=2)
    assert "answered HTTP 404, body 'no such route' (not retried)" in line
    assert len(server.requests) == 3


def test_a_long_body_is_cut_in_the_line(tokenizer):
    with judge_server(body=b"x" * 5000) as server:
        line, _ = failure_line(tokenizer, server.url, responses=["7"])
    assert repr("x" * 200) + "..." in line and "x" * 201 not in line


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"url": "ftp://judge/score"}, "reward_model.reward_kwargs.url='ftp://judge/score' must be"),
        ({"url": "127.0.0.1:8000"}, "http:// or https:// URL"),
        ({"max_concurrent": 0}, "reward_model.reward_kwargs.max_concurrent=0 must be an integer >= 1"),
        ({"timeout_s": 0}, "reward_model.reward_kwargs.timeout_s=0 must be a number > 0"),
        ({"max_retries": -1}, "reward_model.reward_kwargs.max_retries=-1 must be an integer >= 0"),
    ],
)
def test_options_that_cannot_work_are_refused(tokenizer, options, fragment):
    with pytest.raises(RewardCallError) as refused:
        RemoteJudgeManager(tokenizer, **{"url": "http://127.0.0.1:1/score", **options})
    assert fragment in str(refused.value)


def test_a_reward_function_is_refused(tokenizer):
    with pytest.raises(RewardCallError, match="not with custom_reward_function.path"):
        RemoteJudgeManager(tokenizer, lambda *args: 1.0, url="http://127.0.0.1:1/score")
