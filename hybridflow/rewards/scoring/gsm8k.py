"""GSM8K (arXiv 2110.14168): the reference solution ends with ``#### <number>``.

Two ways to read a response, as in verl: ``strict`` takes the number right after the last ``####``;
``flexible`` takes the last number anywhere in the response. Numbers compare by exact value, so
``"1,200"``, ``"$1200"`` and ``"1200.0"`` all match ``"1200"``.
"""

from __future__ import annotations

from typing import Any

from hybridflow.rewards.scoring.answers import answer_after_hashes, last_number, leading_number, numbers_equal
from hybridflow.rewards.scoring.registry import SCORING_FUNCTIONS

GSM8K_METHODS = ("strict", "flexible")


def extract_gsm8k_answer(solution_str: str, method: str = "strict") -> str | None:
    """The predicted answer text, or None when the response has none in the requested form."""
    if method == "strict":
        after = answer_after_hashes(solution_str)
        return leading_number(after) if after is not None else None
    if method == "flexible":
        return last_number(solution_str)
    raise ValueError(f"gsm8k method={method!r} is not one of {list(GSM8K_METHODS)}")


@SCORING_FUNCTIONS.register("openai/gsm8k", "gsm8k")
def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict[str, Any]:
    """``score`` if the answer matches ``ground_truth``, ``format_score`` if one was given but is wrong, else 0."""
    predicted = extract_gsm8k_answer(solution_str, method)
    if predicted is None:
        return {"score": 0.0, "acc": 0.0, "pred": ""}
    correct = numbers_equal(predicted, ground_truth)
    return {"score": score if correct else format_score, "acc": float(correct), "pred": predicted}
