"""``actor_rollout_ref.rollout.enable_sleep_mode`` (verl's RolloutConfig key): vLLM built without sleep mode keeps
its memory, which the hybrid engine's ``free_cache_engine`` would have it give to training."""

from hybridflow.config.command_line import without_redundant_plus
from hybridflow.config.environment import vllm_sleep_mode_errors
from hybridflow.config.load import load_config, load_config_with_notes
from tests.trainer.helpers import compose_config

VLLM = ["actor_rollout_ref.rollout.name=vllm"]
# verl's scripts add it with "+" (not in verl's YAML); the command line drops the "+" for a key the config has
NO_SLEEP = without_redundant_plus(["+actor_rollout_ref.rollout.enable_sleep_mode=false"])


def _config(base, overrides):
    return load_config(compose_config(base + VLLM + overrides), check_environment=False)


def test_without_sleep_mode_the_hybrid_engine_cannot_free_its_cache_for_training(base):
    assert vllm_sleep_mode_errors(_config(base, NO_SLEEP)) == [
        "actor_rollout_ref.rollout.enable_sleep_mode=false leaves vLLM no way to free its memory between rollouts, "
        "which actor_rollout_ref.rollout.free_cache_engine=true asks of the hybrid engine; set free_cache_engine="
        "false too (vLLM then keeps its memory while the actor trains) or leave sleep mode on"
    ]


def test_sleep_mode_off_is_accepted_where_nothing_sleeps(base):
    assert vllm_sleep_mode_errors(_config(base, [])) == []
    assert vllm_sleep_mode_errors(_config(base, NO_SLEEP + ["actor_rollout_ref.rollout.free_cache_engine=false"])) == []
    # A rollout pool of its own (verl's standalone servers skip sleeping too)
    assert vllm_sleep_mode_errors(_config(base, NO_SLEEP + ["actor_rollout_ref.hybrid_engine=false"])) == []


def test_the_key_is_verls_and_read(base):
    overrides = base + VLLM + NO_SLEEP + ["actor_rollout_ref.rollout.free_cache_engine=false"]
    config, unread = load_config_with_notes(compose_config(overrides), check_environment=False)
    assert config.actor_rollout_ref.rollout.enable_sleep_mode is False
    assert not [line for line in unread if "enable_sleep_mode" in line]
