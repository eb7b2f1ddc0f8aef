"""A reward model's tokenizer against the policy's, checked before workers start.

A reward model that shares the policy's tokenizer (vocabulary, EOS and chat template) reads the policy's tokens as
they are. One with a tokenizer of its own needs ``reward_model.model.input_tokenizer`` (the policy's tokenizer), so
each sample is re-tokenized with the reward model's chat template (:mod:`hybridflow.data.reward_model_inputs`), and
that needs the reward model's chat template and each prompt's messages (``data.return_raw_chat``).
"""

from __future__ import annotations

import pathlib

from hybridflow.config.input_checks import tokenizer_file_errors
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.data.reward_model_inputs import same_tokenizer

KEY = "reward_model.model.input_tokenizer"


def reward_model_tokenizer_errors(config: PPOTrainerConfig) -> list[str]:
    """Why the reward model could not read the policy's samples (none: it can, or there is no reward model).
    Called once the model folders passed their own checks."""
    reward = config.reward_model
    if not reward.enable:
        return []
    if reward.judge.enable:
        return _judge_tokenizer_errors(config)
    input_tokenizer = reward.model.input_tokenizer
    if input_tokenizer:
        folder = pathlib.Path(input_tokenizer).expanduser()
        if not folder.is_dir():
            return [f"{KEY}={input_tokenizer!r} does not exist; point it at the policy's tokenizer folder or null"]
        if errors := tokenizer_file_errors(KEY, folder):
            return errors
    # transformers is imported only once the config's keys passed: a key error shows in about a second.
    from hybridflow.models.loading import ModelLoadError, load_tokenizer

    trust = reward.model.trust_remote_code
    policy_dir = config.actor_rollout_ref.model.tokenizer_dir
    try:
        policy = load_tokenizer(policy_dir, trust_remote_code=config.actor_rollout_ref.model.trust_remote_code)
        reward_tokenizer = load_tokenizer(reward.model.path, trust_remote_code=trust)
        given = load_tokenizer(input_tokenizer, trust_remote_code=trust) if input_tokenizer else None
    except ModelLoadError as error:
        return [f"reward_model: the tokenizers could not be compared: {error}"]
    return _tokenizer_errors(config, policy_dir, policy, reward_tokenizer, given)


def _tokenizer_errors(config: PPOTrainerConfig, policy_dir: str, policy, reward_tokenizer, given) -> list[str]:
    path = config.reward_model.model.path
    if given is None:
        if same_tokenizer(policy, reward_tokenizer):
            return []
        return [
            f"reward_model.model.path={path!r} has a tokenizer of its own (its vocabulary, EOS or chat template "
            f"differs from the policy's in {policy_dir}); set {KEY}={policy_dir} to re-tokenize each sample with "
            "the reward model's chat template, as verl does"
        ]
    if given.get_vocab() != policy.get_vocab():
        return [
            f"{KEY}={config.reward_model.model.input_tokenizer!r} is not the policy's tokenizer (its vocabulary "
            f"differs from {policy_dir}'s), so the policy's responses would decode wrong; set it to {policy_dir}"
        ]
    if same_tokenizer(given, reward_tokenizer):
        return []
    errors = []
    if not reward_tokenizer.chat_template:
        errors.append(
            f"{KEY} re-tokenizes with the reward model's chat template, but reward_model.model.path={path!r} has "
            "none; add a chat_template to its tokenizer_config.json"
        )
    if not config.data.return_raw_chat:
        errors.append(
            f"{KEY} re-tokenizes from each prompt's messages, but data.return_raw_chat=false drops them; set it to true"
        )
    return errors


def _judge_tokenizer_errors(config: PPOTrainerConfig) -> list[str]:
    """A generative judge reads prompts the driver renders as text, through its own chat template."""
    from hybridflow.models.loading import ModelLoadError, load_tokenizer

    model = config.reward_model.model
    try:
        tokenizer = load_tokenizer(model.path, trust_remote_code=model.trust_remote_code)
    except ModelLoadError as error:
        return [f"reward_model.model.path: the judge's tokenizer could not be loaded: {error}"]
    if tokenizer.chat_template:
        return []
    return [
        f"reward_model.judge.enable=true, but reward_model.model.path={model.path!r} has no chat template to put "
        "the judge's prompt in; add a chat_template to its tokenizer_config.json"
    ]
