"""Seeded generators of small verifiable tasks the project makes itself: arithmetic, countdown, sorting.

Every task uses one answer convention, stated in its prompt: the response ends with ``#### <answer>``
(the same as GSM8K), which ``hybridflow.rewards.scoring`` parses for data_sources ``arithmetic``,
``countdown`` and ``sorting``. Prompts are kept short (about 30-60 characters) because the CPU demo trains
a character-level model on them. Each problem carries a reference ``answer`` that scores 1.0, written to
``extra_info["answer"]`` for an SFT warm-up. Problems within one call are distinct (by prompt text), so a
train/test split taken from one call never overlaps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

ARITHMETIC_OPERATORS = "+-*"
LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Problem:
    """One task instance: the user message, what the scorer compares against, and a correct response."""

    question: str
    ground_truth: Any
    answer: str


def arithmetic_problems(
    num: int, seed: int = 0, num_operands: int = 2, max_value: int = 50, operators: str = "+-*"
) -> list[Problem]:
    """``num`` distinct expressions like ``"7+3*12"`` over integers 0..max_value (``*`` binds first)."""
    if num_operands < 2 or max_value < 1 or not operators or set(operators) - set(ARITHMETIC_OPERATORS):
        raise ValueError(
            f"arithmetic needs num_operands >= 2 (got {num_operands}), max_value >= 1 (got {max_value}) and "
            f"operators drawn from {ARITHMETIC_OPERATORS!r} (got {operators!r})"
        )

    def make_one(rng: random.Random) -> Problem:
        operands = [rng.randint(0, max_value) for _ in range(num_operands)]
        ops = [rng.choice(operators) for _ in range(num_operands - 1)]
        expression = str(operands[0]) + "".join(op + str(x) for op, x in zip(ops, operands[1:]))
        value = _evaluate_flat(operands, ops)
        return Problem(f"What is {expression}? End with '#### <answer>'.", str(value), f"#### {value}")

    return unique_problems(make_one, num, seed, "num_operands, max_value, operators")


def _evaluate_flat(operands: list[int], ops: list[str]) -> int:
    """Value of ``operands`` joined by ``ops`` with ``*`` before ``+``/``-``."""
    terms, signs = [operands[0]], []
    for op, operand in zip(ops, operands[1:]):
        if op == "*":
            terms[-1] *= operand
        else:
            signs.append(op)
            terms.append(operand)
    total = terms[0]
    for sign, term in zip(signs, terms[1:]):
        total = total + term if sign == "+" else total - term
    return total


def countdown_problems(
    num: int, seed: int = 0, num_numbers: int = 3, max_number: int = 20, max_target: int = 100
) -> list[Problem]:
    """Reach a target from ``num_numbers`` numbers in 1..max_number with ``+ - * /``, each used at most once.

    ``ground_truth`` is ``{"target": int, "numbers": [int, ...]}``; the reference answer uses every number
    (intermediate values stay positive integers; division only when exact).
    """
    if num_numbers < 2 or max_number < 1 or max_target < 1:
        raise ValueError(
            f"countdown needs num_numbers >= 2 (got {num_numbers}), max_number >= 1 (got {max_number}), "
            f"max_target >= 1 (got {max_target})"
        )

    def make_one(rng: random.Random) -> Problem | None:
        numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
        expression, value = _random_expression(rng, numbers)
        if not 1 <= value <= max_target:
            return None
        shown = " ".join(map(str, sorted(numbers)))
        question = f"Use {shown} (each once, +-*/) to make {value}. End with '#### <expr>'."
        return Problem(question, {"target": value, "numbers": sorted(numbers)}, f"#### {expression}")

    return unique_problems(make_one, num, seed, "num_numbers, max_number, max_target")


def _random_expression(rng: random.Random, numbers: list[int]) -> tuple[str, int]:
    """Fold the numbers (in random order) with random operators; returns (expression text, value)."""
    order = rng.sample(numbers, len(numbers))
    expression, value, top_is_sum = str(order[0]), order[0], False
    for number in order[1:]:
        choices = ["+", "*"] + (["-"] if value > number else []) + (["/"] if value % number == 0 else [])
        op = rng.choice(choices)
        if op in "*/" and top_is_sum:
            expression = f"({expression})"
        expression += f"{op}{number}"
        value = {"+": value + number, "-": value - number, "*": value * number, "/": value // number}[op]
        top_is_sum = op in "+-"
    return expression, value


def sorting_problems(
    num: int, seed: int = 0, length: int = 4, items: str = "digits", max_value: int = 9
) -> list[Problem]:
    """Sort ``length`` items ascending: numbers 0..max_value (``items="digits"``) or letters (``"letters"``)."""
    if items not in ("digits", "letters") or length < 2 or max_value < 1:
        raise ValueError(
            f"sorting needs items in ['digits', 'letters'] (got {items!r}), length >= 2 (got {length}) and "
            f"max_value >= 1 (got {max_value})"
        )

    def make_one(rng: random.Random) -> Problem:
        if items == "digits":
            values = [rng.randint(0, max_value) for _ in range(length)]
            ordered = " ".join(map(str, sorted(values)))
        else:
            values = [rng.choice(LETTERS) for _ in range(length)]
            ordered = " ".join(sorted(values))
        question = f"Sort {' '.join(map(str, values))} ascending. End with '#### <list>'."
        return Problem(question, ordered, f"#### {ordered}")

    return unique_problems(make_one, num, seed, "length, max_value, items")


def unique_problems(
    make_one: Callable[[random.Random], Problem | None], num: int, seed: int, knobs: str
) -> list[Problem]:
    """``num`` problems with distinct questions from a seeded ``make_one`` (which may return None to reject)."""
    rng = random.Random(seed)
    problems: dict[str, Problem] = {}
    attempts, max_attempts = 0, 50 * num + 1000
    while len(problems) < num and attempts < max_attempts:
        attempts += 1
        problem = make_one(rng)
        if problem is not None:
            problems.setdefault(problem.question, problem)
    if len(problems) < num:
        raise ValueError(
            f"found only {len(problems)} distinct problems of the {num} asked for after {attempts} tries; "
            f"widen the task ({knobs}) or ask for fewer"
        )
    return list(problems.values())


def to_verl_rows(problems: list[Problem], data_source: str, ability: str, split: str) -> list[dict[str, Any]]:
    """Rows in verl's parquet schema (``data_source``, ``prompt``, ``ability``, ``reward_model``, ``extra_info``)."""
    return [
        {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": problem.question}],
            "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": problem.ground_truth},
            "extra_info": {"split": split, "index": index, "question": problem.question, "answer": problem.answer},
        }
        for index, problem in enumerate(problems)
    ]


def train_test_rows(
    problems: list[Problem], num_test: int, data_source: str, ability: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The first ``num_test`` problems as test rows, the rest as train rows."""
    test, train = problems[:num_test], problems[num_test:]
    return to_verl_rows(train, data_source, ability, "train"), to_verl_rows(test, data_source, ability, "test")
