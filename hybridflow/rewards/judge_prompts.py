"""What a generative judge reads and how its answer becomes a score (``reward_model.judge``).

The prompt shows the judge the question (the prompt's last user message, or the decoded prompt), the response and,
where the template asks for it, the ground truth; the judge's answer is searched for ``score_pattern`` (by default
the first number in it), and that number over ``max_score`` is the sample's score. An answer with no match is
unparsable: the sample scores 0 and counts in ``reward/judge_unparsable_share``.
"""

from __future__ import annotations

import re
import string
from typing import Any

from hybridflow.errors import HybridflowError
from hybridflow.rewards.managers import RewardResult
from hybridflow.rewards.response_batch import ResponseBatch, read_response_batch, scores_on_last_token

DEFAULT_TEMPLATE = (
    "Judge the response to the question below.\n\n"
    "Question:\n{question}\n\n"
    "Response:\n{response}\n\n"
    "Answer with one integer from 0 (wrong or unrelated) to 10 (fully correct), and nothing else."
)
DEFAULT_SCORE_PATTERN = r"-?\d+(?:\.\d+)?"
PLACEHOLDERS = ("question", "response", "ground_truth")
UNPARSABLE_METRIC = "reward/judge_unparsable_share"


def template_errors(template: str) -> list[str]:
    """Placeholders the template lacks or does not know, as ``reward_model.judge.prompt_template`` lines."""
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as error:
        return [f"reward_model.judge.prompt_template cannot be read as a format string ({error}); use {{name}}"]
    key, errors = "reward_model.judge.prompt_template", []
    if "response" not in used:
        errors.append(f"{key} has no {{response}}: the judge would never see what it scores; add it")
    unknown = sorted(used - set(PLACEHOLDERS))
    if unknown:
        errors.append(f"{key} names {unknown}; its placeholders are {list(PLACEHOLDERS)} (double a literal brace)")
    return errors


def question_text(raw_prompt: Any, decoded_prompt: str) -> str:
    """The question as the judge should read it: the last user message of the chat when the batch carries it
    (``data.return_raw_chat``), else the prompt as the policy saw it."""
    if raw_prompt is not None:
        users = [message.get("content", "") for message in raw_prompt if message.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    return decoded_prompt


def render(template: str, question: str, response: str, ground_truth: Any) -> str:
    return template.format(
        question=question, response=response, ground_truth="" if ground_truth is None else ground_truth
    )


def parse_score(answer: str, pattern: str, max_score: float) -> float | None:
    """The first match of ``pattern`` in ``answer`` over ``max_score`` (a group in the pattern: its first group);
    None when nothing matches."""
    found = re.search(pattern, answer)
    if found is None:
        return None
    text = found.group(1) if found.groups() else found.group(0)
    try:
        return float(text) / max_score
    except ValueError:
        return None


class JudgeUnparsableError(HybridflowError, RuntimeError):
    """Too many of a batch's judge answers held no score."""


class JudgeScoring:
    """A batch's judge prompts (``prompts``) and, from the judge's answers, its scores (``result``): each on its
    sample's last response token, 0 for an answer with no score; ``reward/judge_unparsable_share`` counts those,
    and at ``max_unparsable_share`` of a batch the run stops in one line quoting the first."""

    def __init__(self, tokenizer: Any, judge: Any, reward_fn_key: str = "data_source"):
        self.tokenizer = tokenizer
        self.judge = judge
        self.reward_fn_key = reward_fn_key

    def prompts(self, data: Any) -> tuple[ResponseBatch, list[str]]:
        responses = read_response_batch(data, self.tokenizer, self.reward_fn_key, with_prompts=True)
        raw_prompts = data.non_tensor_batch.get("raw_prompt", [None] * len(responses.solution_strs))
        prompts = [
            render(self.judge.prompt_template, question_text(raw, decoded), response, truth)
            for raw, decoded, response, truth in zip(
                raw_prompts, responses.prompt_strs, responses.solution_strs, responses.ground_truths
            )
        ]
        return responses, prompts

    def result(self, responses: ResponseBatch, answers: list[str]) -> RewardResult:
        judge = self.judge
        scores = [parse_score(answer, judge.score_pattern, judge.max_score) for answer in answers]
        unparsable = [index for index, score in enumerate(scores) if score is None]
        share = len(unparsable) / max(len(answers), 1)
        if unparsable and share >= judge.max_unparsable_share:
            raise JudgeUnparsableError(
                f"the judge's answer held no score (reward_model.judge.score_pattern={judge.score_pattern!r}) for "
                f"{len(unparsable)} of {len(answers)} samples, at least reward_model.judge.max_unparsable_share="
                f"{judge.max_unparsable_share:g}; first: {answers[unparsable[0]][:200]!r}; fix the template or the "
                "pattern, or use a judge that answers in that form"
            )
        values = [0.0 if score is None else score for score in scores]
        token_level_scores = scores_on_last_token(values, responses.valid_response_lengths, responses.response_width)
        extra = {"score": values, "judge_parsed": [float(score is not None) for score in scores]}
        return RewardResult(token_level_scores, extra, {UNPARSABLE_METRIC: share})
