"""Phases 1 (rollout), 2 (reward) and 8 (weight sync) of a synchronous PPO step: the hybrid engine's.

:class:`RolloutCollector` generates ``n`` responses per prompt in the actor's processes and scores them; after the
update its :meth:`~RolloutCollector.sync_weights` puts the actor's weights into their rollout engines. With DAPO's
dynamic sampling (arXiv 2503.14476, section 3.2), :class:`DynamicSamplingCollector` drops the prompt groups whose
samples all score the same (they carry no GRPO gradient) and keeps generating until ``train_batch_size``
prompts remain, bounded by ``algorithm.filter_groups.max_num_gen_batches``. ReMax (arXiv 2310.10505)
adds a greedy response per prompt whose reward is the baseline (:class:`GreedyBaseline`). The collectors of a
rollout pool of its own: ``trainer/one_step_off.py`` and ``trainer/fully_async_collection.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hybridflow.errors import HybridflowError
from hybridflow.protocol import DataProto
from hybridflow.protocol.columns import PROMPT_KEYS
from hybridflow.protocol.prompt_padding import concat_left_padded
from hybridflow.rewards.judge_prompts import JudgeScoring
from hybridflow.tracking import metric_names as names
from hybridflow.trainer.phases import StepTimer, union_columns
from hybridflow.workers.judge import ANSWERS as JUDGE_ANSWERS
from hybridflow.workers.judge import PROMPTS as JUDGE_PROMPTS

# What the rollout engine reads from a prompt batch besides its tensors (PROMPT_KEYS); the rest stays here.
PROMPT_COLUMNS_FOR_ROLLOUT = ("raw_prompt", "tools_kwargs")


class EndOfData(Exception):
    """The training prompts ran out (every epoch consumed) before the step's batch was complete."""


class DynamicSamplingError(HybridflowError, RuntimeError):
    """Dynamic sampling could not fill the batch within its generation budget."""


class PromptSource:
    """Prompt batches across epochs from a resumable loader (``hybridflow.data.sampler.StatefulDataLoader``)."""

    def __init__(self, loader: Any, total_epochs: int):
        self.loader = loader
        self.total_epochs = total_epochs
        self._batches = iter(())

    def next(self) -> DataProto:
        while True:
            batch = next(self._batches, None)
            if batch is not None:
                return batch
            if self.loader.epoch >= self.total_epochs:
                raise EndOfData(f"all {self.total_epochs} epoch(s) of training prompts are used up")
            self._batches = iter(self.loader)

    @property
    def epoch(self) -> int:
        return self.loader.epoch


def extras_as_columns(batch: DataProto, extra: dict[str, list]) -> None:
    """Each per-sample extra of a scoring (one value per row) as a column of ``batch``, unless it has one."""
    for key, values in extra.items():
        if key not in batch.non_tensor_batch and len(values) == len(batch):
            batch.non_tensor_batch[key] = np.asarray(values, dtype=object)


class RewardScorer:
    """Phase 2: ``token_level_scores`` [B, R] from the reward manager, once the batch is generated; the
    per-sample extras it returns (``score``, ``acc``, ``pred``, ...) become columns of the batch."""

    def __init__(self, reward_manager: Any):
        self.reward_manager = reward_manager

    def start(self) -> Any:
        """What scores the batch's parts while it is generated: nothing here (see StreamingRewardScorer)."""
        return None

    def __call__(self, batch: DataProto, scoring: Any = None) -> tuple[DataProto, dict[str, list], dict[str, float]]:
        """Score ``batch`` (or finish ``scoring``, which ``start`` returned and the rollout fed)."""
        return self.applied(batch, self.reward_manager(batch) if scoring is None else scoring.finish(batch))

    def applied(self, batch: DataProto, result: Any) -> tuple[DataProto, dict[str, list], dict[str, float]]:
        """``batch`` with ``result``'s scores and per-sample extras as columns; the extras and metrics."""
        batch.batch["token_level_scores"] = result.token_level_scores.to(torch.float32)
        extras_as_columns(batch, result.extra)
        return batch, result.extra, dict(result.metrics)


class StreamingRewardScorer(RewardScorer):
    """Phase 2 overlapping phase 1, for a manager that scores each sample alone: each part of the rollout is
    scored as soon as the engine finishes it (verl's reward loop streams likewise), so what is left after
    generation is the last part's scoring."""

    def start(self) -> Any:
        return self.reward_manager.start_batch()


