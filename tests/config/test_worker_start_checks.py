"""What a worker would refuse as it starts or at its first step is refused by the config check, before anything
starts; what only a worker can find (its model, its data) reaches the user as one line, not a traceback."""

import pytest

from hybridflow.algos.policy_losses import PolicyLossConfigError
from hybridflow.data.micro_batches import TokenBudgetError
from hybridflow.distributed.worker_host import WorkerHost
from hybridflow.workers.checkpoint import CheckpointContentError
from hybridflow.workers.config import OptimConfig, WorkerConfigError
from hybridflow.workers.training import lr_multiplier
from tests.trainer.helpers import config_errors

ACTOR = "actor_rollout_ref.actor"


def test_dtype_names_are_checked_before_any_model_loads(base):
    assert config_errors(
        base + ["actor_rollout_ref.model.dtype=float64", f"{ACTOR}.fsdp_config.mixed_precision.param_dtype=bf17"]
    ) == [
        "actor_rollout_ref.model.dtype='float64' is not a dtype hybridflow loads; choose one of ['float32', 'fp32', "
        "'bfloat16', 'bf16', 'float16', 'fp16']",
        f"{ACTOR}.fsdp_config.mixed_precision.param_dtype='bf17' is not a dtype hybridflow loads; choose one of "
        "['float32', 'fp32', 'bfloat16', 'bf16', 'float16', 'fp16']",
    ]


def test_checkpoint_parts_are_checked_before_the_first_save(base):
    assert config_errors(base + [f"{ACTOR}.checkpoint.save_contents=[model,weights]"]) == [
        f"{ACTOR}.checkpoint.save_contents has ['weights']; choose parts from ['model', 'optimizer', 'extra', "
        "'hf_model']"
    ]


def test_a_token_budget_below_the_longest_row_is_refused(base):
    # The base run: prompts up to 64 tokens, responses up to 8. The log-prob passes follow the actor's budget.
    assert config_errors(base + [f"{ACTOR}.use_dynamic_bsz=true", f"{ACTOR}.ppo_max_token_len_per_gpu=40"]) == [
        f"{ACTOR}.ppo_max_token_len_per_gpu=40 and actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=40 and "
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=40 (x 1 Ulysses ranks) is below the longest row, "
        "data.max_prompt_length + data.max_response_length = 72 tokens; raise it to at least 72"
    ]
    overrides = [f"{ACTOR}.use_dynamic_bsz=true", "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=60"]
    assert config_errors(base + overrides) == [
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=60 (x 1 Ulysses ranks) is below the longest row, "
        "data.max_prompt_length + data.max_response_length = 72 tokens; raise it to at least 72"
    ]


def test_a_negative_entropy_chunk_is_refused(base):
    # With chunking on, range(0, rows, -4) is empty: the statistics would be uninitialised memory.
    overrides = [f"{ACTOR}.entropy_from_logits_with_chunking=true", f"{ACTOR}.entropy_from_logits_chunk_size=-4"]
    assert config_errors(base + overrides) == [
        f"{ACTOR}.entropy_from_logits_chunk_size=-4 is out of range; it must satisfy 1 <= "
        "entropy_from_logits_chunk_size"
    ]


def test_the_reward_models_fsdp_size_must_divide_the_processes(base, tiny_model_dir):
    reward = ["reward_model.enable=true", f"reward_model.model.path={tiny_model_dir}"]
    errors = config_errors(base + reward + ["trainer.n_gpus_per_node=4", "reward_model.model.fsdp_config.fsdp_size=3"])
    assert (
        "reward_model.model.fsdp_config.fsdp_size=3 does not divide the 4 processes; choose a divisor of 4 or -1 "
        "(all)" in errors
    )


def test_a_validation_only_run_builds_a_cosine_schedule_it_never_reads():
    optim = OptimConfig(warmup_style="cosine", lr_warmup_steps=10, total_training_steps=0)
    assert lr_multiplier(optim)(0) == pytest.approx(0.1)
    with pytest.raises(WorkerConfigError, match="needs optim.total_training_steps > warmup steps"):
        lr_multiplier(OptimConfig(warmup_style="cosine", lr_warmup_steps=10, total_training_steps=5))


@pytest.mark.parametrize(
    "error",
    [
        WorkerConfigError("ppo_mini_batch_size=3 must divide"),
        CheckpointContentError("checkpoint.load_contents asks for optimizer"),
        TokenBudgetError("a row of 90 tokens"),
        PolicyLossConfigError("clip_ratio_c=0.5 must be > 1"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_workers_own_checks_reach_the_user_as_one_line(error):
    """The worker host marks them as the user's to fix, so the driver prints their message alone."""
    host = WorkerHost("actor_rollout_ref", 0)
    try:
        raise error
    except type(error) as raised:
        wrapped = host._error("actor.init_model", raised)
    assert wrapped.user_facing
    assert wrapped.summary() == f"worker group 'actor_rollout_ref' rank 0 (actor.init_model): {error}"


def test_the_reward_models_micro_batch_must_be_positive(base, tiny_model_dir):
    reward = ["reward_model.enable=true", f"reward_model.model.path={tiny_model_dir}"]
    assert config_errors(base + reward + ["reward_model.micro_batch_size_per_gpu=0"]) == [
        "reward_model.micro_batch_size_per_gpu=0 must be a positive integer (or null)"
    ]
