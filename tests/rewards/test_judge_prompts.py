"""A generative judge's prompts and the scores parsed from its answers (``rewards/judge_prompts.py``)."""

from types import SimpleNamespace

import pytest

from hybridflow.rewards.judge_prompts import (
    DEFAULT_SCORE_PATTERN,
    DEFAULT_TEMPLATE,
    JudgeScoring,
    JudgeUnparsableError,
    parse_score,
    question_text,
    template_errors,
)

from .conftest import rollout_batch


def judge(**options):
    defaults = {
        "prompt_template": "Q: {question} | A: {response} | truth {ground_truth}",
        "score_pattern": DEFAULT_SCORE_PATTERN,
        "max_score": 10.0,
        "max_unparsable_share": 0.5,
    }
    return SimpleNamespace(**{**defaults, **options})


def test_the_template_must_show_the_response_and_name_only_known_fields():
    assert template_errors(DEFAULT_TEMPLATE) == []
    assert template_errors("Rate {question}") == [
        "reward_model.judge.prompt_template has no {response}: the judge would never see what it scores; add it"
    ]
    (unknown,) = template_errors("{response} {answer}")
    assert "names ['answer']" in unknown
    (broken,) = template_errors("{response")
    assert "cannot be read as a format string" in broken


def test_the_question_is_the_last_user_message_or_the_decoded_prompt():
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "sort 3 1 2"}]
    assert question_text(chat, "<|im_start|>user ...") == "sort 3 1 2"
    assert question_text(None, "the decoded prompt") == "the decoded prompt"


@pytest.mark.parametrize(
    "answer, pattern, score",
    [("7", DEFAULT_SCORE_PATTERN, 0.7), ("Score: 8.5/10", DEFAULT_SCORE_PATTERN, 0.85), ("10", r"(\d+)", 1.0)],
)
def test_the_first_number_over_max_score_is_the_score(answer, pattern, score):
    assert parse_score(answer, pattern, 10.0) == pytest.approx(score)


def test_an_answer_without_a_number_has_no_score():
    assert parse_score("I cannot judge this", DEFAULT_SCORE_PATTERN, 10.0) is None


def test_each_sample_is_shown_with_its_question_and_scored_on_its_last_token(tokenizer):
    batch = rollout_batch(tokenizer, ["1 2 3", "3 2"], ["sorting"] * 2, ["1 2 3", "2 3"])
    scoring = JudgeScoring(tokenizer, judge(max_unparsable_share=0.75))
    responses, prompts = scoring.prompts(batch)
    assert prompts == ["Q: AB | A: 1 2 3 | truth 1 2 3", "Q: AB | A: 3 2 | truth 2 3"]
    result = scoring.result(responses, ["9", "nothing"])
    assert result.extra == {"score": [0.9, 0.0], "judge_parsed": [1.0, 0.0]}
    assert result.metrics == {"reward/judge_unparsable_share": 0.5}
    scores = result.token_level_scores
    # "1 2 3" + EOS: its last token is column 5; the unparsable answer scores 0
    assert scores[0, 5].item() == pytest.approx(0.9) and scores.sum().item() == pytest.approx(0.9)


def test_too_many_answers_without_a_score_stop_the_run_in_one_line(tokenizer):
    batch = rollout_batch(tokenizer, ["1 2 3", "3 2"], ["sorting"] * 2, ["1 2 3", "2 3"])
    scoring = JudgeScoring(tokenizer, judge(max_unparsable_share=0.5))
    responses, _ = scoring.prompts(batch)
    with pytest.raises(JudgeUnparsableError) as stopped:
        scoring.result(responses, ["no idea", "nothing"])
    line = str(stopped.value)
    assert "\n" not in line and "for 2 of 2 samples, at least reward_model.judge.max_unparsable_share=0.5" in line
    assert "first: 'no idea'" in line
