"""Role workers, each SPMD inside: ``ActorRolloutRefWorker`` (actor | rollout | ref, any mix, one
process), ``CriticWorker`` and ``RewardModelWorker``; FSDP2 sharding, checkpoints and weight sync.
"""

from hybridflow.workers.actor_rollout_ref import ROLE_PARTS, ActorRolloutRefWorker, MissingPartError
from hybridflow.workers.config import (
    ActorConfig,
    ActorRolloutRefConfig,
    CheckpointConfig,
    CriticConfig,
    CriticModelConfig,
    FSDPConfig,
    HybridEngineConfig,
    MixedPrecisionConfig,
    ModelConfig,
    OptimConfig,
    RefConfig,
    RewardModelConfig,
    RewardModelModelConfig,
    WorkerConfigError,
    as_config,
)
from hybridflow.workers.critic import CriticWorker
from hybridflow.workers.reward_model import RewardModelWorker

__all__ = [
    "ROLE_PARTS",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "ActorRolloutRefWorker",
    "CheckpointConfig",
    "CriticConfig",
    "CriticModelConfig",
    "CriticWorker",
    "FSDPConfig",
    "HybridEngineConfig",
    "MissingPartError",
    "MixedPrecisionConfig",
    "ModelConfig",
    "OptimConfig",
    "RefConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "RewardModelWorker",
    "WorkerConfigError",
    "as_config",
]
