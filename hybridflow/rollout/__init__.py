"""Rollout: engines behind one interface (generate, load weights, sleep/wake), the CPU default on transformers,
the agent loop for multi-turn rollouts with tools, and the tool registry.

The names below load their modules on first use, so the rollout config is read without loading transformers.
``ROLLOUT_ENGINES`` and ``create_rollout_engine`` come with the built-in engines registered: "hf" (always)
and "vllm" (needs ``hybridflow[vllm]``).
"""

from hybridflow.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "base": ["MissingExtraError", "RolloutEngine"],
        "config": ["MultiTurnConfig", "RolloutConfig", "RolloutConfigError", "SamplingParams", "ValKwargs"],
        "engines": ["ROLLOUT_ENGINES", "create_rollout_engine"],
        "hf_engine": ["HFRolloutEngine"],
        "requests": ["GenerationRequest", "GenerationResult"],
        "scheduler": ["EngineAsleepError"],
    },
)
