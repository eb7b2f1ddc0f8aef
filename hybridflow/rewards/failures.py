"""What the scoring calls of a batch produced: each sample's score dict, the failures counted, and the line that
stops a run whose batch failed too often.

A call fails when it raises, runs past its time limit, or returns something other than a number or a dict with
a numeric ``"score"``. Its sample scores 0; the batch's counters are ``reward/score_errors``,
``reward/score_timeouts`` and their share of the batch, ``reward/failed_share``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import numbers
from typing import Any, Callable, NamedTuple

from hybridflow.errors import HybridflowError
from hybridflow.rewards.timed_calls import CallOutcome

logger = logging.getLogger(__name__)

SCORE_ERRORS_METRIC = "reward/score_errors"
SCORE_TIMEOUTS_METRIC = "reward/score_timeouts"
FAILED_SHARE_METRIC = "reward/failed_share"
EXPECTED = "expected a float or a dict with 'score'"


class RewardFunctionError(HybridflowError, RuntimeError):
    """At least ``max_failed_share`` of a batch's scoring calls failed."""


class Failure(NamedTuple):
    """The first failed call of a batch: its sample's data_source and what the call gave."""

    data_source: str
    outcome: CallOutcome

    def __str__(self) -> str:
        return f"data_source {self.data_source!r}: {' '.join(self.outcome.error.split())}"  # one line


def as_score_dict(value: Any) -> dict[str, Any]:
    """A scoring function's float or dict result as a dict with a float ``"score"``; TypeError otherwise."""
    if isinstance(value, dict):
        if not isinstance(value.get("score"), numbers.Real):
            score = "no 'score'" if "score" not in value else f"'score': {_shown(value['score'])}"
            raise TypeError(f"returned a dict with {score} (keys {sorted(map(str, value))}), {EXPECTED}")
        return {**value, "score": float(value["score"])}
    if isinstance(value, numbers.Real):
        return {"score": float(value)}
    raise TypeError(f"returned {_shown(value)}, {EXPECTED}")


def _shown(value: Any) -> str:
    """``'abc' (str)``: a value's repr, cut to 60 characters, and its type."""
    text = repr(value)
    return f"{text[:57] + '...' if len(text) > 60 else text} ({type(value).__name__})"


def results_from_outcomes(
    outcomes: list[CallOutcome], data_sources: list[str]
) -> tuple[list[dict[str, Any]], dict[str, float], Failure | None]:
    """Each sample's score dict (0 where its call failed), the failure metrics, and the first failure."""
    results, errors, timeouts, first = [], 0, 0, None
    for outcome, source in zip(outcomes, data_sources):
        if outcome.status == "ok":
            try:
                results.append(as_score_dict(outcome.value))
                continue
            except TypeError as error:
                outcome = CallOutcome("error", error=str(error))
        errors += outcome.status == "error"
        timeouts += outcome.status == "timeout"
        first = first or Failure(str(source), outcome)
        results.append({"score": 0.0})
    if first:
        logger.warning(
            "scoring failed for %d of %d samples (they score 0); first: %s", errors + timeouts, len(outcomes), first
        )
    metrics = {
        SCORE_ERRORS_METRIC: float(errors),
        SCORE_TIMEOUTS_METRIC: float(timeouts),
        FAILED_SHARE_METRIC: (errors + timeouts) / len(outcomes) if outcomes else 0.0,
    }
    return results, metrics, first


def function_name(function: Callable[..., Any]) -> str:
    """``compute_score in /path/reward.py:3``: a function (a partial's own) by name and where it is defined."""
    function = function.func if isinstance(function, functools.partial) else function
    name = getattr(function, "__qualname__", None) or repr(function)
    try:
        file, line = inspect.getsourcefile(function), inspect.getsourcelines(function)[1]
    except (TypeError, OSError):
        return name
    return f"{name} in {file}:{line}" if file else name


def failure_message(
    scorer: str, custom: bool, first: Failure, failed: int, total: int, max_failed_share: float, timeout_s: float | None
) -> str:
    """The line that stops the run: which function failed how often, the first failure, and the key to change.
    ``custom``: the function is the user's (``custom_reward_function``), not one registered for a data_source."""
    if first.outcome.status == "timeout":
        fix = f"make it faster or raise +reward_model.reward_kwargs.timeout_s (now {timeout_s:g} s)"
    elif custom:
        fix = "fix it (custom_reward_function.path and .name choose it)"
    else:
        fix = (
            f"check the rows' reward_model.ground_truth for data_source {first.data_source!r}, or score them "
            "with your own function (custom_reward_function.path)"
        )
    return (
        f"the reward function {scorer} failed on {failed} of {total} samples, at least "
        f"reward_model.reward_kwargs.max_failed_share={max_failed_share:g} of them; first: {first}; {fix}"
    )
