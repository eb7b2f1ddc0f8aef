"""The PPO driver: one Python loop on the single controller calling SPMD worker groups (arXiv 2409.19256).

``RayPPOTrainer.fit`` runs the steps in ARCHITECTURE.md for every advantage estimator in
``hybridflow.algos``. What a run needs (critic, reference policy, KL in the reward, dynamic sampling, a
greedy ReMax baseline, rollout dumps) and the work it can skip exactly (``exact_skips``: the old-log-prob
pass of an on-policy update, the samples without policy gradient) is decided once in
``__init__``/``init_workers`` by choosing phase objects; the step reads the same for all of them. Each
phase is timed as ``timing_s/<phase>``. Three switches show in the step itself: ``trainer.balance_batch``
reorders the samples over the data-parallel ranks before phase 3, rollout correction's bypass mode
(``algorithm.rollout_correction.bypass_mode``) takes the engine's log-probs as the old ones instead of
phase 3's pass, and ``trainer.critic_warmup`` leaves the actor update (phase 7) out of the first steps.
Differs from verl: verl skips the actor update while ``global_step < critic_warmup`` (one step fewer, as
steps count from 1); here the first ``critic_warmup`` steps skip it, as the key's documentation says. Fully async
training (``async_training.enable``) is a collector too; its run length and its save and test frequencies, which
count weight versions as verl's do, are decided once in ``__init__``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import pathlib
from collections import defaultdict
from typing import Any, Callable

from hybridflow.distributed import RayClassWithInitArgs
from hybridflow.rewards import process_validation_metrics
from hybridflow.trainer import metric_names as names
from hybridflow.trainer.checkpoint_manager import (
    ACTOR_DIR,
    CRITIC_DIR,
    CheckpointManager,
    capture_rng_state,
    restore_rng_state,
)
from hybridflow.trainer.config_schema import PPOTrainerConfig
from hybridflow.trainer.estimator_metrics import RewardComponentMetrics, VarianceProxyMetrics
from hybridflow.trainer.exact_skips import skips_old_log_prob, skips_zero_signal_samples
from hybridflow.trainer.fully_async_collection import FullyAsyncCollector, TrainerIdleRatio
from hybridflow.trainer.fully_async_options import (
    concurrent_samples, fully_async, max_required_samples, partial_rollout, required_samples, steps_per_version,
)
from hybridflow.trainer.fully_async_options import training_steps as fully_async_training_steps
from hybridflow.trainer.hooks import RolloutDump, StepHook
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
    Critic,
    KLInReward,
    NoCritic,
    NoReference,
    NoRolloutCorrection,
    OldLogProbs,
    PhaseCalls,
    ReferencePolicy,
    RolloutCorrection,
    ScoresAsRewards,
    StepTimer,
    actor_update_input,
    balance_batch,
    join_columns,
    rollout_log_probs_as_old,
    rows_with_signal,
    worker_metrics,
)
from hybridflow.trainer.placement import (
    ROLLOUT_ROLE, ResourcePlan, WorkerGroups, create_local_worker_groups, create_worker_groups, make_resource_plan,
)
from hybridflow.trainer.resume_checks import STATE_KEY as RESUME_STATE_KEY, resume_keys
from hybridflow.trainer.rollout_correction_options import bypass_correction, correction_settings, uses_bypass
from hybridflow.trainer.rollout_pool_options import one_step_off
from hybridflow.trainer.rollout_collection import (
    DynamicSamplingCollector,
    EndOfData,
    Generation,
    GreedyBaseline,
    OneStepOffCollector,
    PromptSource,
    RolloutCollector,
    RolloutWeightSync,
    assign_uids,
    generate_and_score,
    reward_scorer,
)
from hybridflow.trainer.tracking import RunInfo, Tracking
from hybridflow.trainer.val_generations import ValidationGenerations
from hybridflow.trainer.validate import num_processes, uses_critic, uses_reference
from hybridflow.workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker


class RayPPOTrainer:
    """Trains ``config.actor_rollout_ref`` with PPO-family RL on the prompts of ``train_loader``.

    ``train_loader``/``val_loader`` are ``hybridflow.data.sampler.StatefulDataLoader``s (``val_loader`` may
    be None); ``reward_manager`` is a ``hybridflow.rewards`` manager. Call ``init_workers()``, then ``fit()``.
    """

    def __init__(
        self, config: PPOTrainerConfig, *, tokenizer: Any, train_loader: Any, val_loader: Any, reward_manager: Any
    ):
        self.config = config
        self.tokenizer = tokenizer
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.reward_manager = reward_manager
        trainer = config.trainer
        # val_only: validate once, train zero steps.
        if trainer.val_only:
            self.total_training_steps = 0
        elif fully_async(config):  # the loader's batches are single prompts (fully_async_options)
            self.total_training_steps = fully_async_training_steps(config, len(train_loader))
        else:
            self.total_training_steps = trainer.total_training_steps or len(train_loader) * trainer.total_epochs
        # Fully async counts trainer.save_freq and test_freq in weight versions, as verl does
        self.steps_per_version = steps_per_version(config)
        self.prompts = PromptSource(train_loader, trainer.total_epochs)
        self.run_dir = pathlib.Path(trainer.default_local_dir)
        self.checkpoints = CheckpointManager(
            self.run_dir, trainer.resume_mode, trainer.resume_from_path,
            max_to_keep={ACTOR_DIR: trainer.max_actor_ckpt_to_keep, CRITIC_DIR: trainer.max_critic_ckpt_to_keep},
        )
        self.reward_shaping = KLInReward(config.algorithm) if config.algorithm.use_kl_in_reward else ScoresAsRewards()
        self.nonfinite = NonFiniteGuard(config.trainer.max_nonfinite_steps)
        self.estimator = AdvantageEstimator(config.algorithm)
        self.bypass_mode = uses_bypass(config)
        self.advantages = Advantages(self.reward_shaping, self._rollout_correction(), self.estimator)
        # Work skipped exactly (exact_skips), decided once: the samples without signal, the old-log-prob pass
        self.signal_only = skips_zero_signal_samples(config)
        self.old_log_probs_from_update = skips_old_log_prob(config)
        self.uses_critic = uses_critic(config)
        self.hooks: list[StepHook] = []
        if trainer.rollout_data_dir:
            self.hooks.append(RolloutDump(trainer.rollout_data_dir, trainer.rollout_dump_freq, tokenizer))
        if config.algorithm.gdpo_reward_keys:
            self.hooks.append(RewardComponentMetrics(config.algorithm.gdpo_reward_keys))
        if config.actor_rollout_ref.actor.calculate_sum_pi_squared:
            self.hooks.append(VarianceProxyMetrics())
        if fully_async(config):
            self.hooks.append(TrainerIdleRatio())
        self.global_step = 0
        self._saved_step = -1
        self.workers = None

    # ----------------------------------------------------------------------------------------- workers
    def init_workers(self, start_workers: Callable[[ResourcePlan, dict], WorkerGroups] | None = None) -> None:
        """Start the worker groups (colocated or split), load their models, and pick the phase objects.

        ``start_workers`` turns the resource plan and {role: RayClassWithInitArgs} into running groups: Ray
        actors by default, this process in ``trainer.local_mode``.
        """
        config, trainer = self.config, self.config.trainer
        if start_workers is None and trainer.local_mode:
            start_workers = create_local_worker_groups
        elif start_workers is None:
            # Partial rollout's weight syncs land in the rollout pool's generation in flight
            concurrent = frozenset({ROLLOUT_ROLE}) if partial_rollout(config) else frozenset()
            start_workers = functools.partial(create_worker_groups, concurrent_roles=concurrent)
        # With hybrid_engine=false the rollout is a role of its own, on its own pool (rollout_pool_options)
        rollout_role = "" if one_step_off(config) else "_rollout"
        actor_role = f"actor{rollout_role}_ref" if uses_reference(config) else f"actor{rollout_role}"
        actor_config = self._with_run_length(config.actor_rollout_ref, "actor")
        role_classes = {
            "actor_rollout_ref": RayClassWithInitArgs(
                ActorRolloutRefWorker, config=actor_config, role=actor_role, bypass=bypass_correction(config)
            )
        }
        if one_step_off(config):
            role_classes[ROLLOUT_ROLE] = RayClassWithInitArgs(ActorRolloutRefWorker, config=actor_config, role="rollout")
        if self.uses_critic:
            critic_config = self._with_run_length(config.critic, None)
            role_classes["critic"] = RayClassWithInitArgs(CriticWorker, config=critic_config)
        if config.reward_model.enable:
            role_classes["reward_model"] = RayClassWithInitArgs(RewardModelWorker, config=config.reward_model)
        plan = make_resource_plan(
            trainer.placement, list(role_classes), nnodes=trainer.nnodes, processes_per_node=trainer.n_gpus_per_node,
            use_gpu=trainer.device == "cuda", cpus_per_process=trainer.cpus_per_worker,
            rollout_pool_shape=(config.rollout.nnodes, config.rollout.n_gpus_per_node),
        )
        self.workers = start_workers(plan, role_classes)
        groups = self.workers.roles
        for group in groups.values():
            group.init_model()
        self.actor_rollout = groups["actor_rollout_ref"]
        # The critic on a pool of its own computes and trains while the actor does (phases 3 with 4, 6 with 7);
        # in local mode every pool is this process, so its calls run one after another
        critic_pool = plan.role_pool.get("critic")
        own_pool = critic_pool not in (None, plan.role_pool["actor_rollout_ref"])
        self.calls = PhaseCalls(overlap=own_pool and not trainer.local_mode)
        self.old_log_probs = OldLogProbs(self.actor_rollout, self.calls)
        self.reference = ReferencePolicy(self.actor_rollout, self.calls) if uses_reference(config) else NoReference()
        self.critic = Critic(groups["critic"], self.calls) if self.uses_critic else NoCritic()
        self.collector = self._make_collector(groups.get(ROLLOUT_ROLE, self.actor_rollout), groups.get("reward_model"))
        self.num_processes = num_processes(config)
        self.num_parameters = count_parameters(config.actor_rollout_ref.model.path)
        self.peak_flops = peak_flops_per_process(
            trainer.peak_flops_per_device, trainer.device, trainer.cpus_per_worker
        )

    def _rollout_correction(self) -> RolloutCorrection | NoRolloutCorrection:
        """Decoupled mode corrects in phase 5 wherever the batch holds both the engine's log-probs and the
        old-log-prob pass's (weights and rejection as configured; else the mismatch metrics alone)."""
        config = self.config
        engine_log_probs = config.actor_rollout_ref.rollout.calculate_log_probs
        if engine_log_probs and not self.bypass_mode and not skips_old_log_prob(config):
            return RolloutCorrection(correction_settings(config))
        return NoRolloutCorrection()

    def _with_run_length(self, section: Any, optim_owner: str | None) -> Any:
        """A copy of ``section`` whose lr schedule spans this run when its ``total_training_steps`` is -1."""
        section = copy.deepcopy(section)
        optim = (getattr(section, optim_owner) if optim_owner else section).optim
        if optim.total_training_steps < 0:
            optim.total_training_steps = self.total_training_steps
        return section

    def _make_collector(self, rollout_group: Any, reward_model_group: Any) -> RolloutCollector:
        rollout = self.config.actor_rollout_ref.rollout
        meta = {"eos_token_id": self.tokenizer.eos_token_id, "pad_token_id": self.tokenizer.pad_token_id}
        if partial_rollout(self.config):
            meta["record_weight_versions"] = True
        self.generate = Generation(rollout_group, meta, seed=rollout.seed, n=rollout.n, val_n=rollout.val_kwargs.n)
        self.score = reward_scorer(self.reward_manager, reward_model_group)
        if one_step_off(self.config):
            sync = RolloutWeightSync(
                self.actor_rollout, rollout_group, rollout.checkpoint_engine.update_weights_bucket_megabytes
            )
            if fully_async(self.config):
                required = required_samples(self.config)
                return FullyAsyncCollector(
                    self.generate, self.score, sync, required=required,
                    max_required=max_required_samples(self.config), concurrent=concurrent_samples(self.config),
                    steps_per_sync=self.steps_per_version, total_prompts=self.total_training_steps * required,
                    partial_rollout=partial_rollout(self.config),
                )
            return OneStepOffCollector(self.generate, self.score, sync, self.total_training_steps)
        baseline = GreedyBaseline() if "reward_baselines" in self.estimator.readers else None
        filter_groups = self.config.algorithm.filter_groups
        if not filter_groups.enable:
            return RolloutCollector(self.generate, self.score, baseline)
        return DynamicSamplingCollector(
            self.generate, self.score, baseline, train_batch_size=self.config.data.train_batch_size,
            metric=filter_groups.metric, max_num_gen_batches=filter_groups.max_num_gen_batches,
        )

    def shutdown(self) -> None:
        """Stop the workers and the reward manager's scoring threads."""
        if self.workers is not None:
            self.workers.shutdown()
        self.reward_manager.close()

    # --------------------------------------------------------------------------------------------- fit
    def fit(self) -> None:
        """Train for ``total_training_steps`` steps (or until the prompts run out)."""
        tracker = self._start_run()
        trainer = self.config.trainer
        try:
            while self.global_step < self.total_training_steps:
                self.global_step += 1
                timer = StepTimer()
                with timer(names.PHASE_STEP):
                    # 1 rollout and 2 reward (dynamic sampling repeats both until enough groups vary)
                    batch, reward_metrics = self.collector.collect(self.prompts, timer, self.global_step)
                    # Scores that are not finite would make every later phase NaN: the step trains nothing
                    if not self.nonfinite.scores_are_finite(batch, self.global_step):
                        last = self.global_step == self.total_training_steps
                        metrics = {**reward_metrics, **self.nonfinite.metrics(self.global_step)}
                        self._end_step(metrics, tracker, last, save=False)
                        continue
                    # signal_only: 5 runs now, on the scores alone (all it reads here), and the samples whose
                    # advantages are all 0 skip 3-7; the actor keeps the whole batch's loss counts
                    train_batch, loss_counts, adv_metrics = batch, None, {}
                    if self.signal_only:
                        batch, adv_metrics = self.advantages(batch, timer)
                        train_batch, loss_counts = rows_with_signal(batch, self.num_processes)
                    balance_metrics = {}
                    if trainer.balance_batch:  # reordered so every data-parallel rank gets about as many tokens
                        train_batch, balance_metrics = balance_batch(train_batch, self.num_processes)
                    # 3 old and reference log-probs and 4 values, started in this order, then awaited in it: on
                    # separate pools (trainer.placement=split) the critic computes while the actor does. Old: the
                    # rollout engine's own in rollout correction's bypass mode, the update's own when it is
                    # on-policy (old_log_probs_from_update), else a forward pass
                    old = None
                    if self.bypass_mode:
                        train_batch = rollout_log_probs_as_old(train_batch)
                    elif not self.old_log_probs_from_update:
                        old = self.old_log_probs.start(train_batch, timer)
                    ref = self.reference.start(train_batch, timer)
                    values = self.critic.start_values(train_batch, timer)
                    train_batch = join_columns(train_batch, timer, old, ref, values)
                    # 5 advantages, after the KL penalty in the reward when it is used and the decoupled rollout
                    # correction (importance weights, rejection); run before 3 when signal_only
                    if not self.signal_only:
                        train_batch, adv_metrics = self.advantages(train_batch, timer)
                    # 6 critic update and 7 actor update, started in this order; the actor's is awaited first, so
                    # on separate pools its time is its own. No actor update in the first trainer.critic_warmup
                    # steps (they train only the critic); its new weights reach the rollout engine before the
                    # next generation
                    critic_update = self.critic.start_update(train_batch, timer)
                    actor_metrics = {}
                    if self.global_step > trainer.critic_warmup:
                        actor_update = self.calls.start(
                            timer, names.PHASE_UPDATE_ACTOR, self.actor_rollout.update_actor,
                            actor_update_input(train_batch, self.old_log_probs_from_update),
                            old_log_probs_from_update=self.old_log_probs_from_update, loss_counts=loss_counts,
                        )
                        actor_metrics = worker_metrics(actor_update.join(timer), names.ACTOR_PREFIX)
                    critic_metrics = self.critic.join_update(critic_update, timer)
                # Batch metrics describe every sample of the step, trained on or not.
                metrics = {
                    **reward_metrics, **balance_metrics, **adv_metrics, **critic_metrics, **actor_metrics,
                    **self._step_metrics(batch, train_batch, timer),
                }
                # A loss or gradient norm that was not finite (its optimizer steps were skipped): not saved
                finite = self.nonfinite.updates_are_finite(metrics, self.global_step)
                metrics.update(self.nonfinite.metrics(self.global_step))
                for hook in self.hooks:
                    hook.after_step(self.global_step, batch, metrics)
                self._end_step(metrics, tracker, last=self.global_step == self.total_training_steps, save=finite)
        except EndOfData as end:
            self.global_step -= 1
            print(f"stopping after step {self.global_step}: {end}")
            # Unless saved already, or its values were not finite (such a step is never saved)
            unsaved = self.global_step not in (self._saved_step, self.nonfinite.last_step)
            if self.config.trainer.save_freq > 0 and unsaved:
                self.save_checkpoint()
        finally:
            tracker.close()

    def _end_step(self, metrics: dict[str, float], tracker: Tracking, last: bool, save: bool = True) -> None:
        """Validate and save (unless ``save`` is False) on their schedules and at the end; metrics are logged
        before the save, so a run killed while saving redoes this step after resuming."""
        trainer, every = self.config.trainer, self.steps_per_version
        validate_now = trainer.test_freq > 0 and (last or self.global_step % (trainer.test_freq * every) == 0)
        if validate_now and self.val_loader is not None:
            metrics.update(self.validate(tracker))
        tracker.log(metrics, self.global_step)
        if save and trainer.save_freq > 0 and (last or self.global_step % (trainer.save_freq * every) == 0):
            self.save_checkpoint()

    def _start_run(self) -> Tracking:
        """Resume if a checkpoint says so, open the trackers, and validate a fresh run's starting policy."""
        resume_dir = self.checkpoints.resume_dir()
        if resume_dir is not None:
            self.load_checkpoint(resume_dir)
            print(f"resumed from {resume_dir} at step {self.global_step}")
        trainer = self.config.trainer
        run = RunInfo(
            trainer.project_name, trainer.experiment_name, self.run_dir, self.total_training_steps,
            first_step=self.global_step + 1 if resume_dir is not None else 0, config=dataclasses.asdict(self.config),
        )
        tracker = Tracking(trainer.logger, run)
        # A resumed run's policy was validated (or not) by the run that saved it; validating again would
        # also shift the rollout seeds away from an uninterrupted run's.
        fresh = resume_dir is None
        if self.val_loader is not None and (trainer.val_only or (fresh and trainer.val_before_train)):
            tracker.log(self.validate(tracker), step=self.global_step)
        return tracker

    def _step_metrics(self, batch: Any, train_batch: Any, timer: StepTimer) -> dict[str, float]:
        seconds = timer.seconds
        metrics = {
            **compute_data_metrics(batch, use_critic=self.uses_critic),
            # In bypass mode the old log-probs are the rollout's: nothing to compare.
            **({} if self.bypass_mode else compute_rollout_probs_diff_metrics(train_batch)),
            **compute_timing_metrics(batch, seconds),
            **compute_throughput_metrics(batch, seconds[names.PHASE_STEP], self.num_processes),
            names.GLOBAL_STEP: float(self.global_step),
            names.EPOCH: float(self.prompts.epoch),
        }
        if self.peak_flops and names.PHASE_UPDATE_ACTOR in seconds:
            mfu = compute_actor_mfu_metrics(
                train_batch,
                seconds[names.PHASE_UPDATE_ACTOR],
                num_parameters=self.num_parameters,
                ppo_epochs=self.config.actor_rollout_ref.actor.ppo_epochs,
                peak_flops_per_process=self.peak_flops,
                num_processes=self.num_processes,
            )
            metrics.update(mfu)
        return metrics

    # ------------------------------------------------------------------------------------- validation
    def validate(self, tracker: Tracking) -> dict[str, float]:
        """Generate for every validation prompt (``rollout.val_kwargs``) and score them:
        ``val-core/<data_source>/<metric>/mean@<n>`` and the rest of the per-source breakdown. Samples go to
        ``tracker`` as a table (``trainer.log_val_generations``) and to ``trainer.validation_data_dir``."""
        timer = StepTimer()
        data_sources, uids, infos = [], [], defaultdict(list)
        generations = ValidationGenerations(self.tokenizer)
        with timer(names.PHASE_TESTING):
            self.collector.use_current_weights(self.global_step)
            for index, prompts in enumerate(self.val_loader):
                batch, extra, _ = generate_and_score(
                    self.generate, self.score, assign_uids(prompts, f"val{index}"), timer, validate=True
                )
                generations.add(batch, extra)
                # verl's variables: ``reward`` (the summed token scores) and the reward manager's extras.
                columns = {"reward": batch.batch["token_level_scores"].sum(-1).tolist(), **extra}
                data_sources += [str(s) for s in batch.non_tensor_batch[self.config.data.reward_fn_key]]
                uids += list(batch.non_tensor_batch["uid"])
                for key, values in columns.items():
                    infos[key] += list(values)
        trainer = self.config.trainer
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
        self.critic.save_checkpoint(str(step_dir / CRITIC_DIR), self.global_step)
        state = {
            "global_step": self.global_step,
            "data_loader": self.train_loader.state_dict(),
            "rng": capture_rng_state(),
            "rollout_calls": self.generate.calls,
            "reward_shaping": self.reward_shaping.state_dict(),
            "nonfinite": self.nonfinite.state_dict(),
            "collector": self.collector.state_dict(),
            RESUME_STATE_KEY: resume_keys(self.config, self.uses_critic),  # compared by the next run's config check
        }
        self.checkpoints.save_driver_state(step_dir, state)

    def load_checkpoint(self, step_dir: pathlib.Path) -> None:
        self.actor_rollout.load_checkpoint(str(step_dir / ACTOR_DIR))
        self.critic.load_checkpoint(str(step_dir / CRITIC_DIR))
        state = self.checkpoints.load_driver_state(step_dir)
        self.global_step = state["global_step"]
        self.train_loader.load_state_dict(state["data_loader"])
        restore_rng_state(state["rng"])
        self.generate.calls = state["rollout_calls"]
        self.reward_shaping.load_state_dict(state["reward_shaping"])
        self.nonfinite.load_state_dict(state.get("nonfinite", {"steps": 0}))
        self.collector.load_state_dict(state.get("collector", {}))

