"""Rollout: engines behind one interface (generate, load weights, sleep/wake), the CPU default on transformers,
the agent loop for multi-turn rollouts with tools, and the tool registry.

Importing this package registers the built-in engines: "hf" (always) and "vllm" (needs ``hybridflow[vllm]``).
"""

from hybridflow.rollout import hf_engine, vllm_engine  # noqa: F401 - register the engines
from hybridflow.rollout.base import ROLLOUT_ENGINES, MissingExtraError, RolloutEngine, create_rollout_engine
from hybridflow.rollout.config import MultiTurnConfig, RolloutConfig, RolloutConfigError, SamplingParams, ValKwargs
from hybridflow.rollout.hf_engine import HFRolloutEngine
from hybridflow.rollout.requests import GenerationRequest, GenerationResult
from hybridflow.rollout.scheduler import EngineAsleepError

__all__ = [
    "ROLLOUT_ENGINES",
    "EngineAsleepError",
    "GenerationRequest",
    "GenerationResult",
    "HFRolloutEngine",
    "MissingExtraError",
    "MultiTurnConfig",
    "RolloutConfig",
    "RolloutConfigError",
    "RolloutEngine",
    "SamplingParams",
    "ValKwargs",
    "create_rollout_engine",
]
