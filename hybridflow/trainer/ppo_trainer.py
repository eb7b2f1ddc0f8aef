"""The PPO driver: one Python loop on the single controller calling SPMD worker groups (arXiv 2409.19256).

``RayPPOTrainer`` runs a run plan (``config/plan.py``). :meth:`~RayPPOTrainer.fit` is the loop over steps, with
validation and checkpoints on their schedules; :meth:`~RayPPOTrainer.step` is one step in the paper's order, each
phase one line timed as ``timing_s/<phase>``: 1 rollout and 2 reward by the collector of the plan's mode (the
hybrid engine's, one step ahead on a pool of its own, or from the fully async queue; with verl's V1
``separate_async`` 1 to 7 run once per mini-batch), 3 to 7 in
:meth:`~RayPPOTrainer.train` (old and reference log-probs, values, advantages, critic and actor updates), then
8 the weight sync into the rollout. What a run needs (critic, reference, KL in the reward, the exact skips) is the
plan's: the absent phases are no-op objects chosen at start-up (``trainer/assembly.py``).

Differs from verl: verl skips the actor update while ``global_step < critic_warmup`` (one step fewer, as steps count
from 1); here the first ``critic_warmup`` steps skip it, as the key's documentation says.
"""

from __future__ import annotations

import pathlib
from collections import defaultdict
from typing import Any, Callable

from hybridflow.checkpoints.manager import (
    ACTOR_DIR,
    CRITIC_DIR,
    CheckpointManager,
    capture_rng_state,
    restore_rng_state,
)
from hybridflow.config.distillation_options import TEACHER_ROLE
from hybridflow.config.plan import RunPlan
from hybridflow.config.resume_checks import STATE_KEY as RESUME_STATE_KEY
from hybridflow.protocol import DataProto
from hybridflow.rewards import process_validation_metrics
from hybridflow.tracking import metric_names as names
from hybridflow.tracking.trackers import RunInfo, Tracking
from hybridflow.trainer import assembly
from hybridflow.trainer.metrics import (
    compute_actor_mfu_metrics,
    compute_data_metrics,
    compute_rollout_probs_diff_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
)
from hybridflow.trainer.nonfinite import NonFiniteGuard
from hybridflow.trainer.perf import count_parameters, peak_flops_per_process
from hybridflow.trainer.phases import (
    AdvantageEstimator,
    Advantages,
    KLInReward,
    NoRolloutCorrection,
    RolloutCorrection,
    ScoresAsRewards,
    StepTimer,
    balance_batch,
    join_columns,
    rows_with_signal,
)
from hybridflow.trainer.profiling import NoProfiler, StepProfiler, step_profiler
from hybridflow.trainer.rollout_collection import EndOfData, PromptSource, assign_uids, generate_and_score
from hybridflow.trainer.separate_async import merge_passes
from hybridflow.trainer.val_generations import ValidationGenerations
from hybridflow.trainer.worker_groups import WorkerGroups


