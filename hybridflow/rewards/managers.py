"""Reward managers: score a batch of rollouts and return ``token_level_scores`` [B, R].

Picked by ``reward_model.reward_manager``: ``naive`` (one scoring call per sample), ``prime`` (naive's calls in
processes killed at their time limit), ``batch`` (one call with lists for the whole batch), ``dapo`` (naive plus
DAPO's overlong penalty, arXiv 2503.14476); or a subclass from the user's file (``manager_file``). Every manager is
called with a DataProto holding ``responses``, ``attention_mask`` (or ``response_mask``) and the non-tensor
columns ``data_source``, ``reward_model`` and ``extra_info``, and returns a ``RewardResult``. When the batch
already holds ``rm_scores`` (a reward model scored it), those are returned as they are, as in verl.

The managers that score each sample alone (all but ``batch``) can score a batch in parts while generation
still runs (``start_batch``: the driver hands each finished part to it), as verl's reward loop streams
rewards with the rollout; the result is the same as scoring the whole batch at the end.

A scoring call that raises, returns something other than a number or a dict with ``"score"``, or runs past
``timeout_s`` gives its sample a score of 0 and is counted in ``reward/score_errors`` or
``reward/score_timeouts``, their share of the batch in ``reward/failed_share`` (``rewards.failures``); the first
failure of each batch is logged. When at least ``max_failed_share`` of a batch's samples failed (default 1.0:
all of them), nothing could learn from it: :class:`RewardFunctionError` stops the run with the first failure,
the function that failed and the key to change. Training and validation batches alike.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np
import torch

from hybridflow.errors import HybridflowError
from hybridflow.registry import Registry
from hybridflow.rewards.failures import (
    FAILED_SHARE_METRIC,
    SCORE_ERRORS_METRIC,
    SCORE_TIMEOUTS_METRIC,
    Failure,
    RewardFunctionError,
    failure_message,
    function_name,
    results_from_outcomes,
)
from hybridflow.rewards.process_calls import ProcessCallRunner
from hybridflow.rewards.response_batch import (
    ResponseBatch,
    RewardInputError,
    join_response_batches,
    read_response_batch,
    scores_on_last_token,
)
from hybridflow.rewards.scoring import (
    check_data_sources,
    default_compute_score,
    resolve_scoring_function,
    unknown_data_sources,
)
from hybridflow.rewards.timed_calls import CallOutcome, TimedCallRunner

if TYPE_CHECKING:  # DataProto loads tensordict (~2 s): not needed to check a config
    from hybridflow.protocol import DataProto


# scores_each_sample: each sample is scored alone, so a batch can be scored in parts while the rest of it is generated
# (start_batch); a manager that scores whole batches does not. scores_with_function: it calls the user's function
# (custom_reward_function) or else each data_source's registered one; one that does not takes neither.
# option_errors: None, or options -> one line per option that cannot work, checked before anything starts.
REWARD_MANAGERS: Registry[type] = Registry(
    "reward manager",
    config_key="reward_model.reward_manager",
    traits={"scores_each_sample": True, "scores_with_function": True, "option_errors": None},
)


class RewardCallError(HybridflowError, TypeError):
    """The reward function cannot take the manager's call (checked when the manager is built)."""


class RewardResult(NamedTuple):
    """``token_level_scores`` [B, R] float32 (score on each last response token); ``extra``: per-sample
    lists of everything the scoring functions returned (always ``score``); ``metrics``: batch counters."""

    token_level_scores: torch.Tensor
    extra: dict[str, list]
    metrics: dict[str, float]


def collect_extra(results: list[dict[str, Any]]) -> dict[str, list]:
    """Per-key lists over samples; a sample that lacks a key (e.g. its scoring failed) gets 0.0 for it."""
    keys = dict.fromkeys(key for result in results for key in result)
    return {key: [result.get(key, 0.0) for result in results] for key in keys}


