"""Rewards: rule-based scoring by ``data_source``, user functions by file path, and reward managers."""

from hybridflow.rewards.custom import CustomRewardError, load_custom_reward_function
from hybridflow.rewards.manager_file import load_reward_manager_class, manager_class_traits
from hybridflow.rewards.managers import (
    REWARD_MANAGERS,
    SCORE_ERRORS_METRIC,
    SCORE_TIMEOUTS_METRIC,
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    RewardResult,
    SampleScoring,
    build_reward_manager,
    manager_parameters,
    overlong_buffer_error,
    overlong_penalty,
)
from hybridflow.rewards.remote_judge import RemoteJudge, RemoteJudgeError, RemoteJudgeManager
from hybridflow.rewards.response_batch import RewardInputError
from hybridflow.rewards.scoring import (
    SCORING_FUNCTIONS,
    UnknownDataSourceError,
    check_data_sources,
    default_compute_score,
)
from hybridflow.rewards.validation import process_validation_metrics

__all__ = [
    "REWARD_MANAGERS",
    "SCORE_ERRORS_METRIC",
    "SCORE_TIMEOUTS_METRIC",
    "SCORING_FUNCTIONS",
    "BatchRewardManager",
    "CustomRewardError",
    "DAPORewardManager",
    "NaiveRewardManager",
    "RemoteJudge",
    "RemoteJudgeError",
    "RemoteJudgeManager",
    "RewardInputError",
    "RewardResult",
    "SampleScoring",
    "UnknownDataSourceError",
    "build_reward_manager",
    "check_data_sources",
    "default_compute_score",
    "load_custom_reward_function",
    "load_reward_manager_class",
    "manager_class_traits",
    "manager_parameters",
    "overlong_buffer_error",
    "overlong_penalty",
    "process_validation_metrics",
]
