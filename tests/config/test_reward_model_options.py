"""A reward model's tokenizer against the policy's, checked before workers start: each problem one line naming the
key and the fix."""

import shutil

import pytest

from hybridflow.config.load import load_config
from tests.trainer.failure_harness import assert_refused, check_in_process
from tests.trainer.helpers import compose_config, config_errors

KEY = "reward_model.model.input_tokenizer"


def reward_model(path, input_tokenizer=None) -> list[str]:
    overrides = ["reward_model.enable=true", f"reward_model.model.path={path}"]
    return overrides + ([f"{KEY}={input_tokenizer}"] if input_tokenizer else [])


def test_a_reward_model_with_its_own_tokenizer_and_the_policys_named_passes(
    base, tiny_model_dir, tiny_reward_model_dir
):
    config = load_config(compose_config(base + reward_model(tiny_reward_model_dir, tiny_model_dir)))
    assert config.reward_model.model.input_tokenizer == str(tiny_model_dir)


def test_a_reward_model_sharing_the_policys_tokenizer_needs_no_input_tokenizer(base, tiny_model_dir):
    load_config(compose_config(base + reward_model(tiny_model_dir)))


def test_the_input_tokenizer_is_the_actors_folder_unless_set_as_in_verl(base, tiny_model_dir, tiny_reward_model_dir):
    """verl's default (``${actor_rollout_ref.model.path}``): a reward model with a tokenizer of its own re-tokenizes."""
    config = load_config(compose_config(base + reward_model(tiny_reward_model_dir)))
    assert config.reward_model.model.input_tokenizer == config.actor_rollout_ref.model.path


def test_a_reward_model_with_its_own_tokenizer_and_none_named_is_refused(
    base, tiny_model_dir, tiny_reward_model_dir, capsys, monkeypatch, tmp_path
):
    overrides = base + reward_model(tiny_reward_model_dir) + [f"{KEY}=null"]
    outcome = check_in_process("main_ppo", overrides, capsys, monkeypatch, tmp_path)
    error = assert_refused(
        outcome,
        f"reward_model.model.path='{tiny_reward_model_dir}' has a tokenizer of its own",
        f"set {KEY}={tiny_model_dir} to re-tokenize each sample with the reward model's chat template",
    )
    assert "\n" not in error


@pytest.mark.parametrize(
    ("given", "fragment"),
    [
        ("/no/such/tokenizer", f"{KEY}='/no/such/tokenizer' does not exist"),
        ("reward_model", "is not the policy's tokenizer (its vocabulary differs from"),
    ],
)
def test_an_input_tokenizer_that_is_not_the_policys_is_named(base, tiny_reward_model_dir, given, fragment):
    given = tiny_reward_model_dir if given == "reward_model" else given
    (error,) = config_errors(base + reward_model(tiny_reward_model_dir, given))
    assert fragment in error


def test_re_tokenizing_needs_the_reward_models_chat_template(base, tiny_model_dir, tiny_reward_model_dir, tmp_path):
    folder = shutil.copytree(tiny_reward_model_dir, tmp_path / "no_template")
    (folder / "chat_template.jinja").unlink()
    (error,) = config_errors(base + reward_model(folder, tiny_model_dir))
    assert error == (
        f"{KEY} re-tokenizes with the reward model's chat template, but reward_model.model.path='{folder}' has none; "
        "add a chat_template to its tokenizer_config.json"
    )


def test_re_tokenizing_needs_the_prompts_messages(base, tiny_model_dir, tiny_reward_model_dir):
    overrides = base + reward_model(tiny_reward_model_dir, tiny_model_dir) + ["data.return_raw_chat=false"]
    assert config_errors(overrides) == [
        f"{KEY} re-tokenizes from each prompt's messages, but data.return_raw_chat=false drops them; set it to true"
    ]
