"""Config mistakes a new user makes, through the real command line: one line each, exit 2, before any worker.

Each case breaks one thing in a small valid run (``base``) and runs ``main_ppo``/``main_sft`` up to the end of
their config check in this process; the verdict is read off stderr as the user sees it.
"""

import pytest

from .failure_harness import assert_refused, check_in_process
from .test_sft import sft_overrides

PPO_CASES = {
    "misspelled key": (["trainer.devise=cpu"], ["trainer.devise", "did you mean trainer.device"]),
    "key in the wrong section": (
        ["actor_rollout_ref.ppo_mini_batch_size=2"],
        ["actor_rollout_ref.ppo_mini_batch_size"],
    ),
    "wrong type": (["trainer.total_epochs=abc"], ["trainer.total_epochs", "abc"]),
    "mini-batch not dividing": (["actor_rollout_ref.actor.ppo_mini_batch_size=3"], ["ppo_mini_batch_size"]),
    "unknown estimator": (["algorithm.adv_estimator=gpro"], ["algorithm.adv_estimator", "gpro", "grpo"]),
    "unknown policy loss": (["actor_rollout_ref.actor.policy_loss.loss_mode=vanila"], ["loss_mode", "vanilla"]),
    "unknown kl estimator": (
        ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=kll"],
        ["kl_loss_type", "kll"],
    ),
    "unknown loss aggregation": (["actor_rollout_ref.actor.loss_agg_mode=token-mean-x"], ["loss_agg_mode"]),
    "unknown reward manager": (["reward_model.reward_manager=naiv"], ["reward_manager", "naive"]),
    "unknown logger": (["trainer.logger=[consol]"], ["trainer.logger", "consol"]),
    "missing model folder": (
        ["actor_rollout_ref.model.path=/no/such/model"],
        ["actor_rollout_ref.model.path", "/no/such/model"],
    ),
    "missing train file": (["data.train_files=/no/such/train.parquet"], ["data.train_files", "/no/such/train.parquet"]),
    "missing val file": (["data.val_files=/no/such/val.parquet"], ["data.val_files", "/no/such/val.parquet"]),
    "missing reward file": (["custom_reward_function.path=/no/such/reward.py"], ["custom_reward_function.path"]),
    "unparsable override": (
        ["data.train_batch_size=[1,"],
        ["data.train_batch_size=[1,", "not a valid key=value override"],
    ),
    "save_freq zero": (["trainer.save_freq=0"], ["trainer.save_freq=0"]),
    "resume path missing": (
        ["trainer.resume_mode=resume_path", "trainer.resume_from_path=/no/such/step"],
        ["trainer.resume_from_path"],
    ),
    "unknown resume mode": (["trainer.resume_mode=latest"], ["trainer.resume_mode", "latest"]),
    "cpus per worker zero": (["trainer.cpus_per_worker=0"], ["trainer.cpus_per_worker=0"]),
    "too few CPUs for the placement": (
        ["ray_kwargs.ray_init.num_cpus=1", "trainer.cpus_per_worker=2"],
        ["ray_kwargs.ray_init.num_cpus=1"],
    ),
    "megatron engine": (["actor_rollout_ref.actor.strategy=megatron"], ["Megatron"]),
    "megatron config name": (
        ["--config-name=ppo_megatron_trainer"],
        ["--config-name=ppo_megatron_trainer", "Megatron"],
    ),
    "critic warm-up without a critic": (["trainer.critic_warmup=2"], ["trainer.critic_warmup=2"]),
    "unknown warm-up style": (
        ["actor_rollout_ref.actor.optim.warmup_style=linear"],
        ["actor_rollout_ref.actor.optim.warmup_style='linear' is not one of [constant, cosine]"],
    ),
    # Decided by the run's length, once the data is read: the worker's schedule used to refuse it after start-up.
    "cosine warm-up as long as the run": (
        [
            "actor_rollout_ref.actor.optim.warmup_style=cosine",
            "actor_rollout_ref.actor.optim.lr_warmup_steps=10",
            "trainer.total_training_steps=2",
        ],
        ["actor_rollout_ref.actor.optim.warmup_style='cosine' over 2 steps", "its 10 warm-up steps"],
    ),
    "sglang engine": (["actor_rollout_ref.rollout.name=sglang"], ["sglang"]),
}


@pytest.mark.parametrize("case", PPO_CASES, ids=list(PPO_CASES))
def test_ppo_config_mistake_is_one_line(case, base, capsys, monkeypatch, tmp_path):
    overrides, fragments = PPO_CASES[case]
    error = assert_refused(check_in_process("main_ppo", base + overrides, capsys, monkeypatch, tmp_path), *fragments)
    assert error.startswith("invalid config: ") and "\n" not in error, error


def test_every_mistake_of_a_command_line_is_reported_at_once(base, capsys, monkeypatch, tmp_path):
    """An unknown key used to stop the check before the rest was looked at: now one run names all three."""
    overrides = ["trainer.devise=cpu", "trainer.save_freq=0", "data.train_files=/no/such/train.parquet"]
    outcome = check_in_process("main_ppo", base + overrides, capsys, monkeypatch, tmp_path)
    error = assert_refused(outcome, "trainer.devise", "trainer.save_freq=0", "data.train_files")
    assert error.startswith("invalid config (3 problems):"), error


def test_a_misspelled_added_key_is_reported_with_the_other_mistakes(base, capsys, monkeypatch, tmp_path):
    overrides = ["+trainer.devise=cpu", "trainer.save_freq=0"]
    outcome = check_in_process("main_ppo", base + overrides, capsys, monkeypatch, tmp_path)
    error = assert_refused(outcome, "trainer.devise is not a config key; did you mean trainer.device?", "save_freq=0")
    assert error.startswith("invalid config (2 problems):"), error


def test_a_valid_config_passes_the_check(base, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HYBRIDFLOW_CONFIG_CHECK", "full")
    monkeypatch.chdir(tmp_path)
    from hybridflow.trainer import main_ppo

    main_ppo.cli(base)
    assert "config check passed (full)" in capsys.readouterr().out


@pytest.fixture()
def sft_base(tiny_model_dir, tiny_parquet, tmp_path):
    return sft_overrides(tiny_model_dir, tiny_parquet, tmp_path / "sft", steps=2)


SFT_CASES = {
    "misspelled key": (["trainer.totl_epochs=1"], ["trainer.totl_epochs", "did you mean trainer.total_epochs"]),
    "wrong type": (["trainer.total_epochs=abc"], ["trainer.total_epochs"]),
    "missing model": (["model.partial_pretrain=/no/such/model"], ["model.partial_pretrain", "/no/such/model"]),
    "missing train file": (["data.train_files=/no/such/sft.parquet"], ["data.train_files"]),
    "unparsable override": (["trainer.total_epochs=[1,"], ["not a valid key=value override"]),
    "megatron engine": (["engine=megatron"], ["Megatron"]),
    "split model": (["model.fsdp_config.tensor_parallel_size=2"], ["model.fsdp_config.tensor_parallel_size=2"]),
}


@pytest.mark.parametrize("case", SFT_CASES, ids=list(SFT_CASES))
def test_sft_config_mistake_is_one_line(case, sft_base, capsys, monkeypatch, tmp_path):
    overrides, fragments = SFT_CASES[case]
    error = assert_refused(
        check_in_process("main_sft", sft_base + overrides, capsys, monkeypatch, tmp_path), *fragments
    )
    assert error.startswith("invalid config: ") and "\n" not in error, error