class NaiveRewardManager:
    """One call ``compute_score(data_source, solution_str, ground_truth, extra_info)`` per sample.

    ``compute_score=None`` scores with the function registered for each row's ``data_source``;
    ``num_examine`` prints that many scored samples per data_source per call; ``reward_fn_key`` is the
    non-tensor column naming the data source.
    """

    def __init__(
        self,
        tokenizer: Any,
        compute_score: Callable[..., Any] | None = None,
        num_examine: int = 0,
        timeout_s: float | None = 30.0,
        max_workers: int = 4,
        reward_fn_key: str = "data_source",
        max_failed_share: float = 1.0,
        num_workers: int = 0,
    ):
        if not 0 < max_failed_share <= 1:
            raise RewardCallError(f"reward_model.reward_kwargs.max_failed_share={max_failed_share} must be in (0, 1]")
        self.max_failed_share = max_failed_share
        self.tokenizer = tokenizer
        self.uses_registered_scoring = compute_score is None
        if compute_score is not None:
            check_call(compute_score, self.CALL)
        self.compute_score = compute_score or self.registered_compute_score
        self.num_examine = num_examine
        self.reward_fn_key = reward_fn_key
        self.timeout_s = timeout_s
        # reward.num_workers > 0: the calls in that many warm processes, killed at their limit (prime's runner)
        runner = ProcessCallRunner if num_workers > 0 else self.RUNNER
        self.runner = runner(max_workers=num_workers or max_workers, timeout_s=timeout_s)

    registered_compute_score = staticmethod(default_compute_score)
    # How a sample is scored: compute_score(data_source, solution_str, ground_truth, extra_info), positionally.
    CALL = ((None,) * 4, {})
    # Where: on threads (a call past its limit is abandoned, not killed).
    RUNNER: type = TimedCallRunner

    def __call__(self, data: DataProto) -> RewardResult:
        if "rm_scores" in data.batch.keys():
            return RewardResult(data.batch["rm_scores"], {}, {})
        responses = self.read(data)
        return self.result(responses, self.outcomes(responses))

    def unscored_sources(self, data_sources: list[str]) -> list[str]:
        """The ones of ``data_sources`` this manager cannot score: none with the user's function, else those
        without a registered one."""
        return unknown_data_sources(data_sources) if self.uses_registered_scoring else []

    def start_batch(self) -> "SampleScoring":
        """Score one batch part by part (``add``); ``finish`` then returns what calling the manager would."""
        return SampleScoring(self)

    def read(self, data: DataProto) -> ResponseBatch:
        """The decoded responses and what they are scored against."""
        responses = read_response_batch(data, self.tokenizer, self.reward_fn_key)
        if self.uses_registered_scoring:
            # An unknown data_source is a config error, not a failed sample: raise before scoring.
            check_data_sources(responses.data_sources)
        return responses

    def outcomes(self, responses: ResponseBatch) -> list[CallOutcome]:
        """One scoring call's outcome per sample."""
        calls = [
            functools.partial(self.compute_score, source, solution, truth, extra)
            for source, solution, truth, extra in zip(
                responses.data_sources, responses.solution_strs, responses.ground_truths, responses.extra_infos
            )
        ]
        return self.runner.run(calls)

    def result(self, responses: ResponseBatch, outcomes: list[CallOutcome]) -> RewardResult:
        """The batch's scores on their last tokens, extras and metrics, from every sample's outcome."""
        results, metrics = self.score(responses, outcomes)
        if self.num_examine:
            self._print_examples(responses, results)
        scores = [result["score"] for result in results]
        token_level_scores = scores_on_last_token(scores, responses.valid_response_lengths, responses.response_width)
        return RewardResult(token_level_scores, collect_extra(results), metrics)

    def score(
        self, responses: ResponseBatch, outcomes: list[CallOutcome]
    ) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """Each sample's result dict and the batch's metrics; stops the run when too many samples failed."""
        return self._results(outcomes, responses.data_sources)

    def _results(
        self, outcomes: list[CallOutcome], data_sources: list[str]
    ) -> tuple[list[dict[str, Any]], dict[str, float]]:
        results, metrics, first = results_from_outcomes(outcomes, data_sources)
        if first and metrics[FAILED_SHARE_METRIC] >= self.max_failed_share:
            failed = int(metrics[SCORE_ERRORS_METRIC] + metrics[SCORE_TIMEOUTS_METRIC])
            raise RewardFunctionError(self.failure_line(first, failed, len(outcomes)))
        return results, metrics

    def failure_line(self, first: Failure, failed: int, total: int) -> str:
        """The line that stops the run when ``failed`` of ``total`` samples failed, ``first`` the first of them."""
        custom = not self.uses_registered_scoring
        scorer = function_name(self.compute_score if custom else resolve_scoring_function(first.data_source))
        return failure_message(scorer, custom, first, failed, total, self.max_failed_share, self.timeout_s)

    def close(self) -> None:
        """Stop the idle scoring threads."""
        self.runner.close()

    def _print_examples(self, responses: ResponseBatch, results: list[dict[str, Any]]) -> None:
        printed: dict[str, int] = {}
        for source, solution, truth, result in zip(
            responses.data_sources, responses.solution_strs, responses.ground_truths, results
        ):
            if printed.get(source, 0) < self.num_examine:
                printed[source] = printed.get(source, 0) + 1
                print(f"[{source}] [response] {solution!r}\n[ground_truth] {truth!r} [score] {result}")


