"""Config errors are caught before anything starts, all at once, each naming its key and the fix."""

import dataclasses
import os
import subprocess
import sys

from omegaconf import OmegaConf

from hybridflow.config.command_line import override_errors as unknown_override_errors
from hybridflow.config.environment import cpu_has_native_bf16, slow_dtype_notes
from hybridflow.config.load import load_config
from hybridflow.config.phases import uses_critic
from hybridflow.config.plan import describe
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.config.verl_compat import split_compat
from tests.trainer.cli import HANG_GUARD_S
from tests.trainer.helpers import compose_config, config_errors, plan_of


def _one_error(overrides, *fragments) -> str:
    errors = config_errors(overrides)
    assert len(errors) == 1, errors
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    assert "\n" not in errors[0]
    return errors[0]


def test_a_valid_config_loads_as_the_schema(base):
    config = load_config(compose_config(base))
    assert isinstance(config, PPOTrainerConfig)
    # Interpolations follow their sources: the rollout lengths and the critic's samples per prompt.
    assert config.actor_rollout_ref.rollout.response_length == 8
    assert config.critic.rollout_n == 2


def test_unknown_key_names_the_close_match(base):
    _one_error(base + ["+trainer.sav_freq=1"], "trainer.sav_freq", "did you mean trainer.save_freq?")
    _one_error(
        base + ["+actor_rollout_ref.actor.optim.learning_rate=1"],
        "actor_rollout_ref.actor.optim.learning_rate",
        "valid keys: lr,",
    )


def test_clip_keys_are_set_on_the_actor_and_reach_the_policy_loss(base):
    _one_error(
        base + ["+actor_rollout_ref.actor.policy_loss.clip_ratio_low=0.3"],
        "actor_rollout_ref.actor.policy_loss.clip_ratio_low is not a config key",
        "did you mean actor_rollout_ref.actor.clip_ratio_low?",
    )

    def bounds(*overrides):
        loss_config = load_config(compose_config(base + list(overrides))).actor_rollout_ref.actor.policy_loss_config()
        return loss_config.clip_ratio_low, loss_config.clip_ratio_high

    assert bounds() == (0.2, 0.2)
    assert bounds("actor_rollout_ref.actor.clip_ratio=0.3") == (0.3, 0.3)
    assert bounds("actor_rollout_ref.actor.clip_ratio_high=0.28") == (0.2, 0.28)


def test_command_line_keys_that_hydra_would_refuse_are_named_first():
    overrides = ["actor_rollout_ref.actor.policy_loss.clip_ratio_low=0.3", "trainer.save_freq=1", "hydra.run.dir=x"]
    errors = unknown_override_errors(overrides + ["+trainer.added=1", "++trainer.forced=1", "--multirun"])
    assert errors[0] == (
        "actor_rollout_ref.actor.policy_loss.clip_ratio_low is not a config key; "
        "did you mean actor_rollout_ref.actor.clip_ratio_low?"
    )
    # A key added with + is named too (the schema has no free keys there); ++ is left to Hydra.
    assert errors[1].startswith("trainer.added is not a config key") and len(errors) == 2


def test_policy_loss_values_are_checked_under_their_full_key(base):
    actor = "actor_rollout_ref.actor"
    _one_error(base + [f"{actor}.clip_ratio_c=0.5"], f"{actor}.clip_ratio_c=0.5 must be > 1")
    _one_error(base + [f"{actor}.policy_loss.tau_neg=0"], f"{actor}.policy_loss.tau_neg=0.0 must be > 0")
    _one_error(base + [f"{actor}.loss_agg_mode=mean"], f"{actor}.loss_agg_mode='mean' must be one of [")


def test_batch_size_that_does_not_divide(base):
    _one_error(
        base + ["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=4"],
        "data.train_batch_size=6 is not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "choose a mini-batch size that divides it",
    )
    _one_error(
        base + ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
        "ppo_micro_batch_size_per_gpu=3 does not divide the 4 samples per rank",
    )
    _one_error(
        base + ["trainer.n_gpus_per_node=3", "ray_init.num_cpus=3"],
        "do not split over 3 worker processes",
        "make it a multiple of 3",
    )


