"""The LoRA keys are checked together before anything starts, each problem on one line naming its key."""

import pytest

from hybridflow.config.load import load_config
from tests.trainer.helpers import compose_config, config_errors

MODEL = "actor_rollout_ref.model"


def test_lora_keys_load_with_verl_names_and_defaults(base, saved_adapter):
    model = load_config(compose_config(base)).actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules) == (0, 16, "all-linear")
    assert model.exclude_modules is None and model.lora_adapter_path is None and model.lora.merge is None
    assert not model.uses_lora
    fresh = [f"{MODEL}.lora_rank=8", f"{MODEL}.exclude_modules=[o_proj]"]
    model = load_config(compose_config(base + fresh)).actor_rollout_ref.model
    assert model.uses_lora and model.exclude_modules == ["o_proj"]
    saved = load_config(compose_config(base + [f"{MODEL}.lora_adapter_path={saved_adapter}"])).actor_rollout_ref.model
    assert saved.uses_lora and saved.lora_rank == 0


def test_keys_that_need_lora_are_refused_without_it(base):
    errors = config_errors(base + [f"{MODEL}.exclude_modules=[o_proj]", f"{MODEL}.lora.merge=true"])
    assert errors == [
        f"{MODEL}.exclude_modules is set but LoRA is off; set {MODEL}.lora_rank > 0 (or {MODEL}.lora_adapter_path) "
        "or remove it",
        f"{MODEL}.lora.merge is set but LoRA is off; set {MODEL}.lora_rank > 0 (or {MODEL}.lora_adapter_path) "
        "or remove it",
    ]
    estimator = ["algorithm.adv_estimator=gae", "critic.model.exclude_modules=[o_proj]"]
    assert config_errors(base + estimator) == [
        "critic.model.exclude_modules is set but critic.model.lora_rank=0; set a rank or remove it"
    ]


def test_a_negative_rank_is_refused(base):
    assert config_errors(base + [f"{MODEL}.lora_rank=-4"]) == [
        f"{MODEL}.lora_rank=-4 is negative; use 0 (no LoRA) or a positive rank"
    ]


def test_both_engines_take_the_adapter_alone_unless_merge_is_asked(base):
    for engine in ("hf", "vllm"):
        lora = [f"{MODEL}.lora_rank=8", f"actor_rollout_ref.rollout.name={engine}"]
        # Keys and values only: this machine may have neither vLLM nor a GPU.
        model = load_config(compose_config(base + lora), check_environment=False).actor_rollout_ref.model
        assert model.lora.merge is None and not model.merges_lora(engine)
        merged = load_config(compose_config(base + lora + [f"{MODEL}.lora.merge=true"]), check_environment=False)
        assert merged.actor_rollout_ref.model.merges_lora(engine)


def test_a_missing_adapter_folder_is_named(base, tmp_path):
    (error,) = config_errors(base + [f"{MODEL}.lora_adapter_path={tmp_path}"])
    assert (
        error == f"{MODEL}.lora_adapter_path={str(tmp_path)!r}: {tmp_path} has no adapter_config.json: give a "
        "folder saved by peft's save_pretrained"
    )


@pytest.mark.parametrize(
    "override, agrees",
    [
        ("lora_rank=4", True),
        ("lora_rank=8", False),
        ("lora_alpha=8", True),
        ("lora_alpha=32", False),
        ("exclude_modules=[o_proj]", False),
        ("lora_alpha=16", True),  # the default defers to the adapter's 8
    ],
)
def test_keys_set_beside_a_saved_adapter_must_agree_with_it(base, saved_adapter, override, agrees):
    overrides = base + [f"{MODEL}.lora_adapter_path={saved_adapter}", f"{MODEL}.{override}"]
    if agrees:
        load_config(compose_config(overrides))
        return
    (error,) = config_errors(overrides)
    key = override.split("=")[0]
    assert error.startswith(f"{MODEL}.{key}=") and "differs from the adapter's" in error
    assert error.endswith(f"leave {key} at its default or set it to the adapter's value")