class ModelRewardScorer(RewardScorer):
    """Phase 2 with a learned reward model: its ``rm_scores`` are the scores (as in verl)."""

    def __init__(self, reward_manager: Any, reward_model_group: Any):
        super().__init__(reward_manager)
        self.reward_model_group = reward_model_group

    def __call__(self, batch: DataProto, scoring: Any = None) -> tuple[DataProto, dict[str, list], dict[str, float]]:
        return super().__call__(union_columns(batch, self.reward_model_group.compute_rm_score(batch)))


class RulesBesideModelScorer(RewardScorer):
    """Validation with a reward model or a judge: its scores are the scores (verl's ``reward``), and each
    data_source's rule adds its per-sample extras (``acc``, ``pred``, ...) beside them, so
    ``val-core/<data_source>/acc`` stays the rule's accuracy."""

    def __init__(self, reward_manager: Any, model_scorer: RewardScorer):
        super().__init__(reward_manager)
        self.model_scorer = model_scorer

    def __call__(self, batch: DataProto, scoring: Any = None) -> tuple[DataProto, dict[str, list], dict[str, float]]:
        rules = self.reward_manager(batch)  # before the model's rm_scores join, which the manager would pass on
        batch, extra, metrics = self.model_scorer(batch)
        # the rule's ``score`` would read as the sample's score, which is the model's
        rule_extra = {key: values for key, values in rules.extra.items() if key not in extra and key != "score"}
        extras_as_columns(batch, rule_extra)
        return batch, {**extra, **rule_extra}, {**rules.metrics, **metrics}


class JudgeRewardScorer(RewardScorer):
    """Phase 2 with a generative judge: the driver renders each sample's judge prompt, the judge's workers answer
    them, and the driver parses the answers into scores (``rewards/judge_prompts.py``)."""

    def __init__(self, scoring: JudgeScoring, judge_group: Any):
        super().__init__(reward_manager=None)
        self.scoring = scoring
        self.judge_group = judge_group

    def __call__(self, batch: DataProto, scoring: Any = None) -> tuple[DataProto, dict[str, list], dict[str, float]]:
        responses, prompts = self.scoring.prompts(batch)
        request = DataProto.from_dict({"row": torch.arange(len(prompts))}, {JUDGE_PROMPTS: prompts})
        answers = self.judge_group.judge(request).non_tensor_batch[JUDGE_ANSWERS]
        return self.applied(batch, self.scoring.result(responses, [str(answer) for answer in answers]))


def reward_scorer(
    reward_manager: Any, reward_model_group: Any, streamed: bool, judge: JudgeScoring | None = None
) -> RewardScorer:
    """Phase 2's scorer: by the generative judge or the reward model when there is one; else streamed with the
    rollout where the plan says so (a manager that scores each sample alone), or on the whole batch."""
    if judge is not None:
        return JudgeRewardScorer(judge, reward_model_group)
    if reward_model_group is not None:
        return ModelRewardScorer(reward_manager, reward_model_group)
    return StreamingRewardScorer(reward_manager) if streamed else RewardScorer(reward_manager)


@dataclass
class PendingGeneration:
    """A generation started by ``Generation.start``: its prompts' other columns and the group call's future."""

    prompts: DataProto
    future: Any


