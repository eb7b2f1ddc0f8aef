"""A new advantage estimator: REINFORCE with the batch-mean score as baseline
(``algorithm.adv_estimator=batch_mean``)."""

from typing import Any

import torch

from hybridflow.algos import register_adv_est


@register_adv_est("batch_mean")  # add requires=("values",) / ("index",) / ("reward_baselines",) for those inputs
@torch.no_grad()
def compute_batch_mean_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``A_i = s_i - mean_j s_j`` on every response token of sample ``i``, where ``s_i`` is the sum of its
    ``token_level_rewards`` row [B, T]. Returns ``(advantages [B, T], returns [B, T])``, equal, 0 where
    ``response_mask`` is 0."""
    scores = token_level_rewards.sum(dim=-1)
    advantages = (scores - scores.mean()).unsqueeze(-1) * response_mask
    return advantages, advantages
