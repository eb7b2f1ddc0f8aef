"""Tensor-parallel generation's key, ``actor_rollout_ref.rollout.tensor_model_parallel_size``: read on the ``hf``
engine, and every layout that cannot run refused before anything starts, one line each naming the key and the
fix."""

from hybridflow.config.load import load_config, load_config_with_notes
from hybridflow.config.plan import describe
from tests.trainer.helpers import compose_config, config_errors, plan_of

KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
CPUS = "trainer.cpus_per_worker=0.25"  # up to 8 ranks on this machine's 2 CPUs
# 4 ranks: the tiny run's mini-batch is 4 samples, one per rank.
FOUR = ["trainer.n_gpus_per_node=4", CPUS, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"]


def test_the_size_is_read_and_the_plan_says_how_the_rollout_is_split(base):
    overrides = FOUR + [f"{KEY}=2"]
    assert load_config(compose_config(base + overrides)).actor_rollout_ref.rollout.tensor_model_parallel_size == 2
    lines = describe(plan_of(base + overrides))
    assert (
        "rollout: tensor-parallel groups of 2 ranks; each holds 1/2 of every attention and MLP weight and decodes "
        "its group's prompts with the others"
    ) in lines
    sync = "the actor's shards into its split rollout engine, each rank receiving only what its shard lacks"
    assert any(line.endswith(sync) for line in lines)


def test_a_size_that_does_not_divide_the_ranks_or_the_heads_is_refused(base):
    # The tiny model has 4 attention heads and 2 key-value heads: a rank holds whole heads of both.
    assert config_errors(base + ["trainer.n_gpus_per_node=2", f"{KEY}=3", CPUS]) == [
        f"{KEY}=3 does not divide the 2 processes that generate (trainer.nnodes x trainer.n_gpus_per_node); "
        "choose a divisor of 2",
        f"{KEY}=3 does not divide the model's 4 num_attention_heads; choose one of [1, 2, 4]",
        f"{KEY}=3 does not divide the model's 2 num_key_value_heads; choose one of [1, 2]",
    ]
    assert config_errors(base + FOUR + [f"{KEY}=4"]) == [
        f"{KEY}=4 does not divide the model's 2 num_key_value_heads; choose one of [1, 2]"
    ]
    assert config_errors(base + [f"{KEY}=0"]) == [f"{KEY}=0 must be >= 1"]
    two_nodes = ["trainer.nnodes=2", "trainer.n_gpus_per_node=2", CPUS, "ray_kwargs.ray_init.address=auto"]
    assert f"{KEY}=4 does not divide trainer.n_gpus_per_node=2: a group's ranks must share a node" in " ".join(
        config_errors(base + two_nodes + [f"{KEY}=4"])
    )
    assert config_errors(base + ["trainer.local_mode=true", f"{KEY}=2"]) == [
        f"{KEY}=2 does not divide the 1 processes that generate (trainer.nnodes x trainer.n_gpus_per_node); "
        "choose a divisor of 1"
    ]


def test_what_a_split_rollout_cannot_run_is_refused(base):
    two = ["trainer.n_gpus_per_node=2", CPUS, f"{KEY}=2"]
    lora = ["actor_rollout_ref.model.lora_rank=4"]
    # A split model holds no adapter: its sync sends merged weights unless told otherwise.
    assert load_config(compose_config(base + two + lora)).actor_rollout_ref.model.merges_lora("hf", 2)
    assert config_errors(base + two + lora + ["actor_rollout_ref.model.lora.merge=false"]) == [
        f"actor_rollout_ref.model.lora.merge=false with {KEY}=2: a split generation model cannot also hold a "
        f"separate LoRA adapter; drop the merge override (the sync then sends merged weights) or set {KEY}=1"
    ]
    assert config_errors(base + two + ["actor_rollout_ref.rollout.multi_turn.enable=true"]) == [
        f"actor_rollout_ref.rollout.multi_turn.enable=true with {KEY}=2: a tensor-parallel group decodes whole "
        f"batches together, not the agent loop's requests one by one; set {KEY}=1"
    ]
    # vLLM's SPMD engines, in the actor's workers (this machine's vllm is not the question: no environment check).
    vllm = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.enable_chunked_prefill=false"]
    config, _ = load_config_with_notes(compose_config(base + two + vllm), check_environment=False)
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
    # and on a rollout pool of its own, one step ahead; fully async is refused for any engine (the test above)
    pool = ["actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=2"]
    config, _ = load_config_with_notes(compose_config(base + two + vllm + pool), check_environment=False)
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 2


TRAINING = "fsdp_config.tensor_parallel_size"
ACTOR_SPLIT = f"actor_rollout_ref.actor.{TRAINING}"


def test_the_training_split_is_read_for_every_role_and_the_plan_says_so(base):
    overrides = FOUR + ["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true"]
    overrides += [f"{ACTOR_SPLIT}=2", f"critic.model.{TRAINING}=2", "critic.ppo_micro_batch_size_per_gpu=1"]
    config = load_config(compose_config(base + overrides))
    # The reference follows the actor's split, as verl's torchtitan reference follows its actor.
    assert config.actor_rollout_ref.ref.fsdp_config.tensor_parallel_size == 2
    assert config.critic.model.fsdp_config.tensor_parallel_size == 2
    lines = describe(plan_of(base + overrides))
    for role in ("actor", "reference", "critic"):
        assert (
            f"{role}: tensor-parallel groups of 2 ranks; each rank holds its group's rows and 1/2 of every attention "
            "and MLP weight, FSDP2 shards over 2 ranks"
        ) in lines
    # The mini-batch is cut over the 2 groups, each computing its rows on both of its ranks.
    assert (
        "actor mini-batches per epoch: 2 (4 samples, 2 per rank on each of 2 tensor-parallel groups), ppo_epochs=1"
        in lines
    )


def test_a_training_split_that_cannot_run_is_refused(base):
    two = ["trainer.n_gpus_per_node=2", CPUS]
    assert config_errors(base + two + [f"{ACTOR_SPLIT}=4"]) == [
        f"{ACTOR_SPLIT}=4 does not divide the 2 training processes (trainer.nnodes x trainer.n_gpus_per_node); "
        "choose a divisor of 2",
        f"{ACTOR_SPLIT}=4 does not divide the model's 2 num_key_value_heads; choose one of [1, 2]",
    ]
    assert config_errors(
        base + two + [f"{ACTOR_SPLIT}=2", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"]
    ) == [f"{ACTOR_SPLIT}=2 with ulysses_sequence_parallel_size=2 in the same role: choose one"]
    assert config_errors(base + two + [f"{ACTOR_SPLIT}=2", "actor_rollout_ref.model.lora_rank=4"]) == [
        f"{ACTOR_SPLIT}=2 with a LoRA adapter: the adapter's layers are not split; set {ACTOR_SPLIT}=1"
    ]
    assert config_errors(base + FOUR + [f"{ACTOR_SPLIT}=2", "actor_rollout_ref.actor.fsdp_config.fsdp_size=1"]) == [
        f"actor_rollout_ref.actor.fsdp_config.fsdp_size=1 with {ACTOR_SPLIT}=2: leave fsdp_size at -1"
    ]
    assert config_errors(base + FOUR + ["actor_rollout_ref.actor.fsdp_config.fsdp_size=3"]) == [
        "actor_rollout_ref.actor.fsdp_config.fsdp_size=3 does not divide the 4 training processes; choose a divisor "
        "of 4 or -1 (all)"
    ]
    reward_model = ["reward_model.enable=true", f"reward_model.model.path={base_model_path(base)}"]
    assert config_errors(base + reward_model + [f"reward_model.model.{TRAINING}=2"]) == [
        f"reward_model.model.{TRAINING}=2: the reward model scores each rank's own rows and is not split; set it to 1"
    ]
    assert config_errors(base + [f"{ACTOR_SPLIT}=0"]) == [
        f"{ACTOR_SPLIT}=0 must be a positive integer (1: no tensor parallelism in training)"
    ]
    two_nodes = ["trainer.nnodes=2", "trainer.n_gpus_per_node=2", CPUS, "ray_kwargs.ray_init.address=auto"]
    assert f"{ACTOR_SPLIT}=4 does not divide trainer.n_gpus_per_node=2: a group's ranks must share a node" in " ".join(
        config_errors(base + two_nodes + [f"{ACTOR_SPLIT}=4"])
    )


def base_model_path(base: list[str]) -> str:
    return next(arg.split("=", 1)[1] for arg in base if arg.startswith("actor_rollout_ref.model.path="))