def test_missing_model_and_data_files(base, tmp_path):
    _one_error(
        base + [f"actor_rollout_ref.model.path={tmp_path / 'nope'}"],
        "actor_rollout_ref.model.path=",
        "point it at a local model folder",
    )
    _one_error(base + [f"data.train_files={tmp_path / 'nope.parquet'}"], "data.train_files entry", "does not exist")
    _one_error(base + [f"data.val_files=[{tmp_path / 'a.parquet'}]"], "data.val_files entry", "a.parquet")


def test_estimator_that_needs_a_critic_without_one(base):
    no_critic = ["algorithm.adv_estimator=gae", "critic.model.path=''"]
    message = _one_error(base + no_critic, "critic.model.path is empty", "'gae' needs a critic")
    assert "grpo" in message  # the estimators that work without one are listed
    load_config(compose_config(base + ["algorithm.adv_estimator=grpo", "critic.model.path=''"]))


def test_critic_warmup_needs_a_critic_and_counts_cannot_be_negative(base):
    _one_error(base + ["trainer.critic_warmup=2"], "trainer.critic_warmup=2 warms up a critic", "grpo has none")
    load_config(compose_config(base + ["trainer.critic_warmup=2", "algorithm.adv_estimator=gae"]))
    _one_error(base + ["trainer.log_val_generations=-1"], "trainer.log_val_generations=-1 must be >= 0")


def test_wrong_type_and_unknown_names(base):
    _one_error(base + ["data.train_batch_size=many"], "data.train_batch_size", "could not be converted to Integer")
    _one_error(base + ["algorithm.adv_estimator=gpro"], "algorithm.adv_estimator='gpro'", "grpo")
    _one_error(base + ["trainer.logger=[console,tensorbord]"], "trainer.logger entry", "tensorboard")
    _one_error(base + ["actor_rollout_ref.rollout.temperature=-1"], "actor_rollout_ref.rollout.temperature=-1.0")


def test_dynamic_sampling_needs_several_samples_and_a_group_estimator_on_one_is_noted(base):
    _one_error(
        base + ["actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=gae", "algorithm.filter_groups.enable=true"],
        "filter_groups",
        "rollout.n>=2",
    )
    # verl runs a group estimator on one sample per prompt (its advantage is then the raw score); so does
    # hybridflow, saying so at start-up.
    single = plan_of(base + ["actor_rollout_ref.rollout.n=1"])
    assert any("algorithm.adv_estimator='grpo' compares the samples" in line for line in describe(single))


def test_local_cluster_too_small_for_the_workers(base):
    _one_error(
        base + ["algorithm.adv_estimator=gae", "trainer.placement=split", "ray_init.num_cpus=1"],
        "needs 2 CPUs (2 pool(s) x 1 process(es) x trainer.cpus_per_worker=1)",
        "ray_init.num_cpus=1",
    )
    fits = ["algorithm.adv_estimator=gae", "trainer.placement=split", "ray_init.num_cpus=1"]
    fits.append("trainer.cpus_per_worker=0.5")
    load_config(compose_config(base + fits))


def test_resume_path_must_exist(base, tmp_path):
    _one_error(
        base + [f"trainer.resume_mode={tmp_path / 'global_step_3'}"], "trainer.resume_mode=", "fix the path or use auto"
    )
    _one_error(base + ["trainer.resume_mode=resume_path"], "trainer.resume_from_path")


def test_every_problem_is_reported_at_once(base, tmp_path):
    errors = config_errors(base + ["+trainer.sav_freq=1", "data.train_batch_size=many"])
    assert len(errors) == 2
    errors = config_errors(
        base + [f"actor_rollout_ref.model.path={tmp_path}", "data.train_batch_size=5", "trainer.save_freq=0"]
    )
    assert len(errors) == 3, errors  # model path, actor mini-batch, save_freq


def _keys(node, prefix=""):
    keys = set()
    for key, value in node.items():
        keys.add(prefix + key)
        if isinstance(value, dict):
            keys |= _keys(value, f"{prefix}{key}.")
    return keys


def test_yaml_lists_exactly_the_schema_keys():
    """Every key can be overridden on the command line without '+', and the yaml has no stale key (verl's keys
    that the schema lacks come from verl_compat.yaml and are taken out before the schema sees them)."""
    from_yaml = OmegaConf.to_container(split_compat(compose_config([]))[0], resolve=False)
    from_schema = dataclasses.asdict(PPOTrainerConfig())
    assert _keys(from_yaml) == _keys(from_schema)


