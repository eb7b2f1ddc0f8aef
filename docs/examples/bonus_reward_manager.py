"""A reward manager class for ``reward.reward_manager.source=importlib`` (verl's loading of a manager from a file).

It subclasses hybridflow's ``NaiveRewardManager``, the interface the driver calls, and changes only what it
needs: each sample's result after the scoring function ran. Its own constructor option ``bonus`` is set with
``+reward.reward_kwargs.bonus=...``.
"""

from typing import Any

from hybridflow.rewards import NaiveRewardManager


class BonusRewardManager(NaiveRewardManager):
    """Naive scoring (one ``compute_score`` call per sample), plus ``bonus`` on every sample's score."""

    def __init__(
        self,
        tokenizer: Any,
        compute_score=None,
        num_examine: int = 0,
        reward_fn_key: str = "data_source",
        bonus: float = 0.0,
    ):
        super().__init__(tokenizer, compute_score, num_examine, reward_fn_key=reward_fn_key)
        self.bonus = bonus

    def score(self, responses, outcomes):
        results, metrics = super().score(responses, outcomes)
        return [{**result, "score": result["score"] + self.bonus} for result in results], metrics