class Generation:
    """Phase 1: ``n`` responses per prompt from the actor's rollout engine, joined to their prompts.

    Call ``k`` of the run samples with seed ``rollout.seed + k``; the driver counts the calls (``calls``,
    saved in checkpoints) so a resumed run draws the samples an uninterrupted one would. ``n`` and ``val_n``
    are the samples per prompt of training and validation calls.
    """

    def __init__(self, actor_rollout: Any, meta_info: dict[str, Any], seed: int, n: int, val_n: int):
        self.actor_rollout = actor_rollout
        self.meta_info = meta_info
        self.seed = seed
        self.n = n
        self.val_n = val_n
        self.calls = 0

    @property
    def pad_token_id(self) -> int:
        """The tokenizer's pad token (``load_tokenizer`` gives every tokenizer one): batches drawn apart are
        left-padded with it to join (``concat_left_padded``), responses right-padded."""
        return self.meta_info["pad_token_id"]

    def __call__(self, prompts: DataProto, timer: StepTimer, scoring: Any = None, **meta: Any) -> DataProto:
        """``prompts`` [B] (consumed) -> samples [B * n] with prompt columns repeated next to each response.
        With ``scoring`` (a ``SampleScoring``), each part of the rollout is handed to it as it arrives."""
        gen_input = self._rollout_input(prompts, meta)
        with timer(names.PHASE_GEN):
            if scoring is None:
                output = self.actor_rollout.generate_sequences(gen_input)
            else:
                n = self.val_n if meta.get("validate") else self.n
                output = self._generate_scoring_parts(gen_input, prompts, n, scoring)
        return self._samples(prompts, output)

    def start(self, prompts: DataProto, engine: Any = None) -> PendingGeneration:
        """Start generating for ``prompts`` (consumed) and return at once; ``finish`` waits for the samples.
        ``engine``: the group that generates, if not the rollout's (separate_async lends the actor's)."""
        group = self.actor_rollout if engine is None else engine
        return PendingGeneration(prompts, group.generate_sequences.submit(self._rollout_input(prompts, {})))

    def finish(self, pending: PendingGeneration) -> DataProto:
        """The samples of a ``start``-ed generation, as ``__call__`` returns them."""
        return self._samples(pending.prompts, pending.future.get())

    def _rollout_input(self, prompts: DataProto, meta: dict[str, Any]) -> DataProto:
        gen_input = prompts.pop(batch_keys=list(PROMPT_KEYS))
        for key in PROMPT_COLUMNS_FOR_ROLLOUT:
            if key in prompts.non_tensor_batch:
                gen_input.non_tensor_batch[key] = prompts.non_tensor_batch[key]
        gen_input.meta_info.update(self.meta_info, seed=self.seed + self.calls, **meta)
        self.calls += 1
        return gen_input

    def _samples(self, prompts: DataProto, output: DataProto) -> DataProto:
        samples_per_prompt = len(output) // len(prompts)
        return union_columns(prompts.repeat(samples_per_prompt, interleave=True), output)

    def _generate_scoring_parts(self, gen_input: DataProto, prompts: DataProto, n: int, scoring: Any) -> DataProto:
        stream = self.actor_rollout.generate_sequences_stream(gen_input)
        for part in stream:
            prompt_rows = part.rows // n
            real = prompt_rows < len(prompts)  # not the rows of prompts the dispatch padded
            samples = union_columns(prompts[prompt_rows[real]], part.data[real])
            scoring.add(part.rows[real], samples)
        return stream.get()


def assign_uids(prompts: DataProto, prefix: str) -> DataProto:
    """``uid`` column ``<prefix>-<row>``: the samples of one prompt share it (their group for GRPO & co)."""
    prompts.non_tensor_batch["uid"] = np.array([f"{prefix}-{i}" for i in range(len(prompts))], dtype=object)
    return prompts


def generate_and_score(
    generate: Generation, score: RewardScorer, prompts: DataProto, timer: StepTimer, **meta: Any
) -> tuple[DataProto, dict[str, list], dict[str, float]]:
    """Phases 1 and 2: the samples, scored; a streaming scorer scores each part while the rest is generated,
    so ``timing_s/reward`` is the scoring left after generation."""
    scoring = score.start()
    batch = generate(prompts, timer, scoring, **meta)
    with timer(names.PHASE_REWARD):
        return score(batch, scoring)


class GreedyBaseline:
    """ReMax's baseline: the score of the greedy response to each prompt, ``reward_baselines`` [B * n]."""

    def __call__(self, prompts: DataProto, generate: Generation, score: RewardScorer, timer: StepTimer) -> torch.Tensor:
        greedy, _, _ = generate_and_score(generate, score, prompts, timer, do_sample=False)
        samples_per_prompt = len(greedy) // len(prompts)
        return greedy.batch["token_level_scores"].sum(-1)[::samples_per_prompt]


