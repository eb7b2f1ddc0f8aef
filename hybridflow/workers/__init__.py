"""Role workers, each SPMD inside: ``ActorRolloutRefWorker`` (actor | rollout | ref, any mix, one
process), ``CriticWorker`` and ``RewardModelWorker``; FSDP2 sharding, checkpoints and weight sync.

The names below load their modules on first use, so the config schema (``workers.config``) is read without
loading the models and engines.
"""

from hybridflow.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "actor_rollout_ref": ["ROLE_PARTS", "ActorRolloutRefWorker", "MissingPartError"],
        "config": [
            "ActorConfig",
            "ActorRolloutRefConfig",
            "CheckpointConfig",
            "CriticConfig",
            "CriticModelConfig",
            "FSDPConfig",
            "LoraOptionsConfig",
            "MixedPrecisionConfig",
            "ModelConfig",
            "OptimConfig",
            "OverlongBufferConfig",
            "PolicyModelConfig",
            "RefConfig",
            "RewardModelConfig",
            "RewardModelModelConfig",
            "WorkerConfigError",
            "as_config",
        ],
        "critic": ["CriticWorker"],
        "reward_model": ["RewardModelWorker"],
    },
)
