"""Helpers shared by the trainer tests: compose the trainer config and a small valid run's overrides."""

import pytest
from hydra import compose, initialize_config_module

from hybridflow.config.load import ConfigError, load_config
from hybridflow.config.plan import RunPlan, build_plan


def compose_config(overrides, config_name="ppo_trainer"):
    """ppo_trainer.yaml (or another trainer config) with Hydra command-line style overrides, as main_ppo would see
    it."""
    with initialize_config_module("hybridflow.config.yaml", version_base=None):
        return compose(config_name, overrides=list(overrides))


def plan_of(overrides, train_prompts: int = 16) -> RunPlan:
    """The run plan of ``overrides`` over a training set of ``train_prompts`` prompts (the tiny parquet has 16)."""
    return build_plan(load_config(compose_config(overrides)), train_prompts)


def config_errors(overrides) -> list[str]:
    """The lines of the ConfigError that ``overrides`` must raise."""
    with pytest.raises(ConfigError) as caught:
        load_config(compose_config(overrides))
    return caught.value.errors


def tiny_run_overrides(model_dir, parquet, run_dir, estimator="grpo"):
    """A small, valid run: 4 prompts x 2 samples, short responses, one worker process on CPU."""
    train, val = parquet
    return [
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.n=2",
        f"critic.model.path={model_dir}",
        "critic.ppo_micro_batch_size_per_gpu=2",
        f"algorithm.adv_estimator={estimator}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[jsonl]",
        "trainer.n_gpus_per_node=1",
    ]


def two_rank_steps(model_dir, parquet, estimator, reward_path):
    """``tiny_run_overrides`` as two steps on 2 Ray workers, scored by ``reward_path``, the data in order, the
    responses stopped on ~40% of the vocabulary (so the untrained model's lengths vary): for comparing layouts."""
    return tiny_run_overrides(model_dir, parquet, "unused", estimator) + [
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.cpus_per_worker=0.5",
        "trainer.n_gpus_per_node=2",
        "data.shuffle=false",
        f"custom_reward_function.path={reward_path}",
        f"actor_rollout_ref.rollout.stop_token_ids=[{','.join(map(str, range(100)))}]",
    ]


# What the tool-calling model learns to answer the first training prompt with (the tiny parquet's row 0).
TOOL_QUESTION = "What is 8-2? End with '#### <answer>'."
TOOL_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "8-2"}}\n</tool_call>'
TOOL_ANSWER = "#### 6"


def tool_calling_model(model_dir, tools_yaml, out_dir):
    """The tiny model overfit (prompt tokens masked) on one conversation rendered as the trainer renders it, the
    tools' schemas in the prompt: question -> calculator call -> tool says 6 -> answer. Sampling then calls the
    tool in most samples of the other arithmetic prompts too, so a run goes through real tool turns."""
    import torch

    from hybridflow.models.loading import load_causal_lm, load_tokenizer
    from hybridflow.rollout.tool_messages import ToolMessageEncoder
    from hybridflow.rollout.tools import load_tools
    from tests.overfit import overfit

    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir)
    schemas = [tool.schema for tool in load_tools(str(tools_yaml)).values()]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": TOOL_QUESTION}], tools=schemas, add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    eos = [tokenizer.eos_token_id]
    completion = (
        tokenizer.encode(TOOL_CALL, add_special_tokens=False)
        + eos
        + ToolMessageEncoder(tokenizer).encode(["6"], ended_with_eos=True)
        + tokenizer.encode(TOOL_ANSWER, add_special_tokens=False)
        + eos
    )
    sequence = torch.tensor([prompt_ids + completion])
    labels = sequence.clone()
    labels[0, : len(prompt_ids)] = -100
    overfit(model, sequence, labels, "the tool-calling model")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
