"""Ulysses sequence parallelism's keys: read under verl's names (the role's key and verl's engine copy of it),
and every size that cannot run refused before anything starts, one line each naming the key and the fix."""

from hybridflow.config.load import load_config
from hybridflow.config.plan import describe
from tests.trainer.helpers import compose_config, config_errors, plan_of

ACTOR = "actor_rollout_ref.actor"
KEY = "ulysses_sequence_parallel_size"
CPUS = "trainer.cpus_per_worker=0.25"  # up to 8 ranks on this machine's 2 CPUs


def test_the_roles_sizes_are_read_and_the_reference_follows_the_actor(base):
    config = load_config(compose_config(base + ["trainer.n_gpus_per_node=2", f"{ACTOR}.{KEY}=2"]))
    arr = config.actor_rollout_ref
    assert arr.actor.ulysses_sequence_parallel_size == arr.ref.ulysses_sequence_parallel_size == 2
    assert config.critic.ulysses_sequence_parallel_size == 1


def test_verls_engine_copies_of_the_key_are_aliases(base):
    overrides = [
        "trainer.n_gpus_per_node=2",
        "algorithm.adv_estimator=gae",
        f"{ACTOR}.fsdp_config.{KEY}=2",
        f"critic.fsdp.{KEY}=2",
    ]
    config = load_config(compose_config(base + overrides))
    assert config.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 2
    assert config.critic.ulysses_sequence_parallel_size == 2
    # verl's default on the copy is no conflict.
    load_config(
        compose_config(base + ["trainer.n_gpus_per_node=2", f"{ACTOR}.{KEY}=2", f"{ACTOR}.fsdp_config.{KEY}=1"])
    )
    conflict = config_errors(
        base + ["trainer.n_gpus_per_node=4", CPUS, f"{ACTOR}.{KEY}=2", f"{ACTOR}.fsdp_config.{KEY}=4"]
    )
    assert conflict == [f"{ACTOR}.fsdp_config.{KEY}=4 and {ACTOR}.{KEY}=2 set the same thing; keep one"]


def test_a_size_that_does_not_divide_the_ranks_or_the_heads_is_refused(base):
    # The tiny model has 4 attention heads (and 2 key-value heads, which are repeated for groups of 4).
    assert config_errors(base + ["trainer.n_gpus_per_node=2", f"{ACTOR}.{KEY}=3", CPUS]) == [
        f"{ACTOR}.{KEY}=3 does not divide the 2 worker processes (trainer.nnodes x trainer.n_gpus_per_node); "
        "choose a divisor of 2"
    ]
    errors = config_errors(base + ["trainer.n_gpus_per_node=8", f"{ACTOR}.{KEY}=8", CPUS])
    assert errors == [
        f"{ACTOR}.{KEY}=8 does not divide the model's 4 attention heads ({base_model(base)}); choose one of [1, 2, 4]"
    ]
    assert config_errors(base + [f"{ACTOR}.{KEY}=0"]) == [
        f"{ACTOR}.{KEY}=0 must be a positive integer (1: no sequence parallelism)"
    ]


def test_batch_sizes_count_the_groups_not_the_ranks(base):
    # 4 prompts x 2 samples a mini-batch of 2 prompts: 4 samples over 2 groups of 2 ranks.
    overrides = ["trainer.n_gpus_per_node=4", f"{ACTOR}.{KEY}=2", CPUS, f"{ACTOR}.ppo_micro_batch_size_per_gpu=2"]
    assert load_config(compose_config(base + overrides)).actor_rollout_ref.actor.ulysses_sequence_parallel_size == 2
    lines = describe(plan_of(base + overrides + [f"{ACTOR}.use_kl_loss=true"]))
    assert "actor mini-batches per epoch: 2 (4 samples, 2 per rank on each of 2 Ulysses groups), ppo_epochs=1" in lines
    for role in ("actor", "reference"):
        assert (
            f"{role}: Ulysses groups of 2 ranks; each rank holds its group's rows and runs 1/2 of every row's columns"
            in lines
        )
    # The global form divides over the 2 groups: 2 samples per rank.
    global_form = [f"{ACTOR}.ppo_micro_batch_size=4", f"{ACTOR}.ppo_micro_batch_size_per_gpu=null"]
    load_config(compose_config(base + overrides[:3] + global_form))
    assert config_errors(base + overrides[:3] + [f"{ACTOR}.ppo_micro_batch_size_per_gpu=3"]) == [
        f"{ACTOR}.ppo_micro_batch_size_per_gpu=3 does not divide the 2 samples per rank of a mini-batch; choose a "
        f"divisor of 2 or set {ACTOR}.use_dynamic_bsz=true"
    ]


def test_a_lora_actors_reference_must_split_like_the_actor(base):
    overrides = [
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.model.lora_rank=4",
        f"{ACTOR}.use_kl_loss=true",
        f"{ACTOR}.{KEY}=2",
        f"actor_rollout_ref.ref.{KEY}=1",
    ]
    assert config_errors(base + overrides) == [
        f"actor_rollout_ref.ref.{KEY}=1 differs from {ACTOR}.{KEY}=2, but a LoRA actor's reference is the actor's "
        f"own model with the adapter off; remove the actor_rollout_ref.ref.{KEY} override"
    ]


def base_model(base: list[str]) -> str:
    return next(item.split("=", 1)[1] for item in base if item.startswith("actor_rollout_ref.model.path="))
