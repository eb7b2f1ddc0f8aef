"""Phases 3 to 7 of one PPO step, each a small object the run plan picks once at start-up (``trainer/assembly.py``).

Whether a run has a critic, a reference policy or a KL term in the reward, where its old log-probs come from, and
which exact shortcuts it takes is the plan's decision (``config/phases.py``): the absent phases are no-op objects
with the same methods, so ``RayPPOTrainer.train`` reads the same for every algorithm. Each real phase times itself
under its metric name (``timing_s/old_log_prob``, ``timing_s/ref``, ``timing_s/values``, ``timing_s/adv``,
``timing_s/update_critic``, ``timing_s/update_actor``). The worker calls of phases 3, 4, 6 and 7 are started
through :class:`PhaseCalls`, which overlaps the critic's with the actor's where they sit on separate pools.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from hybridflow.algos.advantage_registry import ADV_ESTIMATORS, get_adv_estimator_fn
from hybridflow.algos.kl import apply_kl_penalty
from hybridflow.algos.kl_controllers import get_kl_controller
from hybridflow.algos.rollout_correction import CorrectionSettings, compute_rollout_correction
from hybridflow.config.phases import OLD_FROM_UPDATE
from hybridflow.data.seqlen_balancing import group_balanced_order, rank_balanced_order
from hybridflow.errors import HybridflowError
from hybridflow.protocol import DataProto
from hybridflow.protocol.columns import CRITIC_UPDATE_INPUTS, LOG_PROB_INPUTS, VALUE_INPUTS, actor_update_columns
from hybridflow.tracking import metric_names as names
from hybridflow.trainer.metrics import reduce_worker_metrics, samples_with_signal
from hybridflow.workers.training import local_loss_counts


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


def balance_batch(batch: DataProto, num_ranks: int, keep_groups: bool) -> tuple[DataProto, dict[str, float]]:
    """``batch`` reordered in place so each of ``num_ranks`` equal slices (one per data-parallel rank) carries
    about the same work (``trainer.balance_batch``; verl's ``_balance_batch``), and verl's ``global_seqlen/*``
    metrics of the ranks' real tokens before and after. Rows keep their columns, ``uid`` included. With
    ``keep_groups`` (ranks that may compute a prompt once for its samples) a prompt's samples stay together."""
    if len(batch) == 0:
        return batch, {}
    seqlens = batch.batch["attention_mask"].sum(-1)
    if keep_groups and "uid" in batch.non_tensor_batch:
        order, partitions = group_balanced_order(seqlens, batch.non_tensor_batch["uid"], num_ranks)
    else:
        order, partitions = rank_balanced_order(seqlens, num_ranks)
    before = seqlens.view(num_ranks, -1).sum(-1).tolist()
    after = [int(seqlens[rows].sum()) for rows in partitions]
    batch.reorder(order)
    return batch, {
        names.stat(names.GLOBAL_SEQLEN, "min"): min(before),
        names.stat(names.GLOBAL_SEQLEN, "max"): max(before),
        names.stat(names.GLOBAL_SEQLEN, "minmax_diff"): max(before) - min(before),
        names.stat(names.GLOBAL_SEQLEN, "balanced_min"): min(after),
        names.stat(names.GLOBAL_SEQLEN, "balanced_max"): max(after),
        names.stat(names.GLOBAL_SEQLEN, "mean"): sum(before) / num_ranks,
    }


def union_columns(batch: DataProto, output: DataProto) -> DataProto:
    """Add a worker output's tensors and columns to ``batch`` (its meta_info carries metrics, not data)."""
    return batch.union(DataProto(batch=output.batch, non_tensor_batch=output.non_tensor_batch))


def columns(batch: DataProto, keys: Any) -> DataProto:
    """The tensors ``keys`` of ``batch`` alone: what a worker call reads is all that travels to it."""
    return batch.select(batch_keys=list(keys), non_tensor_batch_keys=[], meta_info_keys=[])


def actor_update_input(batch: DataProto, old_log_probs_from_update: bool) -> DataProto:
    """Phase 7's input: the columns the actor's update reads."""
    return columns(batch, actor_update_columns(batch.batch.keys(), old_log_probs_from_update))


class Started:
    """A phase's worker call, started by ``PhaseCalls.start``; ``join`` returns its output."""

    def __init__(self, phase: str, output: Any = None, future: Any = None):
        self.phase = phase
        self._output = output
        self._future = future

    def join(self, timer: StepTimer) -> Any:
        if self._future is None:
            return self._output
        with timer(self.phase):
            return self._future.get()


class PhaseCalls:
    """Starts the worker calls of phases 3, 4, 6 and 7.

    Without ``overlap`` a call runs to its end when started, timed under its phase, so the calls run one after
    another as the step reads. With ``overlap`` (the critic or the reference on a pool of its own:
    ``trainer.placement=split`` or a layout) a call is only submitted, and ``Started.join`` waits for it: the
    critic's workers compute values (and train) while the actor's compute log-probs (and train). A phase's time
    is then the step's wait for it after the calls joined before it (the overlapped part counts once, in the call
    joined first).
    """

    def __init__(self, overlap: bool):
        self.overlap = overlap

    def start(self, timer: StepTimer, phase: str, method: Any, *args: Any, **kwargs: Any) -> Started:
        if self.overlap:
            return Started(phase, future=method.submit(*args, **kwargs))
        with timer(phase):
            return Started(phase, output=method(*args, **kwargs))


def join_columns(batch: DataProto, timer: StepTimer, *started: Started | None) -> DataProto:
    """``batch`` with the columns each started call returns, awaited in the order given (None: not run)."""
    for call in started:
        if call is not None:
            batch = union_columns(batch, call.join(timer))
    return batch


class OldLogProbs:
    """Phase 3a: ``old_log_probs`` [B, R] under the actor's weights before its update (and ``sum_pi_squared``
    when ``actor.calculate_sum_pi_squared``). No entropy: the update reports ``actor/entropy``."""

    def __init__(self, worker_group: Any, calls: PhaseCalls):
        self.worker_group = worker_group
        self.calls = calls

    def start(self, batch: DataProto, timer: StepTimer, step: int) -> Started:
        return self.calls.start(
            timer, names.PHASE_OLD_LOG_PROB, self.worker_group.compute_log_prob, columns(batch, LOG_PROB_INPUTS)
        )


class StepStartOldLogProbs:
    """Phase 3a of a step of several mini-batches (``separate_async``; verl's decoupled PPO): every mini-batch's
    ``old_log_probs`` under the weights the step started with, which the rollout pool holds, not under the
    updates of the step's earlier mini-batches. The first mini-batch keeps a CPU copy of those weights; a later
    one swaps them in for its pass and its own weights back after it (verl's ``save_model_to_cpu`` /
    ``restore_model_from_cpu``)."""

    START, CURRENT = 0, 1  # the CPU copies' slots

    def __init__(self, worker_group: Any, calls: PhaseCalls):
        self.worker_group = worker_group
        self.passes = OldLogProbs(worker_group, calls)
        self.step: int | None = None  # the step whose starting weights slot START holds

    def start(self, batch: DataProto, timer: StepTimer, step: int) -> Started:
        group = self.worker_group
        if step != self.step:  # the step's first mini-batch: the weights now are its pi_old
            with timer(names.PHASE_OLD_LOG_PROB):
                group.save_model_to_cpu(self.START)
            self.step = step
            return self.passes.start(batch, timer, step)
        with timer(names.PHASE_OLD_LOG_PROB):
            group.save_model_to_cpu(self.CURRENT)
            group.restore_model_from_cpu(self.START)
            output = group.compute_log_prob(columns(batch, LOG_PROB_INPUTS))
            group.restore_model_from_cpu(self.CURRENT)
            group.clear_cpu_model(self.CURRENT)
        return Started(names.PHASE_OLD_LOG_PROB, output=output)


class RolloutLogProbsAsOld:
    """Phase 3a in rollout correction's bypass mode: the engine's ``rollout_log_probs`` are the ``old_log_probs``
    (``pi_old = pi_rollout``); no forward pass runs, so no ``timing_s/old_log_prob``."""

    def start(self, batch: DataProto, timer: StepTimer, step: int) -> None:
        batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]


class NoOldLogProbPass:
    """Phase 3a of an on-policy update: none; the update's own log-probs, detached, are the old ones."""

    def start(self, batch: DataProto, timer: StepTimer, step: int) -> None:
        return None


class ReferencePolicy:
    """Phase 3b: ``ref_log_prob`` [B, R] from the frozen reference policy."""

    def __init__(self, worker_group: Any, calls: PhaseCalls):
        self.worker_group = worker_group
        self.calls = calls

    def start(self, batch: DataProto, timer: StepTimer) -> Started:
        return self.calls.start(
            timer, names.PHASE_REF, self.worker_group.compute_ref_log_prob, columns(batch, LOG_PROB_INPUTS)
        )


class TeacherScores:
    """Phase 3c, on-policy distillation: the teacher's ``teacher_logprobs`` (and ``teacher_ids``) of every response
    token, from its own pool (``workers/teacher.py``). With several teachers (``spec.route_by``), each row goes to
    the teacher whose key its ``route_by`` field holds: one call per teacher with rows, rejoined in the batch's
    order."""

    def __init__(self, worker_group: Any, calls: PhaseCalls, spec: Any):
        self.worker_group = worker_group
        self.calls = calls
        self.route_by = spec.route_by
        self.keys = spec.keys()

    def start(self, batch: DataProto, timer: StepTimer) -> Started | RoutedRows:
        inputs = columns(batch, LOG_PROB_INPUTS)
        if self.route_by is None:
            return self._call(inputs, timer, 0)
        if self.route_by not in batch.non_tensor_batch:
            raise HybridflowError(f"the batch has no {self.route_by!r} column to pick each row's teacher by")
        rows = teacher_rows(batch.non_tensor_batch[self.route_by], self.keys, self.route_by)
        return RoutedRows(
            [(indices, self._call(inputs[indices], timer, teacher)) for teacher, indices in rows.items()], len(batch)
        )

    def _call(self, inputs: DataProto, timer: StepTimer, teacher: int) -> Started:
        method = self.worker_group.compute_teacher_log_probs
        return self.calls.start(timer, names.PHASE_TEACHER, method, inputs, teacher=teacher)


def teacher_rows(values: Any, keys: list[str], route_by: str) -> dict[int, np.ndarray]:
    """The batch rows of each teacher (an index into ``keys``) that has any, by each row's ``route_by`` value."""
    teacher_of = {key: index for index, key in enumerate(keys)}
    unrouted = next((row for row, value in enumerate(values) if str(value) not in teacher_of), None)
    if unrouted is not None:
        raise HybridflowError(
            f"batch row {unrouted} has {route_by}={values[unrouted]!r}, which no teacher's key names "
            f"(distillation.teacher_models keys: {keys})"
        )
    chosen = np.array([teacher_of[str(value)] for value in values])
    return {int(teacher): np.flatnonzero(chosen == teacher) for teacher in np.unique(chosen)}


class RoutedRows:
    """The teachers' calls of one step, each over its own rows; ``join`` puts their columns back in row order."""

    def __init__(self, parts: list[tuple[np.ndarray, Started]], rows: int):
        self.parts = parts
        self.rows = rows

    def join(self, timer: StepTimer) -> DataProto:
        outputs = [started.join(timer) for _, started in self.parts]
        order = np.concatenate([indices for indices, _ in self.parts])
        # Row i of the batch is row position_of[i] of the concatenated outputs
        position_of = np.empty(self.rows, dtype=np.int64)
        position_of[order] = np.arange(self.rows)
        return DataProto.concat(outputs).reorder(position_of)


class NoTeacher:
    """No distillation: no teacher is built or called."""

    def start(self, batch: DataProto, timer: StepTimer) -> None:
        return None


class NoReference:
    """No KL term: the reference policy is never built or called."""

    def start(self, batch: DataProto, timer: StepTimer) -> None:
        return None


class Critic:
    """Phases 4 and 6: critic ``values`` [B, R] and the value-function update."""

    def __init__(self, worker_group: Any, calls: PhaseCalls):
        self.worker_group = worker_group
        self.calls = calls

    def start_values(self, batch: DataProto, timer: StepTimer) -> Started:
        return self.calls.start(
            timer, names.PHASE_VALUES, self.worker_group.compute_values, columns(batch, VALUE_INPUTS)
        )

    def start_update(self, batch: DataProto, timer: StepTimer) -> Started:
        return self.calls.start(
            timer, names.PHASE_UPDATE_CRITIC, self.worker_group.update_critic, columns(batch, CRITIC_UPDATE_INPUTS)
        )

    @staticmethod
    def join_update(started: Started, timer: StepTimer) -> dict[str, float]:
        return worker_metrics(started.join(timer), names.CRITIC_PREFIX)

    def save_checkpoint(self, path: str, global_step: int) -> None:
        self.worker_group.save_checkpoint(path, global_step)

    def load_checkpoint(self, path: str) -> None:
        self.worker_group.load_checkpoint(path)


class NoCritic:
    """The estimator needs no values (GRPO, RLOO, ...): nothing is built, computed or saved."""

    def start_values(self, batch: DataProto, timer: StepTimer) -> None:
        return None

    def start_update(self, batch: DataProto, timer: StepTimer) -> None:
        return None

    @staticmethod
    def join_update(started: None, timer: StepTimer) -> dict[str, float]:
        return {}

    def save_checkpoint(self, path: str, global_step: int) -> None:
        pass

    def load_checkpoint(self, path: str) -> None:
        pass


class ActorUpdate:
    """Phase 7: the actor's PPO update on the columns it reads, none in the first ``warmup_steps`` steps (they
    train the critic alone). ``old_log_probs`` is the plan's source of them: an on-policy update takes its own."""

    def __init__(self, worker_group: Any, calls: PhaseCalls, warmup_steps: int, old_log_probs: str):
        self.worker_group = worker_group
        self.calls = calls
        self.warmup_steps = warmup_steps
        self.from_update = old_log_probs == OLD_FROM_UPDATE

    def __call__(self, batch: DataProto, timer: StepTimer, step: int, loss_counts: dict | None) -> dict[str, float]:
        """The update's metrics (``actor/*``), after waiting for it; ``loss_counts``: the whole batch's, when only
        the rows with signal were sent."""
        if step <= self.warmup_steps:
            return {}
        update = self.calls.start(
            timer,
            names.PHASE_UPDATE_ACTOR,
            self.worker_group.update_actor,
            actor_update_input(batch, self.from_update),
            old_log_probs_from_update=self.from_update,
            loss_counts=loss_counts,
        )
        return worker_metrics(update.join(timer), names.ACTOR_PREFIX)


class KLInReward:
    """``token_level_rewards = token_level_scores - beta * KL(actor || ref)`` per token (Ziegler et al.,
    arXiv 1909.08593), with ``beta`` from a fixed or adaptive controller updated once per step."""

    def __init__(self, algorithm_config: Any):
        self.kind = algorithm_config.kl_penalty
        kl_ctrl = algorithm_config.kl_ctrl
        self.controller = get_kl_controller(kl_ctrl.type, kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon)

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


class RolloutCorrection:
    """Decoupled rollout correction, in verl's place: after the KL penalty in the reward, before the
    advantages. From ``old_log_probs`` and the engine's ``rollout_log_probs``: rejected tokens leave
    ``response_mask`` (so the advantages, the loss and its counts skip them), ``rollout_is_weights`` [B, R]
    join the batch when ``rollout_is`` is set, and the ``rollout_corr/*`` metrics are returned."""

    def __init__(self, settings: CorrectionSettings):
        self.settings = settings

    def __call__(self, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        tensors = batch.batch
        weights, response_mask, metrics = compute_rollout_correction(
            tensors["old_log_probs"], tensors["rollout_log_probs"], tensors["response_mask"], self.settings
        )
        tensors["response_mask"] = response_mask
        if weights is not None:
            tensors["rollout_is_weights"] = weights
        return batch, metrics


class NoRolloutCorrection:
    """No engine log-probs beside old ones computed by a pass (or bypass mode, whose loss corrects itself)."""

    def __call__(self, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        return batch, {}


# How each input an estimator may declare (hybridflow.algos.advantage_registry.ESTIMATOR_INPUTS) is read.
_ESTIMATOR_INPUT_READERS = {
    "values": lambda batch: batch.batch["values"],
    "index": lambda batch: batch.non_tensor_batch["uid"],
    "reward_baselines": lambda batch: batch.batch["reward_baselines"],
    "old_log_probs": lambda batch: batch.batch["old_log_probs"],
    "sum_pi_squared": lambda batch: batch.batch["sum_pi_squared"],
    "rollout_is_weights": lambda batch: batch.batch.get("rollout_is_weights", None),
    "non_tensor_batch": lambda batch: batch.non_tensor_batch,
}


class AdvantageEstimator:
    """Phase 5: ``advantages`` and ``returns`` [B, R] by the estimator named in ``algorithm.adv_estimator``,
    given exactly the inputs it declared at registration."""

    def __init__(self, algorithm_config: Any):
        # The algorithm options an estimator may read (each takes those it knows as typed arguments).
        self.options = dict(
            gamma=algorithm_config.gamma,
            lam=algorithm_config.lam,
            norm_adv_by_std_in_grpo=algorithm_config.norm_adv_by_std_in_grpo,
            gdpo_reward_keys=algorithm_config.gdpo_reward_keys,
            gdpo_reward_weights=algorithm_config.gdpo_reward_weights,
        )
        self.estimate = get_adv_estimator_fn(algorithm_config.adv_estimator)
        needed = ADV_ESTIMATORS.traits(algorithm_config.adv_estimator)["requires"]
        self.readers = {name: _ESTIMATOR_INPUT_READERS[name] for name in needed}

    def __call__(self, batch: DataProto) -> DataProto:
        inputs = {name: read(batch) for name, read in self.readers.items()}
        advantages, returns = self.estimate(
            token_level_rewards=batch.batch["token_level_rewards"],
            response_mask=batch.batch["response_mask"],
            **self.options,
            **inputs,
        )
        batch.batch["advantages"] = advantages
        batch.batch["returns"] = returns
        return batch


Correction = RolloutCorrection | NoRolloutCorrection


class Advantages:
    """Phase 5: for every sample of the batch, the KL penalty in the reward (when used), the rollout
    correction (verl's order), then the estimator. Returns the KL and correction metrics."""

    def __init__(
        self, reward_shaping: KLInReward | ScoresAsRewards, correction: Correction, estimator: AdvantageEstimator
    ):
        self.reward_shaping = reward_shaping
        self.correction = correction
        self.estimator = estimator

    def __call__(self, batch: DataProto, timer: StepTimer) -> tuple[DataProto, dict[str, float]]:
        with timer(names.PHASE_ADV):
            batch, kl_metrics = self.reward_shaping(batch)
            batch, correction_metrics = self.correction(batch)
            return self.estimator(batch), {**kl_metrics, **correction_metrics}


def rows_with_signal(batch: DataProto, num_ranks: int) -> tuple[DataProto, dict[str, float]]:
    """The samples of ``batch`` with a non-zero advantage, in order, and ``batch``'s loss counts.

    Where ``exact_skips.zero_signal_skip_blockers`` finds nothing, a sample whose advantages are all 0 adds
    nothing to the loss or its gradient but its share of the loss's denominator, so the actor trains on the
    others with the whole batch's counts (``update_actor``'s ``loss_counts``). Padded to a multiple of
    ``num_ranks`` (so every rank gets the same number of rows) with copies whose ``response_mask`` and
    ``advantages`` are 0: they add nothing to the loss, its gradient or the counts. No sample with signal
    gives an empty batch, which the actor still steps on (zero gradients).
    """
    kept = batch[samples_with_signal(batch).nonzero().flatten()]
    kept, pad_size = kept.pad_to_divisor(num_ranks)
    if pad_size:
        kept.batch["response_mask"][-pad_size:] = 0
        kept.batch["advantages"][-pad_size:] = 0
    return kept, dataclasses.asdict(local_loss_counts(batch.batch["response_mask"]))
