"""verl's ``math_dapo`` rule (DAPO, arXiv 2503.14476), for DAPO-Math-17k, AIME and verl's ``math`` data_source:
1.0 for a right answer, -1.0 for a wrong or missing one.

Only the response's last 300 characters are read. The answer is the last ``Answer: ...`` line there, normalised as
Minerva normalises final answers (Lewkowycz et al., arXiv 2206.14858, appendix D.1: units and filler words dropped,
``\\text{}`` and ``\\boxed{}`` unwrapped, ``\\fracab`` written out, thousands separators removed) and compared as
text with the ground truth normalised alike. A response with no such line falls back to the last ``\\boxed{...}`` of
its last 100 characters, compared unnormalised with the ground truth.
"""

from __future__ import annotations

import re
from typing import Any

from hybridflow.rewards.scoring.registry import SCORING_FUNCTIONS

_READ_CHARACTERS = 300
_BOX_CHARACTERS = 100
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_INVALID = "[INVALID]"
# Minerva's normalisation: replaced, then removed, in this order.
_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_REMOVED = (
    *("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points"),
    *("feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students"),
    *("childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3"),
    *("\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots"),
)
_REWRITES = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"),  # the first $...$ of the answer
    (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"),
    (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),  # \fracab -> \frac{a}{b}
    (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}"),  # \sqrta -> \sqrt{a}
)


def normalize_final_answer(answer: str) -> str:
    """Minerva's canonical form of a final answer (the module docstring)."""
    answer = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for removed in _REMOVED:
        answer = answer.replace(removed, "")
    for pattern, replacement in _REWRITES:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def last_boxed_content(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` whose braces close; None if there is none. verl's form only:
    ``math_answer.last_boxed`` also reads ``\\fbox`` and ``\\boxed 5``, which this rule does not."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for position in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[position], 0)
        if text[position] == "}" and depth == 0:
            return text[start + len("\\boxed{") : position]
    return None


@SCORING_FUNCTIONS.register("math_dapo", "math_dapo_reasoning", "math")
def compute_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict[str, Any]:
    """1.0 and ``acc`` 1.0 when the answer (the module docstring) is the ground truth, else -1.0 and 0.0."""
    tail = solution_str[-_READ_CHARACTERS:]
    truth = str(ground_truth)
    lines = _ANSWER_LINE.findall(tail)
    if lines:
        predicted = normalize_final_answer(lines[-1])
        correct = predicted == normalize_final_answer(truth)
    else:
        boxed = last_boxed_content(tail[-_BOX_CHARACTERS:])
        predicted = _INVALID if boxed is None else boxed
        correct = boxed is not None and boxed == truth
    return {"score": 1.0 if correct else -1.0, "acc": float(correct), "pred": predicted}
