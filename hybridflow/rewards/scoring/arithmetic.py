"""Synthetic arithmetic (``hybridflow.data.synthetic``): the response ends with ``#### <number>``."""

from __future__ import annotations

from typing import Any

from hybridflow.rewards.scoring.answers import answer_after_hashes, leading_number, numbers_equal
from hybridflow.rewards.scoring.registry import SCORING_FUNCTIONS


@SCORING_FUNCTIONS.register("arithmetic")
def compute_score(
    solution_str: str, ground_truth: Any, extra_info: dict | None = None, format_score: float = 0.0
) -> dict[str, Any]:
    """1.0 when the number after the last ``####`` equals ``ground_truth``; ``format_score`` if it differs."""
    after = answer_after_hashes(solution_str)
    predicted = leading_number(after) if after is not None else None
    if predicted is None:
        return {"score": 0.0, "acc": 0.0, "pred": ""}
    correct = numbers_equal(predicted, ground_truth)
    return {"score": 1.0 if correct else format_score, "acc": float(correct), "pred": predicted}
