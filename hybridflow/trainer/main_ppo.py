"""Entry point: ``python -m hybridflow.trainer.main_ppo key=value ...`` (Hydra overrides on ppo_trainer.yaml).

Order matters: the config is checked before transformers, tensordict and Ray are even imported, and the
data is loaded before Ray starts, so a typo costs a second or two, not a cluster start-up. Then a local Ray
cluster is started (or ``ray_init.address`` / ``RAY_ADDRESS`` joined), the workers are built, and the
driver loop runs in this process; with ``trainer.local_mode=true`` the workers are built in this process
too, and Ray never starts.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig

from hybridflow.config.command_line import CONFIG_CHECK_ENV, FULL_CHECK
from hybridflow.config.distillation_options import teacher_route_errors
from hybridflow.config.load import ConfigError, load_config_with_notes
from hybridflow.config.plan import RunPlan, build_plan, describe
from hybridflow.config.resume_checks import check_data_position
from hybridflow.config.reward_options import reward_manager_class, reward_manager_options, reward_manager_traits
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.config.verl_compat import PPO_SURFACE
from hybridflow.errors import RunInterrupted
from hybridflow.rewards import build_reward_manager, check_data_sources, load_custom_reward_function
from hybridflow.trainer.entry_point import checked_run, command_line
from hybridflow.trainer.error_boundary import WORKERS_STARTING

if TYPE_CHECKING:
    from hybridflow.data.rl_dataset import RLDataset
    from hybridflow.trainer.ppo_trainer import RayPPOTrainer


def prompt_tool_schemas(config: PPOTrainerConfig) -> list[dict] | None:
    """The multi-turn tools' function schemas, rendered into each prompt by the chat template (None: no tools)."""
    multi_turn = config.actor_rollout_ref.rollout.multi_turn
    if not (multi_turn.enable and multi_turn.tool_config_path):
        return None
    from hybridflow.rollout.tools import load_tools

    return [tool.schema for tool in load_tools(multi_turn.tool_config_path).values()] or None


def build_trainer(config: PPOTrainerConfig) -> RayPPOTrainer:
    """Tokenizer, datasets, the run plan, loaders and reward manager for ``config`` (no Ray needed yet)."""
    # Imported once the config is known to be good: they load transformers, tensordict and Ray (seconds).
    from hybridflow.data.sampler import StatefulDataLoader
    from hybridflow.models.loading import check_vocabulary, load_tokenizer
    from hybridflow.trainer.ppo_trainer import RayPPOTrainer

    data, model = config.data, config.actor_rollout_ref.model
    tokenizer = load_tokenizer(
        model.tokenizer_dir,
        trust_remote_code=data.trust_remote_code or model.trust_remote_code,
        chat_template=model.custom_chat_template,
    )
    check_vocabulary(tokenizer, model.tokenizer_dir, model.path, model.trust_remote_code)
    train_dataset, val_dataset = _datasets(config, tokenizer)
    if errors := teacher_route_errors(config, train_dataset.field_values):
        raise ConfigError(errors)
    reward_manager = _reward_manager(config, tokenizer, train_dataset, val_dataset)
    # Calibrated on the cluster, so Ray starts here; a config check (not --plan) leaves it unresolved
    if config.trainer.placement == "auto" and os.environ.get(CONFIG_CHECK_ENV) != FULL_CHECK:
        from hybridflow.trainer.auto_placement import resolve_auto_placement

        config = resolve_auto_placement(config, lambda: start_ray(config.ray_kwargs))
    # From here on, the plan is what the run reads.
    plan = build_plan(config, len(train_dataset))
    data = plan.data
    train_loader = StatefulDataLoader(
        train_dataset, plan.prompts_per_generation, shuffle=data.shuffle, seed=data.seed, drop_last=True
    )
    val_loader = None
    if val_dataset is not None:
        val_batch_size = data.val_batch_size or len(val_dataset)
        val_loader = StatefulDataLoader(
            val_dataset, val_batch_size, shuffle=data.validation_shuffle, seed=data.seed, drop_last=False
        )
    trainer = RayPPOTrainer(
        plan, tokenizer=tokenizer, train_loader=train_loader, val_loader=val_loader, reward_manager=reward_manager
    )
    check_data_position(trainer.checkpoints, train_loader)
    return trainer


