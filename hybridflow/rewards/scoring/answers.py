"""Pulling the final answer out of a response: text after the last ``####``, the last number, parsing numbers.

Only the tail of a response is searched (``TAIL_CHARS``): final answers sit at the end, and regexes over
very long degenerate responses would otherwise dominate scoring time.
"""

from __future__ import annotations

import re
from fractions import Fraction

TAIL_CHARS = 300
_HASHES = "####"
# Plain decimals and simple fractions only: no exponents, so "1e999999999" cannot stall the scorer.
_NUMBER_TEXT = re.compile(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?")
_NUMBER_IN_TEXT = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_MAX_NUMBER_CHARS = 40


def answer_after_hashes(text: str) -> str | None:
    """The rest of the line after the last ``####`` in ``text`` (stripped), or None if there is none."""
    tail = text[-TAIL_CHARS:]
    position = tail.rfind(_HASHES)
    if position < 0:
        return None
    return tail[position + len(_HASHES) :].split("\n", 1)[0].strip()


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (commas kept, e.g. ``"1,234"``), or None."""
    matches = _NUMBER_IN_TEXT.findall(text[-TAIL_CHARS:])
    return matches[-1] if matches else None


def leading_number(text: str) -> str | None:
    """The number that ``text`` starts with (``"42 apples"`` -> ``"42"``), or None."""
    match = _NUMBER_IN_TEXT.match(text.strip().lstrip("$"))
    return match.group(0) if match else None


def parse_number(text: str | None) -> Fraction | None:
    """``"1,234"``, ``"$5"``, ``"3.50"``, ``"-7"``, ``"1/2"`` as an exact Fraction; None if not a plain number."""
    if text is None:
        return None
    cleaned = str(text).strip().replace(",", "").replace("$", "").rstrip(".")
    if len(cleaned) > _MAX_NUMBER_CHARS or not _NUMBER_TEXT.fullmatch(cleaned):
        return None
    try:
        return Fraction(cleaned)
    except ZeroDivisionError:
        return None


def numbers_equal(predicted: str | None, ground_truth: object) -> bool:
    """True when both parse as numbers with the same exact value (``"42.0"`` equals ``"42"``)."""
    left, right = parse_number(predicted), parse_number(str(ground_truth))
    return left is not None and right is not None and left == right
