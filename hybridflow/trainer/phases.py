"""The phases of one PPO step after generation, each a small object picked once at start-up.

Whether a run has a critic, a reference policy or a KL term in the reward is decided when the trainer is
built: the absent ones are no-op objects with the same methods, so the step in ``RayPPOTrainer.fit``
reads the same for every algorithm and never re-checks the config. Each real phase times itself under
its metric name (``timing_s/ref``, ``timing_s/values``, ``timing_s/update_critic``).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

from hybridflow.algos.advantage_registry import estimator_inputs, get_adv_estimator_fn
from hybridflow.algos.kl import apply_kl_penalty
from hybridflow.algos.kl_controllers import get_kl_controller
from hybridflow.protocol import DataProto
from hybridflow.trainer import metric_names as names
from hybridflow.trainer.metrics import reduce_worker_metrics


class StepTimer:
    """Wall seconds per phase name; a phase entered twice in one step (DAPO regeneration) adds up."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - start)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds


def worker_metrics(output: DataProto, prefix: str) -> dict[str, float]:
    """A worker call's ``meta_info["metrics"]``, averaged and prefixed (``actor/``, ``critic/``)."""
    return names.with_prefix(prefix, reduce_worker_metrics(output.meta_info.get("metrics", {})))


class ReferencePolicy:
    """Phase 3b: ``ref_log_prob`` [B, R] from the frozen reference policy."""

    def __init__(self, worker_group: Any):
        self.worker_group = worker_group

    def log_probs(self, batch: DataProto, timer: StepTimer) -> DataProto:
        with timer(names.PHASE_REF):
            return batch.union(self.worker_group.compute_ref_log_prob(batch))


class NoReference:
    """No KL term: the reference policy is never built or called."""

    def log_probs(self, batch: DataProto, timer: StepTimer) -> DataProto:
        return batch


class Critic:
    """Phases 4 and 6: critic ``values`` [B, R] and the value-function update."""

    def __init__(self, worker_group: Any):
        self.worker_group = worker_group

    def values(self, batch: DataProto, timer: StepTimer) -> DataProto:
        with timer(names.PHASE_VALUES):
            return batch.union(self.worker_group.compute_values(batch))

    def update(self, batch: DataProto, timer: StepTimer) -> dict[str, float]:
        with timer(names.PHASE_UPDATE_CRITIC):
            return worker_metrics(self.worker_group.update_critic(batch), names.CRITIC_PREFIX)

    def save_checkpoint(self, path: str, global_step: int) -> None:
        self.worker_group.save_checkpoint(path, global_step)

    def load_checkpoint(self, path: str) -> None:
        self.worker_group.load_checkpoint(path)


class NoCritic:
    """The estimator needs no values (GRPO, RLOO, ...): nothing is built, computed or saved."""

    def values(self, batch: DataProto, timer: StepTimer) -> DataProto:
        return batch

    def update(self, batch: DataProto, timer: StepTimer) -> dict[str, float]:
        return {}

    def save_checkpoint(self, path: str, global_step: int) -> None:
        pass

    def load_checkpoint(self, path: str) -> None:
        pass


class KLInReward:
    """``token_level_rewards = token_level_scores - beta * KL(actor || ref)`` per token (Ziegler et al.,
    arXiv 1909.08593), with ``beta`` from a fixed or adaptive controller updated once per step."""

    def __init__(self, algorithm_config: Any):
        self.kind = algorithm_config.kl_penalty
        self.controller = get_kl_controller(algorithm_config.kl_ctrl)

    def __call__(self, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        tensors = batch.batch
        rewards, kl_metrics = apply_kl_penalty(
            tensors["token_level_scores"],
            tensors["old_log_probs"],
            tensors["ref_log_prob"],
            tensors["response_mask"],
            kl_coef=self.controller.value,
            kind=self.kind,
        )
        tensors["token_level_rewards"] = rewards
        self.controller.update(kl_metrics["reward_kl_penalty"], n_steps=len(batch))
        return batch, {
            names.KL_IN_REWARD: kl_metrics["reward_kl_penalty"],
            names.KL_COEF_IN_REWARD: kl_metrics["reward_kl_penalty_coeff"],
        }

    def state_dict(self) -> dict[str, float]:
        return {"kl_coef": self.controller.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.controller.value = state["kl_coef"]


class ScoresAsRewards:
    """No KL in the reward: ``token_level_rewards`` are the scores."""

    def __call__(self, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"].clone()
        return batch, {}

    def state_dict(self) -> dict[str, float]:
        return {}

    def load_state_dict(self, state: dict[str, float]) -> None:
        pass


# How each input an estimator may declare (hybridflow.algos.advantage_registry.ESTIMATOR_INPUTS) is read.
_ESTIMATOR_INPUT_READERS = {
    "values": lambda batch: batch.batch["values"],
    "index": lambda batch: batch.non_tensor_batch["uid"],
    "reward_baselines": lambda batch: batch.batch["reward_baselines"],
}


class AdvantageEstimator:
    """Phase 5: ``advantages`` and ``returns`` [B, R] by the estimator named in ``algorithm.adv_estimator``,
    given exactly the inputs it declared at registration."""

    def __init__(self, algorithm_config: Any):
        self.config = algorithm_config
        self.estimate = get_adv_estimator_fn(algorithm_config.adv_estimator)
        needed = estimator_inputs(algorithm_config.adv_estimator)
        self.readers = {name: _ESTIMATOR_INPUT_READERS[name] for name in needed}

    def __call__(self, batch: DataProto) -> DataProto:
        inputs = {name: read(batch) for name, read in self.readers.items()}
        advantages, returns = self.estimate(
            token_level_rewards=batch.batch["token_level_rewards"],
            response_mask=batch.batch["response_mask"],
            config=self.config,
            **inputs,
        )
        batch.batch["advantages"] = advantages
        batch.batch["returns"] = returns
        return batch
