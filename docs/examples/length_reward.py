"""A reward function file for ``custom_reward_function.path`` (verl's signature).

Dense on purpose: a random tiny model never answers a task right, so a 0/1 score gives it no signal;
this one rewards responses close to ``target_length`` characters.
"""

from typing import Any


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, target_length: int = 8
) -> dict[str, float]:
    """``1 - |len - target_length| / target_length``, floored at 0; ``acc`` is exact-match correctness."""
    distance = abs(len(solution_str.strip()) - target_length) / target_length
    return {"score": max(0.0, 1.0 - distance), "acc": float(solution_str.strip() == str(ground_truth))}
