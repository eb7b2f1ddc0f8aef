"""The engine registry with every built-in engine in it: importing the engine modules registers them."""

from hybridflow.rollout import hf_engine, vllm_engine  # noqa: F401 - registers "hf" and "vllm"
from hybridflow.rollout.base import ROLLOUT_ENGINES, create_rollout_engine

__all__ = ["ROLLOUT_ENGINES", "create_rollout_engine"]