def _reward_manager(config: PPOTrainerConfig, tokenizer: Any, train_dataset: Any, val_dataset: Any) -> Any:
    """The reward manager with the user's scoring function, or the registry's, which must then know every
    data_source of training and validation (unless the manager scores without a function, as the remote judge
    does); with a reward model, whose scores train and validate, the rules add what they can
    (``assembly.validation_scorer``)."""
    custom = config.custom_reward_function
    compute_score = load_custom_reward_function(custom.path, custom.name, custom.reward_kwargs) if custom.path else None
    registered_scoring = compute_score is None and reward_manager_traits(config)["scores_with_function"]
    if registered_scoring and not config.reward_model.enable:
        check_data_sources(train_dataset.data_sources() + (val_dataset.data_sources() if val_dataset else []))
    manager = reward_manager_class(config)
    return build_reward_manager(manager, tokenizer, compute_score, **reward_manager_options(config))


def _datasets(config: PPOTrainerConfig, tokenizer: Any) -> tuple[RLDataset, RLDataset | None]:
    """The training prompts and the validation prompts (None without ``data.val_files``)."""
    from hybridflow.data.rl_dataset import RLDataset

    data, tool_schemas = config.data, prompt_tool_schemas(config)

    def dataset(files: object, max_samples: int, shuffle: bool) -> RLDataset:
        return RLDataset(
            files,
            tokenizer,
            data.max_prompt_length,
            prompt_key=data.prompt_key,
            truncation=data.truncation,
            filter_overlong_prompts=data.filter_overlong_prompts,
            tools=tool_schemas,
            return_raw_chat=data.return_raw_chat,
            apply_chat_template_kwargs=data.apply_chat_template_kwargs,
            max_samples=max_samples,
            shuffle=shuffle,
            seed=data.seed,
        )

    val = dataset(data.val_files, data.val_max_samples, False) if data.val_files else None
    return dataset(data.train_files, data.train_max_samples, data.shuffle), val


def apply_runtime_env(plan: RunPlan) -> None:
    """Local mode: the job's ``runtime_env.env_vars``, which Ray would give each worker, set in this process."""
    env_vars = plan.ray_kwargs.ray_init.runtime_env.get("env_vars") or {}
    os.environ.update({str(key): str(value) for key, value in env_vars.items()})


def start_ray(ray_kwargs: Any) -> None:
    """Start a local Ray cluster, or join ``ray_init.address`` / ``RAY_ADDRESS`` (a no-op once started)."""
    from hybridflow.distributed import init_local_ray

    ray_init = ray_kwargs.ray_init
    init_local_ray(
        num_cpus=ray_init.num_cpus,
        num_gpus=ray_init.num_gpus,
        object_store_memory=ray_init.object_store_memory,
        temp_dir=ray_init.temp_dir,
        address=ray_init.address,
        runtime_env={key: value for key, value in ray_init.runtime_env.items() if value is not None},
        keep_task_events=bool(ray_kwargs.timeline_json_file),
    )


def run_ppo(config: PPOTrainerConfig, trainer: RayPPOTrainer | None = None) -> None:
    """Start Ray and the workers and train; ``trainer`` is ``build_trainer(config)`` when already built. Local mode
    neither starts nor imports Ray."""
    trainer = trainer or build_trainer(config)
    plan = trainer.plan
    for line in describe(plan):
        print(f"[hybridflow] {line}")
    ray_kwargs = plan.ray_kwargs
    print(WORKERS_STARTING, flush=True)
    if plan.local:
        apply_runtime_env(plan)
    else:
        start_ray(ray_kwargs)
    try:
        trainer.init_workers()
        for line in trainer.workers.placement_lines():
            print(f"[hybridflow] {line}", flush=True)
        trainer.fit()
    except KeyboardInterrupt:
        raise RunInterrupted(
            f"interrupted (Ctrl-C) during step {trainer.global_step}; {trainer.checkpoints.resume_hint()}"
        ) from None
    finally:
        if ray_kwargs.timeline_json_file:
            import ray

            ray.timeline(filename=ray_kwargs.timeline_json_file)
        trainer.shutdown()


@hydra.main(config_path="../config/yaml", config_name="ppo_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    checked_run(
        "main_ppo",
        lambda check_environment: load_config_with_notes(cfg, check_environment),
        build_trainer,
        run_ppo,
        describe=lambda trainer: describe(trainer.plan),
    )


def cli(argv: list[str]) -> None:
    """``python -m hybridflow.trainer.main_ppo <argv>``."""
    command_line("main_ppo", argv, PPO_SURFACE, PPOTrainerConfig, main)


def cli_on_config(config_name: str, argv: list[str]) -> None:
    """``cli`` on ``config_name`` (verl's experimental entry points), unless the command line names another."""
    names_config = any(arg.startswith(("--config-name", "-cn")) for arg in argv)
    cli(argv if names_config else [f"--config-name={config_name}", *argv])


if __name__ == "__main__":
    cli(sys.argv[1:])
