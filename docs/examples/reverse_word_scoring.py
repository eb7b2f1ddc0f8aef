"""A scoring function for rows whose ``data_source`` is ``reverse_word`` (the data of reverse_word_data.py)."""

from typing import Any

from hybridflow.rewards import SCORING_FUNCTIONS


@SCORING_FUNCTIONS.register("reverse_word")
def compute_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict[str, Any]:
    """1.0 when the text after the last ``####`` is ``ground_truth``; also ``acc`` and ``pred``."""
    _, hashes, answer = solution_str.rpartition("####")
    predicted = answer.strip() if hashes else ""
    correct = predicted == str(ground_truth)
    return {"score": float(correct), "acc": float(correct), "pred": predicted}