def check_call(compute_score: Callable[..., Any], call: tuple[tuple, dict], origin: str = "") -> None:
    """The manager's call must bind to ``compute_score``'s signature, or every sample would fail alike.
    ``origin`` says where the function comes from (e.g. its file), for the message."""
    function, (args, kwargs) = compute_score, call
    bound = isinstance(function, functools.partial)
    if bound:  # custom_reward_function.reward_kwargs: checked with the call, as the function will get them
        function, args, kwargs = function.func, (*function.args, *args), {**function.keywords, **kwargs}
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # a builtin or C callable: nothing to check ahead of the call
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        shown = ", ".join([*(["_"] * len(args)), *(f"{key}=..." for key in kwargs)])
        name = getattr(function, "__name__", repr(function))
        keys = "custom_reward_function.name names it" + (", .reward_kwargs adds keywords" if bound else "")
        raise RewardCallError(
            f"the reward function {name}{signature}{f' in {origin}' if origin else ''} cannot be called as "
            f"{name}({shown}) ({error}); change its parameters to match ({keys})"
        ) from None


def registered_batch_compute_score(
    data_sources: list[str], solution_strs: list[str], ground_truths: list[Any], extra_infos: list[dict | None]
) -> list[dict[str, Any]]:
    """The batch form of ``default_compute_score``: each sample scored by its data_source's function."""
    return [default_compute_score(*sample) for sample in zip(data_sources, solution_strs, ground_truths, extra_infos)]


class BatchRewardManager(NaiveRewardManager):
    """One call ``compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=) -> list`` per batch.

    For scorers that gain from seeing the whole batch (a remote verifier, a batched judge model). The time
    limit applies to that one call; if it fails, every sample of the batch scores 0 and is counted.
    """

    registered_compute_score = staticmethod(registered_batch_compute_score)
    CALL = ((), dict.fromkeys(("data_sources", "solution_strs", "ground_truths", "extra_infos")))

    def outcomes(self, responses: ResponseBatch) -> list[CallOutcome]:
        call = functools.partial(
            self.compute_score,
            data_sources=responses.data_sources,
            solution_strs=responses.solution_strs,
            ground_truths=responses.ground_truths,
            extra_infos=responses.extra_infos,
        )
        outcome = self.runner.run([call])[0]
        if outcome.status == "ok" and not _is_sequence_of_length(outcome.value, len(responses)):
            got = repr(outcome.value)[:200]
            outcome = CallOutcome("error", error=f"returned {got}, expected a list of {len(responses)} scores")
        if outcome.status == "ok":
            return [CallOutcome("ok", value) for value in outcome.value]
        return [outcome] * len(responses)


