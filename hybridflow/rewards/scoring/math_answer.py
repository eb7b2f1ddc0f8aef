"""Competition math (MATH, arXiv 2103.03874): the final answer sits in the last ``\\boxed{...}``.

Answers are compared after a light normalisation (no computer algebra): spaces, ``$``, ``\\left``/``\\right``,
thin spaces, ``\\text{}`` wrappers, degree and percent signs are dropped; ``\\dfrac``/``\\tfrac``/``\\frac{a}{b}``
become ``a/b``; a trailing ``.0`` and a leading ``x=`` are removed. Two answers that both read as plain numbers
compare by value (``0.5`` equals ``\\frac{1}{2}``).
"""

from __future__ import annotations

import re
from typing import Any

from hybridflow.rewards.scoring.answers import parse_number
from hybridflow.rewards.scoring.registry import SCORING_FUNCTIONS

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_DROPPED = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "$", " ", "^\\circ", "^{\\circ}", "\\%", "%")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}")
_FRACTION = re.compile(r"\\frac\{([^{}]*)\}\{([^{}]*)\}")
_SHORT_FRACTION = re.compile(r"\\frac(\d)(\d)")
_SHORT_SQRT = re.compile(r"\\sqrt(\d+)")
_TRAILING_ZEROS = re.compile(r"(\d)\.0+(?!\d)")
_VARIABLE_PREFIX = re.compile(r"^[a-zA-Z]=")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (nested braces allowed) or ``\\boxed 5``; None if absent."""
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(command for command in _BOX_COMMANDS if text.startswith(command, start))
    after = text[start + len(command) :]
    if after.startswith(" "):
        words = after.split(None, 1)
        return words[0].rstrip("$.") if words else None
    if not after.startswith("{"):
        return None
    depth = 0
    for offset, char in enumerate(after):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return after[1:offset]
    return None  # unbalanced braces: the response was cut off inside the box


def normalize_math_answer(answer: str) -> str:
    """A canonical string for comparing two final answers (see the module docstring for the rules)."""
    text = answer.strip()
    text = _TEXT_WRAPPER.sub(r"\1", text)
    for token in _DROPPED:
        text = text.replace(token, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _SHORT_FRACTION.sub(r"\\frac{\1}{\2}", text)
    text = _SHORT_SQRT.sub(r"\\sqrt{\1}", text)
    while _FRACTION.search(text):
        text = _FRACTION.sub(_fraction_as_division, text)
    text = _TRAILING_ZEROS.sub(r"\1", text)
    text = _VARIABLE_PREFIX.sub("", text)
    return text.rstrip(".")


def _fraction_as_division(match: re.Match) -> str:
    # Parentheses only where needed, so "\\frac{1}{2}" reads "1/2" like a plain-text answer.
    return "/".join(part if part.isalnum() else f"({part})" for part in match.groups())


def math_answers_equal(predicted: str, ground_truth: str) -> bool:
    left, right = normalize_math_answer(predicted), normalize_math_answer(ground_truth)
    if left == right:
        return True
    left_number, right_number = parse_number(left), parse_number(right)
    return left_number is not None and left_number == right_number


@SCORING_FUNCTIONS.register("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
def compute_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict[str, Any]:
    """1.0 when the last boxed answer equals ``ground_truth`` (itself boxed or plain) after normalisation."""
    predicted = last_boxed(solution_str)
    if predicted is None:
        return {"score": 0.0, "acc": 0.0, "pred": ""}
    truth = str(ground_truth)
    truth = last_boxed(truth) or truth
    correct = math_answers_equal(predicted, truth)
    return {"score": float(correct), "acc": float(correct), "pred": normalize_math_answer(predicted)}
