"""The reward manager's options come from the config: reward_model.reward_kwargs, data.max_response_length and
reward_model.overlong_buffer (verl's DAPO layout); wrong ones are refused before anything starts."""

from hybridflow.config.load import load_config
from hybridflow.config.reward_options import reward_manager_options
from hybridflow.rewards import DAPORewardManager, NaiveRewardManager
from hybridflow.trainer.main_ppo import build_trainer
from tests.trainer.helpers import compose_config, config_errors

DAPO = ["reward_model.reward_manager=dapo", "reward_model.overlong_buffer.enable=true"]


def test_dapo_gets_the_response_length_and_the_overlong_buffer(base):
    config = load_config(compose_config(base + DAPO + ["reward_model.overlong_buffer.len=4"]))
    assert reward_manager_options(config) == {
        "max_resp_len": 8,
        "reward_fn_key": "data_source",
        "overlong_buffer_len": 4,
        "overlong_penalty_factor": 1.0,
    }
    trainer = build_trainer(config)
    try:
        manager = trainer.reward_manager
        assert isinstance(manager, DAPORewardManager)
        assert (manager.max_resp_len, manager.overlong_buffer_len, manager.overlong_penalty_factor) == (8, 4, 1.0)
    finally:
        trainer.shutdown()


def test_dapo_without_the_overlong_buffer_scores_as_naive(base):
    config = load_config(compose_config(base + ["reward_model.reward_manager=dapo"]))  # no config error
    assert reward_manager_options(config) == {"max_resp_len": 8, "reward_fn_key": "data_source"}


def test_reward_kwargs_reach_the_manager(base):
    overrides = ["+reward_model.reward_kwargs.timeout_s=5", "+reward_model.reward_kwargs.num_examine=1"]
    trainer = build_trainer(load_config(compose_config(base + overrides)))
    try:
        manager = trainer.reward_manager
        assert type(manager) is NaiveRewardManager
        assert (manager.runner.timeout_s, manager.num_examine) == (5, 1)
    finally:
        trainer.shutdown()
    longer = ["reward_model.overlong_buffer.len=2", "+reward_model.reward_kwargs.max_resp_len=6"]
    assert reward_manager_options(load_config(compose_config(base + DAPO + longer)))["max_resp_len"] == 6


def test_wrong_options_are_named(base):
    typo = ["reward_model.overlong_buffer.len=4", "+reward_model.reward_kwargs.overlong_bufer_len=1"]
    (error,) = config_errors(base + DAPO + typo)
    assert error == (
        "reward_model.reward_kwargs.overlong_bufer_len is not an option of reward manager 'dapo'; "
        "did you mean overlong_buffer_len?"
    )
    no_length = ["reward_model.overlong_buffer.len=4", "+reward_model.reward_kwargs.max_resp_len=null"]
    (error,) = config_errors(base + DAPO + no_length)
    assert error.startswith("reward_model.overlong_buffer.len: overlong_buffer_len=4 needs max_resp_len")
    (error,) = config_errors(base + ["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4"])
    assert "reward manager 'naive' has no overlong penalty; set reward_model.reward_manager=dapo" in error
    (error,) = config_errors(base + DAPO + ["reward_model.overlong_buffer.len=9"])
    assert error.startswith("reward_model.overlong_buffer.len: overlong_buffer_len=9 must be in (0, max_resp_len=8]")
    (error,) = config_errors(base + ["+reward_model.reward_kwargs.reward_fn_key=source"])
    assert error == "reward_model.reward_kwargs.reward_fn_key repeats data.reward_fn_key; set only data.reward_fn_key"