class RolloutCollector:
    """Phases 1 and 2 for one batch of prompts in the actor's processes (hybrid engine): generate, then score;
    phase 8 puts the updated actor's weights into their rollout engines."""

    def __init__(self, generate: Generation, score: RewardScorer, baseline: GreedyBaseline | None):
        self.generate = generate
        self.score = score
        self.baseline = baseline

    def generate_and_score(
        self, prompts: DataProto, timer: StepTimer, uid_prefix: str
    ) -> tuple[DataProto, dict[str, float]]:
        assign_uids(prompts, uid_prefix)
        baseline_prompts = prompts.select(batch_keys=list(PROMPT_KEYS)) if self.baseline else None
        batch, _, metrics = generate_and_score(self.generate, self.score, prompts, timer)
        if self.baseline:
            baselines = self.baseline(baseline_prompts, self.generate, self.score, timer)
            batch.batch["reward_baselines"] = baselines.repeat_interleave(len(batch) // len(baselines))
        return batch, metrics

    def collect(self, source: PromptSource, timer: StepTimer, step: int) -> tuple[DataProto, dict[str, float]]:
        return self.generate_and_score(source.next(), timer, uid_prefix=f"step{step}")

    def sync_weights(self, step: int, timer: StepTimer) -> dict[str, float]:
        """Phase 8: the actor's weights after step ``step``'s update into the rollout engines of its processes;
        the sync's metrics besides its timings (none here)."""
        with timer(names.PHASE_UPDATE_WEIGHTS):
            timer.add(names.CHECK_WEIGHT_SYNC, max(self.generate.actor_rollout.update_weights()))
        return {}

    def use_current_weights(self, step: int) -> None:
        """Before a validation: nothing to do, the step's weight sync left the engines current."""

    def sync_before_first_step(self, step: int) -> None:
        """Before the run's first step (after ``step``, 0 or the checkpoint's): the engines get the actor's
        weights where they differ (a loaded checkpoint, a LoRA adapter's engine)."""
        self.sync_weights(step, StepTimer())

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold for the next step's samples to be the same after resuming: nothing here."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see ``state_dict``)."""


def group_metric(batch: DataProto, metric: str) -> np.ndarray:
    """Per-sample values compared within a prompt group: ``score`` is the summed token score, any other
    name a column the reward manager returned (e.g. ``acc``)."""
    if metric == "score":
        return batch.batch["token_level_scores"].sum(-1).numpy()
    if metric not in batch.non_tensor_batch:
        raise DynamicSamplingError(
            f"algorithm.filter_groups.metric={metric!r} is neither 'score' nor a value the reward manager "
            f"returned ({sorted(batch.non_tensor_batch)}); choose one of those"
        )
    return np.asarray(batch.non_tensor_batch[metric], dtype=np.float64)


def varied_group_rows(uids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Indices of the rows whose uid group has a non-zero std of ``values`` (single-sample groups count
    as varied, as in verl), in their original order."""
    keep_uid = {}
    for uid in dict.fromkeys(uids):
        group = values[uids == uid]
        keep_uid[uid] = len(group) == 1 or float(np.std(group)) > 0
    return np.array([i for i, uid in enumerate(uids) if keep_uid[uid]], dtype=np.int64)


class DynamicSamplingCollector(RolloutCollector):
    """DAPO dynamic sampling: keep generating batches, dropping groups whose samples all score the same,
    until ``train_batch_size`` prompt groups are collected (the surplus of the last batch is dropped)."""

    def __init__(
        self,
        generate: Generation,
        score: RewardScorer,
        baseline: GreedyBaseline | None,
        *,
        train_batch_size: int,
        metric: str,
        max_num_gen_batches: int,
    ):
        super().__init__(generate, score, baseline)
        self.train_batch_size = train_batch_size
        self.metric = metric
        self.max_num_gen_batches = max_num_gen_batches

    def collect(self, source: PromptSource, timer: StepTimer, step: int) -> tuple[DataProto, dict[str, float]]:
        kept, num_groups, metrics = [], 0, {}
        for gen_batch in range(self.max_num_gen_batches):
            prompts = source.next()
            batch, batch_metrics = self.generate_and_score(prompts, timer, uid_prefix=f"step{step}-gen{gen_batch}")
            metrics = {key: metrics.get(key, 0.0) + value for key, value in batch_metrics.items()}
            rows = varied_group_rows(batch.non_tensor_batch["uid"], group_metric(batch, self.metric))
            if len(rows):
                kept.append(batch[rows])
                num_groups += len(dict.fromkeys(batch.non_tensor_batch["uid"][rows]))
            if num_groups >= self.train_batch_size:
                batch = concat_left_padded(kept, self.generate.pad_token_id)
                samples_per_prompt = len(batch) // num_groups
                metrics[names.NUM_GEN_BATCHES] = float(gen_batch + 1)
                metrics[names.NUM_KEPT_GROUPS] = float(num_groups)
                return batch[: self.train_batch_size * samples_per_prompt], metrics
        raise DynamicSamplingError(
            f"dynamic sampling kept {num_groups} of the {self.train_batch_size} prompt groups a step needs after "
            f"algorithm.filter_groups.max_num_gen_batches={self.max_num_gen_batches} generation batches (the others "
            f"scored the same on every sample); raise max_num_gen_batches, use easier/harder-mixed prompts, or "
            f"set algorithm.filter_groups.enable=false"
        )
