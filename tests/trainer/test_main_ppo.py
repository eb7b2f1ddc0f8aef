"""End to end through the command line: GRPO and PPO (with a critic) on a tiny model, a tiny parquet file and a
local Ray cluster; then a kill -9 mid-run and a resume whose steps equal an uninterrupted run's; and GRPO with
LoRA, its checkpoint merged by ``python -m hybridflow.model_merger``."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from hybridflow.model_merger.merge import load_trained_policy
from hybridflow.tracking import metric_names as names
from hybridflow.tracking.trackers import read_metrics

from .cli import HANG_GUARD_S, cli_env, kill_9_at_first_checkpoint, run_cli
from .helpers import tiny_run_overrides, tool_calling_model
from .trained_prompts import COUNTED, DUMPS, assert_each_prompt_trained_once_per_epoch, prompts_by_step

pytestmark = pytest.mark.slow

STEPS = 3


def _steps(run_dir):
    return {record["step"]: record for record in read_metrics(run_dir)}


def test_grpo_writes_metrics_and_checkpoints(grpo_run):
    run_dir, _ = grpo_run
    steps = _steps(run_dir)
    assert sorted(steps) == [0, 1, 2, 3]
    assert "val-core/arithmetic/acc/mean@1" in steps[0]  # validation before training
    assert "val-core/arithmetic/acc/mean@1" in steps[2]  # test_freq=2
    assert "val-core/arithmetic/acc/mean@1" in steps[3]  # and at the end
    for step in (1, 2, 3):
        record = steps[step]
        assert record[names.GLOBAL_STEP] == step
        assert 0 <= record["critic/score/min"] <= record["critic/score/mean"] <= record["critic/score/max"] <= 1
        assert record["critic/advantages/max"] > 0 > record["critic/advantages/min"]
        assert record["actor/pg_loss"] != 0 and record["actor/grad_norm"] > 0
        assert record["response_length/max"] <= 8
        for phase in ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "step"):
            assert names.timing(phase) in record
        assert names.timing("values") not in record and "critic/values/mean" not in record
        assert "actor/kl_loss" in record
        assert record[names.PERF_THROUGHPUT] > 0 and record[names.PERF_MFU_ACTOR] > 0
        assert record[names.PERF_CPU_MEMORY_USED] > 0 and names.PERF_MAX_MEMORY_ALLOCATED not in record  # CPU
    # The actor process's high-water mark: the same process every step, so it never falls
    peaks = [steps[step][names.PERF_MAX_RESIDENT_MEMORY] for step in (1, 2, 3)]
    assert 0 < peaks[0] <= peaks[1] <= peaks[2], peaks
    assert (run_dir / "latest").read_text().strip() == "global_step_3"
    for step in (1, 2, 3):
        assert (run_dir / f"global_step_{step}" / "driver_state.pt").is_file()
        assert (run_dir / f"global_step_{step}" / "actor").is_dir()
        assert not (run_dir / f"global_step_{step}" / "critic").exists()


@pytest.fixture(scope="module")
def ppo_run(tiny_model_dir, tiny_parquet, tmp_path_factory):
    """An uninterrupted PPO run with a critic, on 2 ranks, through the multi-turn agent loop with real calls of
    the calculator tool (a model overfit to call it), with the KL penalty in the reward (an adaptive controller)."""
    work = tmp_path_factory.mktemp("ppo")
    tools = work / "tools.yaml"
    tools.write_text("tools:\n  - name: calculator\n")
    model_dir = tool_calling_model(tiny_model_dir, tools, work / "tool_calling_model")
    # A small learning rate keeps the policy calling the tool in every step.
    base = [
        o
        for o in tiny_run_overrides(model_dir, tiny_parquet, work / "run", "gae")
        if not o.startswith(("actor_rollout_ref.actor.optim.lr=", "data.max_response_length="))
    ]
    overrides = base + [
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        # The chat template renders the tool's schema into every prompt (about 560 tokens with it); a call, the
        # tool's turn and the answer take about 95 response tokens.
        "data.max_prompt_length=640",
        "data.max_response_length=96",
        "actor_rollout_ref.actor.optim.lr=1e-5",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.type=adaptive",
        *COUNTED,
    ]
    extra = [
        f"ray_kwargs.timeline_json_file={work / 'timeline.json'}",
        "+ray_kwargs.ray_init.runtime_env.env_vars.HYBRIDFLOW_TEST_MARK=critic-run",
    ]
    run_cli(overrides + extra, cwd=work)
    return work / "run", overrides


def test_ppo_with_critic(ppo_run):
    run_dir, _ = ppo_run
    # verl's ray_kwargs: the task timeline is written at the end, as chrome://tracing events.
    assert json.loads((run_dir.parent / "timeline.json").read_text())
    steps = _steps(run_dir)
    assert sorted(steps) == [1, 2, 3]
    for record in steps.values():
        critic_keys = ("critic/vf_loss", "critic/values/mean", "critic/vf_explained_var", "critic/returns/mean")
        for key in (*critic_keys, names.KL_IN_REWARD):
            assert key in record, key
        for phase in ("ref", "values", "update_critic"):
            assert names.timing(phase) in record
        # Every step has samples that called the tool and answered after its turn (assistant, tool, assistant).
        assert record[names.stat(names.NUM_TURNS, "max")] == 3
    # The adaptive controller moved the KL coefficient after the first step.
    assert steps[2][names.KL_COEF_IN_REWARD] != steps[1][names.KL_COEF_IN_REWARD]
    step_dir = run_dir / "global_step_3"
    assert (step_dir / "actor").is_dir() and (step_dir / "critic").is_dir()
    assert (run_dir / "latest").read_text().strip() == "global_step_3"


def _comparable(record):
    return {key: value for key, value in record.items() if not names.is_timing(key)}


def kill_9_then_resume(reference_dir, overrides, tmp_path, steps=STEPS):
    """Run ``overrides`` (``steps`` steps, ``COUNTED`` among them) in a new folder, kill -9 it at its first
    checkpoint, run the same command again, and check every step after the kill equals the uninterrupted run's,
    its prompts too, and every prompt of an epoch was trained once; returns (resumed, reference) by step."""
    run_dir = tmp_path / "run"
    overrides = [o for o in overrides if not o.startswith("trainer.default_local_dir=")]
    overrides.append(f"trainer.default_local_dir={run_dir}")
    killed_at = kill_9_at_first_checkpoint(overrides, run_dir, cwd=tmp_path)
    assert killed_at < steps, "the run finished before it could be killed"

    run_cli(overrides, cwd=tmp_path)
    resumed, reference = _steps(run_dir), _steps(reference_dir)
    assert sorted(resumed) == sorted(reference)
    for step in range(killed_at + 1, steps + 1):
        assert _comparable(resumed[step]) == _comparable(reference[step]), f"step {step} differs"
    assert prompts_by_step(tmp_path / DUMPS) == prompts_by_step(reference_dir.parent / DUMPS)
    assert_each_prompt_trained_once_per_epoch(tmp_path / DUMPS, overrides, steps)
    return resumed, reference


def test_kill_9_then_resume_matches_an_uninterrupted_run(ppo_run, tmp_path):
    """PPO with a critic on 2 ranks through the multi-turn agent loop with a tool: the actor, critic, reference,
    agent-loop and data states all resume (GRPO's one-rank path is a subset of this one's)."""
    resumed, reference = kill_9_then_resume(*ppo_run, tmp_path)
    # The steps before the kill are kept from the first attempt, not redone.
    assert json.dumps(_comparable(resumed[1]), sort_keys=True) == json.dumps(_comparable(reference[1]), sort_keys=True)


def grpo_kill_9_then_resume(tiny_model_dir, tiny_parquet, tmp_path, extra):
    """A GRPO run of ``STEPS`` steps with ``extra`` overrides, checkpointed every step and counted: uninterrupted
    (in ``tmp_path / "uninterrupted"``), then killed with -9 and resumed (``kill_9_then_resume``); returns
    (resumed, uninterrupted) records by step."""
    reference = tmp_path / "uninterrupted"
    reference.mkdir()
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, reference / "run", "grpo") + [
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        *COUNTED,
        *extra,
    ]
    run_cli(overrides, cwd=reference)
    return kill_9_then_resume(reference / "run", overrides, tmp_path)


def test_grpo_with_lora_trains_the_adapter_syncs_it_merges_and_resumes_exactly_after_kill_9(
    tiny_model_dir, tiny_parquet, tmp_path
):
    """GRPO with a LoRA adapter (local mode): the adapter trains and syncs alone into the engine, the checkpoint
    merges into a Hugging Face folder (the worker's and ``python -m hybridflow.model_merger``'s agree), and a run
    killed with -9 resumes exactly (adapter, optimizer state, engine sync, data position)."""
    model = "actor_rollout_ref.model"
    lora = [
        "trainer.local_mode=true",
        f"{model}.lora_rank=4",
        f"{model}.lora_alpha=8",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        # One mini-batch per step (so step 1 trains from B = 0 throughout), old log-probs still computed.
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.skip_old_log_prob=false",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    ]
    _, steps = grpo_kill_9_then_resume(tiny_model_dir, tiny_parquet, tmp_path, lora)
    # The reference is the adapter-disabled base: equal to the actor while B = 0, apart once B has trained.
    assert steps[1]["actor/kl_loss"] == 0.0 and steps[2]["actor/kl_loss"] > 0 and steps[3]["actor/kl_loss"] > 0
    # Steps 2 and 3 sampled after the previous update was synced (adapter tensors only): the engine's token
    # probabilities equal the actor's up to float32 rounding of two forward paths (KV cache vs packed):
    # |dp| <= p |d log p| with |d log p| a few 1e-6 at most. (With the sync skipped, step 2 measured 1.4e-3.)
    for step in (1, 2, 3):
        assert steps[step]["training/rollout_probs_diff_valid"] == 1.0
        assert steps[step]["training/rollout_probs_diff_max"] < 1e-5, steps[step]

    actor_dir = tmp_path / "uninterrupted" / "run" / f"global_step_{STEPS}" / "actor"
    trained = dict(load_trained_policy(actor_dir).model.named_parameters())
    base = load_file(tiny_model_dir / "model.safetensors")
    base_layers = {name: tensor for name, tensor in trained.items() if ".lora_" not in name}
    for name, tensor in base_layers.items():
        plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        assert torch.equal(tensor, base[plain]), f"{plain} changed"
    lora_b = [tensor for name, tensor in trained.items() if ".lora_B." in name]
    assert len(lora_b) == 14 and all(tensor.abs().max() > 0 for tensor in lora_b)  # B starts at 0

    merged_dir = tmp_path / "merged"
    merge_command = [
        sys.executable,
        "-m",
        "hybridflow.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(actor_dir),
        "--target_dir",
        str(merged_dir),
    ]
    result = subprocess.run(merge_command, env=cli_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stderr
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    exported = AutoModelForCausalLM.from_pretrained(actor_dir / "huggingface").eval()  # the worker's own merge
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(merged(tokens).logits, exported(tokens).logits, rtol=0, atol=1e-5)