def _is_sequence_of_length(value: Any, length: int) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == length


def overlong_penalty(response_length: int, max_resp_len: int, overlong_buffer_len: int, penalty_factor: float) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, section 3.4, eq. 13).

    0 while ``response_length <= max_resp_len - overlong_buffer_len``; then falls linearly to
    ``-penalty_factor`` at ``max_resp_len`` and stays there beyond it. Differs from verl: verl's DAPO
    manager keeps falling past ``max_resp_len`` (-2 x factor at one buffer beyond); the paper caps it.
    """
    exceed = response_length - (max_resp_len - overlong_buffer_len)
    return max(min(-exceed / overlong_buffer_len * penalty_factor, 0.0), -penalty_factor)


def overlong_buffer_error(max_resp_len: int | None, overlong_buffer_len: int) -> str | None:
    """Why DAPO's overlong buffer cannot be used with these lengths, or None when it can."""
    if max_resp_len is None:
        return (
            f"overlong_buffer_len={overlong_buffer_len} needs max_resp_len, the response length limit the penalty "
            "counts back from; set data.max_response_length or reward_model.reward_kwargs.max_resp_len"
        )
    if 0 < overlong_buffer_len <= max_resp_len:
        return None
    return (
        f"overlong_buffer_len={overlong_buffer_len} must be in (0, max_resp_len={max_resp_len}]; "
        "it is the stretch of tokens before the length limit over which the penalty grows"
    )


class DAPORewardManager(NaiveRewardManager):
    """Naive scoring plus, when ``overlong_buffer_len`` is set, DAPO's overlong penalty (``extra`` then gains
    ``overlong_reward`` and ``overlong``).

    ``max_resp_len`` is the rollout's response length limit (``data.max_response_length``); responses in its
    last ``overlong_buffer_len`` tokens are penalised linearly up to ``overlong_penalty_factor``. As in verl
    (PR #6709), the length is needed only with the buffer on; without it the manager scores as ``naive``.
    """

    def __init__(
        self,
        tokenizer: Any,
        compute_score: Callable[..., Any] | None = None,
        num_examine: int = 0,
        timeout_s: float | None = 30.0,
        max_workers: int = 4,
        reward_fn_key: str = "data_source",
        max_failed_share: float = 1.0,
        num_workers: int = 0,
        *,
        max_resp_len: int | None = None,
        overlong_buffer_len: int | None = None,
        overlong_penalty_factor: float = 1.0,
    ):
        error = None if overlong_buffer_len is None else overlong_buffer_error(max_resp_len, overlong_buffer_len)
        if error:
            raise ValueError(error)
        super().__init__(
            tokenizer, compute_score, num_examine, timeout_s, max_workers, reward_fn_key, max_failed_share, num_workers
        )
        self.max_resp_len = max_resp_len
        self.overlong_buffer_len = overlong_buffer_len
        self.overlong_penalty_factor = overlong_penalty_factor

    def score(
        self, responses: ResponseBatch, outcomes: list[CallOutcome]
    ) -> tuple[list[dict[str, Any]], dict[str, float]]:
        results, metrics = super().score(responses, outcomes)
        if self.overlong_buffer_len is None:
            return results, metrics
        for result, length in zip(results, responses.valid_response_lengths):
            penalty = overlong_penalty(
                length, self.max_resp_len, self.overlong_buffer_len, self.overlong_penalty_factor
            )
            result["score"] += penalty
            result["overlong_reward"] = penalty
            result["overlong"] = float(penalty < 0)
        metrics["reward/overlong_ratio"] = sum(r["overlong"] for r in results) / max(len(results), 1)
        return results, metrics