class RayPPOTrainer:
    """Trains the plan's policy with PPO-family RL on the prompts of ``train_loader``.

    ``train_loader``/``val_loader`` are ``hybridflow.data.sampler.StatefulDataLoader``s (``val_loader`` may
    be None); ``reward_manager`` is a ``hybridflow.rewards`` manager. Call ``init_workers()``, then ``fit()``.
    """

    def __init__(self, plan: RunPlan, *, tokenizer: Any, train_loader: Any, val_loader: Any, reward_manager: Any):
        self.plan = plan
        self.tokenizer = tokenizer
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.reward_manager = reward_manager
        trainer = plan.trainer
        self.total_training_steps = plan.total_training_steps
        self.prompts = PromptSource(train_loader, trainer.total_epochs)
        self.run_dir = pathlib.Path(trainer.default_local_dir)
        self.checkpoints = CheckpointManager(
            self.run_dir,
            trainer.resume_mode,
            trainer.resume_from_path,
            max_to_keep={ACTOR_DIR: trainer.max_actor_ckpt_to_keep, CRITIC_DIR: trainer.max_critic_ckpt_to_keep},
        )
        self.reward_shaping = KLInReward(plan.algorithm) if plan.kl_in_reward else ScoresAsRewards()
        correction = RolloutCorrection(plan.correction) if plan.correction else NoRolloutCorrection()
        self.advantages = Advantages(self.reward_shaping, correction, AdvantageEstimator(plan.algorithm))
        self.nonfinite = NonFiniteGuard(trainer.max_nonfinite_steps)
        self.hooks = assembly.step_hooks(plan, tokenizer)
        self.global_step = 0
        self._saved_step = -1
        self.workers: WorkerGroups | None = None
        self.profiler: StepProfiler | NoProfiler = NoProfiler()

    # ----------------------------------------------------------------------------------------- workers
    def init_workers(self, start_workers: Callable[..., WorkerGroups] | None = None) -> None:
        """Start the plan's worker groups, load their models, and build the phases of its mode.

        ``start_workers`` turns the plan's pools and {role: RayClassWithInitArgs} into running groups: Ray
        actors by default, this process in local mode.
        """
        plan = self.plan
        start_workers = start_workers or assembly.worker_starter(plan)
        self.workers = start_workers(plan.resources, assembly.role_classes(plan))
        groups = self.workers.roles
        for group in groups.values():
            group.init_model()
        self.actor_rollout = groups["actor_rollout_ref"]
        self.phases = assembly.step_phases(
            plan, self.actor_rollout, groups.get("critic"), groups.get("ref"), groups.get(TEACHER_ROLE)
        )
        self.rollout = assembly.collector(plan, groups, self.tokenizer, self.reward_manager)
        val_sources = self.val_loader.dataset.data_sources() if self.val_loader is not None else []
        self.validation_score = assembly.validation_scorer(plan, self.rollout.score, self.reward_manager, val_sources)
        self.profiler = step_profiler(plan.profile, groups)
        self.num_parameters = count_parameters(plan.actor_rollout_ref.model.path)
        self.peak_flops = peak_flops_per_process(
            plan.trainer.peak_flops_per_device, plan.trainer.device, plan.trainer.cpus_per_worker
        )

    def shutdown(self) -> None:
        """Stop the workers and the reward manager's scoring threads."""
        if self.workers is not None:
            self.workers.shutdown()
        self.reward_manager.close()

    # --------------------------------------------------------------------------------------------- fit
    def fit(self) -> None:
        """Train for the plan's steps (or until the prompts run out)."""
        tracker = self._start_run()
        try:
            while self.global_step < self.total_training_steps:
                self.global_step += 1
                timer = StepTimer()
                self.profiler.before_step(self.global_step)  # global_profiler.steps: torch.profiler in the workers
                with timer(names.PHASE_STEP):
                    batch, train_batch, metrics = self.step(self.global_step, timer)
                trained = finite = train_batch is not None  # scores that were not finite: nothing trained
                if trained:
                    metrics.update(self._step_metrics(batch, train_batch, timer))
                    # A loss or gradient norm that was not finite (its optimizer steps were skipped)
                    finite = self.nonfinite.updates_are_finite(metrics, self.global_step)
                metrics.update(self.nonfinite.metrics(self.global_step))
                for hook in self.hooks if trained else ():
                    hook.after_step(self.global_step, batch, metrics)
                self.profiler.after_step(self.global_step)
                # A step whose values were not finite is never saved
                self._end_step(metrics, tracker, last=self.global_step == self.total_training_steps, save=finite)
        except EndOfData as end:
            self.global_step -= 1
            print(f"stopping after step {self.global_step}: {end}")
            # Unless saved already, or its values were not finite (such a step is never saved)
            unsaved = self.global_step not in (self._saved_step, self.nonfinite.last_step)
            if self.plan.trainer.save_freq > 0 and unsaved:
                self.save_checkpoint()
        finally:
            self.profiler.close()
            tracker.close()

    def step(self, step: int, timer: StepTimer) -> tuple[DataProto, DataProto | None, dict[str, float]]:
        """One step in the paper's order: its whole batch, the part that trained (None: the scores were not
        finite, so nothing trained), and the metrics of its phases. With ``separate_async`` phases 1 to 7 run once
        per mini-batch (``plan.passes_per_step``), as each arrives."""
        passes = [self._pass(step, timer) for _ in range(self.plan.passes_per_step)]
        batch, train_batch, metrics = (
            passes[0] if len(passes) == 1 else merge_passes(passes, self.tokenizer.pad_token_id)
        )
        # 8 weight sync: the updated actor's weights into the rollout, for what it generates next
        metrics.update(self.rollout.sync_weights(step, timer))
        return batch, train_batch, metrics

    def _pass(self, step: int, timer: StepTimer) -> tuple[DataProto, DataProto | None, dict[str, float]]:
        # 1 rollout and 2 reward, as the plan's mode generates: now, one step ahead, or from the async queue
        batch, metrics = self.rollout.collect(self.prompts, timer, step)
        train_batch = None
        if self.nonfinite.scores_are_finite(batch, step):  # scores that are not finite would make 3-7 NaN
            batch, train_batch, train_metrics = self.train(batch, timer, step)  # 3 to 7
            metrics.update(train_metrics)
        return batch, train_batch, metrics

    def train(self, batch: DataProto, timer: StepTimer, step: int) -> tuple[DataProto, DataProto, dict[str, float]]:
        """Phases 3 to 7 on a scored batch: the batch (with its advantages), the rows that trained, their metrics."""
        plan, phases = self.plan, self.phases
        train_batch, loss_counts, metrics = batch, None, {}
        # Where exact (plan.skip_zero_signal): 5 first, on the scores alone (all it reads here), and the samples
        # whose advantages are all 0 skip 3 to 7; the actor keeps the whole batch's loss counts
        if plan.skip_zero_signal:
            batch, metrics = self.advantages(batch, timer)
            train_batch, loss_counts = rows_with_signal(batch, plan.world_size)
        if plan.trainer.balance_batch:  # reordered so every data-parallel rank gets about as many tokens
            train_batch, balance_metrics = balance_batch(train_batch, plan.world_size, plan.balance_by_prompt)
            metrics.update(balance_metrics)
        # 3 the teacher's scores (on its own pool), old and reference log-probs and 4 values, started in this order,
        # then awaited in it: on separate pools (trainer.placement=split) the critic computes while the actor does
        teacher = phases.teacher.start(train_batch, timer)
        old = phases.old_log_probs.start(train_batch, timer, step)
        ref = phases.reference.start(train_batch, timer)
        values = phases.critic.start_values(train_batch, timer)
        train_batch = join_columns(train_batch, timer, teacher, old, ref, values)
        # 5 advantages, after the KL penalty in the reward and the rollout correction where the plan has them
        if not plan.skip_zero_signal:
            train_batch, adv_metrics = self.advantages(train_batch, timer)
            metrics.update(adv_metrics)
        # 6 critic update and 7 actor update, started in this order; the actor's is awaited first, so on separate
        # pools its time is its own
        critic_update = phases.critic.start_update(train_batch, timer)
        metrics.update(phases.actor(train_batch, timer, step, loss_counts))
        metrics.update(phases.critic.join_update(critic_update, timer))
        return batch, train_batch, metrics

    def _end_step(self, metrics: dict[str, float], tracker: Tracking, last: bool, save: bool = True) -> None:
        """Validate and save (unless ``save`` is False) on their schedules and at the end; metrics are logged
        before the save, so a run killed while saving redoes this step after resuming. Fully async counts
        ``trainer.save_freq`` and ``test_freq`` in weight versions, as verl does."""
        trainer, every = self.plan.trainer, self.plan.steps_per_version
        validate_now = trainer.test_freq > 0 and (last or self.global_step % (trainer.test_freq * every) == 0)
        if validate_now and self.val_loader is not None:
            metrics.update(self.validate(tracker))
        tracker.log(metrics, self.global_step)
        if save and trainer.save_freq > 0 and (last or self.global_step % (trainer.save_freq * every) == 0):
            self.save_checkpoint()

    def _start_run(self) -> Tracking:
        """Resume if a checkpoint says so, bring the rollout to the actor's weights, open the trackers, and
        validate a fresh run's starting policy."""
        resume_dir = self.checkpoints.resume_dir()
        if resume_dir is not None:
            self.load_checkpoint(resume_dir)
            print(f"resumed from {resume_dir} at step {self.global_step}")
        self.rollout.sync_before_first_step(self.global_step)
        trainer = self.plan.trainer
        run = RunInfo(
            trainer.project_name,
            trainer.experiment_name,
            self.run_dir,
            self.total_training_steps,
            first_step=self.global_step + 1 if resume_dir is not None else 0,
            config=self.plan.config_record,
        )
        tracker = Tracking(trainer.logger, run)
        # A resumed run's policy was validated (or not) by the run that saved it; validating again would
        # also shift the rollout seeds away from an uninterrupted run's.
        fresh = resume_dir is None
        if self.val_loader is not None and (trainer.val_only or (fresh and trainer.val_before_train)):
            tracker.log(self.validate(tracker), step=self.global_step)
        return tracker

    def _step_metrics(self, batch: DataProto, train_batch: DataProto, timer: StepTimer) -> dict[str, float]:
        plan, seconds = self.plan, timer.seconds
        metrics = {
            **compute_data_metrics(batch, use_critic=plan.uses_critic),
            # In bypass mode the old log-probs are the rollout's: nothing to compare.
            **({} if plan.bypass else compute_rollout_probs_diff_metrics(train_batch)),
            **compute_timing_metrics(batch, seconds),
            **compute_throughput_metrics(batch, seconds[names.PHASE_STEP], plan.world_size),
            names.GLOBAL_STEP: float(self.global_step),
            names.EPOCH: float(self.prompts.epoch),
        }
        if self.peak_flops and names.PHASE_UPDATE_ACTOR in seconds:
            metrics.update(
                compute_actor_mfu_metrics(
                    train_batch,
                    seconds[names.PHASE_UPDATE_ACTOR],
                    num_parameters=self.num_parameters,
                    ppo_epochs=plan.actor_rollout_ref.actor.ppo_epochs,
                    peak_flops_per_process=self.peak_flops,
                    num_processes=plan.world_size,
                )
            )
        return metrics

    # ------------------------------------------------------------------------------------- validation
    def validate(self, tracker: Tracking) -> dict[str, float]:
        """Generate for every validation prompt (``rollout.val_kwargs``) and score them:
        ``val-core/<data_source>/<metric>/mean@<n>`` and the rest of the per-source breakdown; with a reward model,
        its scores with the rules' extras beside them (``assembly.validation_scorer``). Samples go to
        ``tracker`` as a table (``trainer.log_val_generations``) and to ``trainer.validation_data_dir``."""
        timer = StepTimer()
        data_sources, uids, infos = [], [], defaultdict(list)
        generations = ValidationGenerations(self.tokenizer)
        with timer(names.PHASE_TESTING):
            self.rollout.use_current_weights(self.global_step)
            for index, prompts in enumerate(self.val_loader):
                batch, extra, _ = generate_and_score(
                    self.rollout.generate,
                    self.validation_score,
                    assign_uids(prompts, f"val{index}"),
                    timer,
                    validate=True,
                )
                generations.add(batch, extra)
                # verl's variables: ``reward`` (the summed token scores) and the reward manager's extras.
                columns = {"reward": batch.batch["token_level_scores"].sum(-1).tolist(), **extra}
                data_sources += [str(s) for s in batch.non_tensor_batch[self.plan.data.reward_fn_key]]
                uids += list(batch.non_tensor_batch["uid"])
                for key, values in columns.items():
                    infos[key] += list(values)
        trainer = self.plan.trainer
        if trainer.log_val_generations:
            tracker.log_generations(generations.table(trainer.log_val_generations), self.global_step)
        if trainer.validation_data_dir:
            generations.dump(trainer.validation_data_dir, self.global_step)
        metrics = process_validation_metrics(data_sources, uids, infos)
        metrics[names.timing(names.PHASE_TESTING)] = timer.seconds[names.PHASE_TESTING]
        return metrics

    # ------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> None:
        """Workers' model/optimizer/scheduler/RNG, then the driver's state, then the ``latest`` pointer."""
        with self.checkpoints.saving(self.global_step) as step_dir:
            self._save_parts(step_dir)
        self._saved_step = self.global_step

    def _save_parts(self, step_dir: pathlib.Path) -> None:
        self.actor_rollout.save_checkpoint(str(step_dir / ACTOR_DIR), self.global_step)
        self.phases.critic.save_checkpoint(str(step_dir / CRITIC_DIR), self.global_step)
        state = {
            "global_step": self.global_step,
            "data_loader": self.train_loader.state_dict(),
            "rng": capture_rng_state(),
            "rollout_calls": self.rollout.generate.calls,
            "reward_shaping": self.reward_shaping.state_dict(),
            "nonfinite": self.nonfinite.state_dict(),
            "collector": self.rollout.state_dict(),
            RESUME_STATE_KEY: self.plan.resume_keys,  # compared by the next run's config check
        }
        self.checkpoints.save_driver_state(step_dir, state)

    def load_checkpoint(self, step_dir: pathlib.Path) -> None:
        self.actor_rollout.load_checkpoint(str(step_dir / ACTOR_DIR))
        self.phases.critic.load_checkpoint(str(step_dir / CRITIC_DIR))
        state = self.checkpoints.load_driver_state(step_dir)
        self.global_step = state["global_step"]
        self.train_loader.load_state_dict(state["data_loader"])
        restore_rng_state(state["rng"])
        self.rollout.generate.calls = state["rollout_calls"]
        self.reward_shaping.load_state_dict(state["reward_shaping"])
        self.nonfinite.load_state_dict(state.get("nonfinite", {"steps": 0}))
        self.rollout.load_state_dict(state.get("collector", {}))
