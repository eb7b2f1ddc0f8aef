"""``reward_model.judge``: a generative judge's options, checked before workers start."""

from __future__ import annotations

import re

from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.rewards.judge_prompts import template_errors
from hybridflow.rollout.config import ENGINE_NAMES

KEY = "reward_model.judge"


def judge_errors(config: PPOTrainerConfig) -> list[str]:
    """Every judge option that cannot serve, one line each naming its key."""
    judge = config.reward_model.judge
    if not judge.enable:
        return []
    if not config.reward_model.enable:
        return [f"{KEY}.enable=true scores with the reward model, but reward_model.enable=false; set it to true"]
    errors = template_errors(judge.prompt_template)
    try:
        re.compile(judge.score_pattern)
    except re.error as error:
        errors.append(f"{KEY}.score_pattern={judge.score_pattern!r} is not a regular expression ({error}); fix it")
    bounds = {
        "max_score": (judge.max_score, judge.max_score > 0, "a positive number"),
        "max_unparsable_share": (judge.max_unparsable_share, 0 < judge.max_unparsable_share <= 1, "in (0, 1]"),
        "response_length": (judge.response_length, judge.response_length >= 1, "at least 1"),
        "temperature": (judge.temperature, judge.temperature >= 0, "0 (greedy) or more"),
    }
    errors += [f"{KEY}.{name}={value} must be {what}" for name, (value, ok, what) in bounds.items() if not ok]
    if judge.engine not in ENGINE_NAMES:
        errors.append(f"{KEY}.engine={judge.engine!r} is not one of {list(ENGINE_NAMES)}")
    return errors