class PrimeRewardManager(NaiveRewardManager):
    """verl's ``prime`` manager (the PRIME recipe's): naive's per-sample call, each in a process of a warm pool,
    killed with everything it started when it runs past ``timeout_s`` (300 s, verl's limit). For scorers that
    run untrusted code or can hang in C; a function with side effects keeps them in its process.
    Differs from verl: the pool stays up between steps (verl starts and kills 64 processes every batch), and
    ``max_workers`` (default 4), or ``reward.num_workers`` when set, sets its size."""

    RUNNER = ProcessCallRunner

    def __init__(
        self,
        tokenizer: Any,
        compute_score: Callable[..., Any] | None = None,
        num_examine: int = 0,
        timeout_s: float | None = 300.0,
        max_workers: int = 4,
        reward_fn_key: str = "data_source",
        max_failed_share: float = 1.0,
        num_workers: int = 0,
    ):
        super().__init__(
            tokenizer, compute_score, num_examine, timeout_s, max_workers, reward_fn_key, max_failed_share, num_workers
        )


class SampleScoring:
    """One batch scored part by part, as generation finishes its samples (``add``, each part's rows placed in
    the batch); ``finish`` returns what the manager returns for the whole batch, the failure share, printed
    examples and metrics taken over all of it."""

    def __init__(self, manager: NaiveRewardManager):
        self.manager = manager
        self._rows: list[np.ndarray] = []
        self._responses: list[ResponseBatch] = []
        self._outcomes: list[CallOutcome] = []

    def add(self, rows: Any, part: DataProto) -> None:
        """Score ``part``, whose row ``i`` is row ``rows[i]`` of the batch."""
        responses = self.manager.read(part)
        self._outcomes += self.manager.outcomes(responses)
        self._responses.append(responses)
        self._rows.append(np.asarray(rows, dtype=np.int64))

    def finish(self, data: DataProto) -> RewardResult:
        """The result for ``data``, the whole batch, every row of which an ``add`` scored once."""
        rows = np.concatenate(self._rows) if self._rows else np.zeros(0, dtype=np.int64)
        if not np.array_equal(np.sort(rows), np.arange(len(data))):
            raise RewardInputError(
                f"the parts scored cover {len(rows)} row positions, not each of the batch's {len(data)} rows once"
            )
        order = np.argsort(rows, kind="stable")
        responses = join_response_batches(self._responses, order)
        return self.manager.result(responses, [self._outcomes[i] for i in order])


REWARD_MANAGERS.add("naive", NaiveRewardManager)
REWARD_MANAGERS.add("prime", PrimeRewardManager)
REWARD_MANAGERS.add("batch", BatchRewardManager, scores_each_sample=False)
REWARD_MANAGERS.add("dapo", DAPORewardManager)
# verl's "gdpo" manager scores like "naive" and keeps every key of the scorer's dict, which GDPO's
# algorithm.gdpo_reward_keys then read; naive keeps them too.
REWARD_MANAGERS.add_alias("gdpo", "naive")


def _manager_class(manager: str | type) -> type:
    return REWARD_MANAGERS.get(manager) if isinstance(manager, str) else manager


def manager_parameters(manager: str | type) -> dict[str, inspect.Parameter]:
    """The options of the manager registered as ``manager`` (or of that class): its constructor's parameters
    after the tokenizer and ``compute_score``, by name (a parameter without a default is required)."""
    parameters = inspect.signature(_manager_class(manager)).parameters
    return {key: parameter for key, parameter in parameters.items() if key not in ("tokenizer", "compute_score")}


def build_reward_manager(
    manager: str | type, tokenizer: Any, compute_score: Callable[..., Any] | None = None, **options: Any
):
    """The manager registered as ``manager`` (``reward_model.reward_manager``), or that class (one loaded from
    the user's file), built with ``options``."""
    manager_class = _manager_class(manager)
    name = manager if isinstance(manager, str) else manager.__name__
    try:
        inspect.signature(manager_class).bind(tokenizer, compute_score, **options)
    except TypeError as error:
        options_list = list(manager_parameters(manager_class))
        raise TypeError(f"reward manager {name!r}: {error}; its options are {options_list}") from None
    return manager_class(tokenizer, compute_score, **options)
