"""Countdown (as in TinyZero): combine the given numbers with ``+ - * /`` to reach a target.

The response ends with ``#### <expression>``. ``ground_truth`` is ``{"target": int, "numbers": [int, ...]}``.
Each given number may be used at most once; the expression is evaluated with ``ast`` (see expression.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hybridflow.rewards.scoring.answers import answer_after_hashes
from hybridflow.rewards.scoring.expression import ExpressionError, evaluate_expression
from hybridflow.rewards.scoring.registry import SCORING_FUNCTIONS


def uses_allowed_numbers(used: list[int], available: list[int]) -> bool:
    """True when every number in ``used`` comes from ``available``, each at most as often as it appears."""
    return not (Counter(used) - Counter(available))


@SCORING_FUNCTIONS.register("countdown")
def compute_score(
    solution_str: str, ground_truth: Any, extra_info: dict | None = None, format_score: float = 0.1
) -> dict[str, Any]:
    """1.0 for a valid expression equal to the target; ``format_score`` for any other well-formed expression."""
    target = int(ground_truth["target"])
    available = [int(number) for number in ground_truth["numbers"]]
    expression = answer_after_hashes(solution_str)
    if not expression:
        return {"score": 0.0, "acc": 0.0, "pred": ""}
    # "3*5+7=22" is fine: only the left-hand side is the answer.
    expression = expression.split("=", 1)[0]
    try:
        value, used = evaluate_expression(expression)
    except ExpressionError:
        return {"score": 0.0, "acc": 0.0, "pred": expression}
    correct = value == target and uses_allowed_numbers(used, available)
    return {"score": 1.0 if correct else format_score, "acc": float(correct), "pred": expression}