def test_the_plan_spells_out_the_sizes(base):
    lines = describe(plan_of(base, train_prompts=16))  # 4 batches of 4 prompts
    assert lines[0] == "mode: synchronous, in Ray; 4 training steps"
    assert "samples per step: 4 prompts x 2 = 8" in lines
    assert any("actor mini-batches per epoch: 2" in line for line in lines)
    assert any("micro-batches per mini-batch per rank: 2 of 2 samples" in line for line in lines)


def test_cli_refuses_a_bad_config_before_starting_ray(base, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "hybridflow.trainer.main_ppo", *base, "+trainer.sav_freq=1", "data.train_batch_size=6"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 2, result.stderr
    assert "trainer.sav_freq is not a config key; did you mean trainer.save_freq?" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_checking_a_config_loads_no_models_engines_or_ray():
    """So a config error shows in about a second: only torch (for the registries) and Hydra are loaded."""
    script = (
        "import sys\n"
        "from hybridflow.trainer import main_ppo\n"
        "from hybridflow.config import load, plan\n"
        "try:\n"
        "    load.load_config({'data': {'train_batch_size': 7}})\n"
        "except load.ConfigError:\n"
        "    pass\n"
        "print(sorted(name for name in ('transformers', 'ray', 'tensordict', 'peft', 'vllm') if name in sys.modules))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=HANG_GUARD_S
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_critic_enable_forces_the_critic_either_way(base):
    with_critic = load_config(compose_config(base + ["critic.enable=true"]))
    assert uses_critic(with_critic) and not uses_critic(load_config(compose_config(base)))
    _one_error(base + ["algorithm.adv_estimator=gae", "critic.enable=false"], "critic.enable=false", "'gae'")


def test_gen_batch_size_only_sizes_dynamic_sampling(base):
    _one_error(base + ["data.gen_batch_size=8"], "data.gen_batch_size=8", "algorithm.filter_groups.enable=true")
    config = load_config(compose_config(base + ["data.gen_batch_size=8", "algorithm.filter_groups.enable=true"]))
    assert config.data.gen_batch_size == 8


def test_a_misspelled_name_gets_its_close_match(base):
    errors = config_errors(
        base
        + [
            "actor_rollout_ref.rollout.name=hff",
            "actor_rollout_ref.rollout.multi_turn.format=hermez",
            "algorithm.kl_ctrl.type=zzz",
        ]
    )
    assert errors == [
        "algorithm.kl_ctrl.type='zzz' is not one of [adaptive, fixed]; choose one of them",
        "actor_rollout_ref.rollout.name='hff' is not one of [hf, vllm]; did you mean 'hf'?",
        "actor_rollout_ref.rollout.multi_turn.format='hermez' is not one of [hermes]; did you mean 'hermes'?",
    ]


AVX2_CPU = "processor : 0\nflags : fpu sse2 avx avx2 fma\n"
AMX_CPU = "processor : 0\nflags : fpu sse2 avx avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile\n"


def test_bf16_on_a_cpu_without_native_bf16_gets_a_start_up_note(base):
    bf16 = [
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bfloat16",
        "actor_rollout_ref.rollout.dtype=bfloat16",
    ]
    config = load_config(compose_config(base + bf16 + ["trainer.device=cpu"]))
    (note,) = slow_dtype_notes(config, uses_critic(config), cpuinfo=AVX2_CPU)
    assert "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype, actor_rollout_ref.rollout.dtype" in note
    assert "set them to float32" in note and "\n" not in note
    assert slow_dtype_notes(config, uses_critic(config), cpuinfo=AMX_CPU) == []
    assert cpu_has_native_bf16(AMX_CPU) and not cpu_has_native_bf16(AVX2_CPU)
    float32 = load_config(compose_config(base + ["trainer.device=cpu"]))
    assert slow_dtype_notes(float32, uses_critic(float32), cpuinfo=AVX2_CPU) == []
    config.trainer.device = "cuda"  # as a GPU machine's check leaves it
    assert slow_dtype_notes(config, uses_critic(config), cpuinfo=AVX2_CPU) == []
