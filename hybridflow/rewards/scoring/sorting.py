"""Synthetic sorting (``hybridflow.data.synthetic``): the response ends with ``#### <sorted items>``.

Items are separated by spaces (commas are accepted too); ``ground_truth`` is the sorted list as a string
such as ``"1 2 5 9"`` or ``"a c d"``.
"""

from __future__ import annotations

import re
from typing import Any

from hybridflow.rewards.scoring.answers import answer_after_hashes
from hybridflow.rewards.scoring.registry import SCORING_FUNCTIONS

_SEPARATORS = re.compile(r"[\s,]+")


def split_items(text: str) -> list[str]:
    return [item for item in _SEPARATORS.split(text.strip()) if item]


@SCORING_FUNCTIONS.register("sorting")
def compute_score(
    solution_str: str, ground_truth: Any, extra_info: dict | None = None, format_score: float = 0.0
) -> dict[str, Any]:
    """1.0 when the items after the last ``####`` are exactly ``ground_truth``; ``format_score`` otherwise."""
    answer = answer_after_hashes(solution_str)
    if not answer:
        return {"score": 0.0, "acc": 0.0, "pred": ""}
    predicted = split_items(answer)
    correct = predicted == split_items(str(ground_truth))
    return {"score": 1.0 if correct else format_score, "acc": float(correct), "pred": " ".join(predicted)}
