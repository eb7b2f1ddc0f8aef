"""``reward_model.judge``: what a generative judge cannot run with is refused in one line before workers start."""

from tests.trainer.helpers import config_errors


def test_a_judge_without_the_reward_model_is_refused(base):
    assert config_errors(base + ["reward_model.judge.enable=true"]) == [
        "reward_model.judge.enable=true scores with the reward model, but reward_model.enable=false; set it to true"
    ]


def test_bad_judge_options_are_each_one_line(base, tiny_model_dir):
    judge = ["reward_model.enable=true", f"reward_model.model.path={tiny_model_dir}", "reward_model.judge.enable=true"]
    bad = [
        "reward_model.judge.prompt_template='Rate {question}'",
        "reward_model.judge.score_pattern='(unclosed'",
        "reward_model.judge.max_score=0",
        "reward_model.judge.max_unparsable_share=1.5",
        "reward_model.judge.engine=sglang",
    ]
    errors = config_errors(base + judge + bad)
    assert errors == [
        "reward_model.judge.prompt_template has no {response}: the judge would never see what it scores; add it",
        "reward_model.judge.score_pattern='(unclosed' is not a regular expression "
        "(missing ), unterminated subpattern at position 0); fix it",
        "reward_model.judge.max_score=0.0 must be a positive number",
        "reward_model.judge.max_unparsable_share=1.5 must be in (0, 1]",
        "reward_model.judge.engine='sglang' is not one of ['hf', 'vllm']",
    ]
