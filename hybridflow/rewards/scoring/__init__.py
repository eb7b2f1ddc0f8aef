"""Rule-based scoring functions chosen by ``data_source``; importing this package registers all of them."""

from hybridflow.rewards.scoring import arithmetic, countdown, gsm8k, math_answer, math_dapo, sorting  # noqa: F401
from hybridflow.rewards.scoring.registry import (
    SCORING_FUNCTIONS,
    UnknownDataSourceError,
    check_data_sources,
    default_compute_score,
    resolve_scoring_function,
    unknown_data_sources,
)

__all__ = [
    "SCORING_FUNCTIONS",
    "UnknownDataSourceError",
    "check_data_sources",
    "default_compute_score",
    "resolve_scoring_function",
    "unknown_data_sources",
]
