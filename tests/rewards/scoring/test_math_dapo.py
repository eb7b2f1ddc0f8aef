"""verl's math_dapo rule: the last ``Answer:`` line of the response's last 300 characters, Minerva-normalised,
else the last box of its last 100 characters; 1.0 right, -1.0 wrong; AIME data sources reach it by prefix."""

import pytest

from hybridflow.rewards.scoring import default_compute_score, unknown_data_sources
from hybridflow.rewards.scoring.math_dapo import compute_score, normalize_final_answer


@pytest.mark.parametrize(
    "answer, normalized",
    [
        ("x = 5", "5"),
        ("$\\frac12$", "\\frac{1}{2}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("1,000", "1000"),
        ("\\boxed{42}", "42"),
        ("10 degrees", "10"),
        ("\\text{(B)}", "(B)"),
        ("(1,2)", "(1,2)"),  # only a number loses its commas
        ("5 ^\\circ", "5"),
    ],
)
def test_minerva_normalisation(answer, normalized):
    assert normalize_final_answer(answer) == normalized


def test_the_last_answer_line_is_read_and_compared_normalised():
    response = "Step one.\nAnswer: 3\nOn reflection:\nanswer:  $1,024$ dollars"
    assert compute_score(response, "1024") == {"score": 1.0, "acc": 1.0, "pred": "1024"}
    assert compute_score(response, "3") == {"score": -1.0, "acc": 0.0, "pred": "1024"}


def test_an_answer_before_the_last_300_characters_is_not_read():
    response = "Answer: 7\n" + "x" * 300
    assert compute_score(response, "7") == {"score": -1.0, "acc": 0.0, "pred": "[INVALID]"}


def test_without_an_answer_line_the_last_box_of_the_last_100_characters_counts_unnormalised():
    assert compute_score("so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}")["score"] == 1.0
    assert compute_score("so \\boxed{\\frac12}", "\\frac{1}{2}")["score"] == -1.0  # no normalisation here
    assert compute_score("\\boxed{4}" + " " * 100, "4") == {"score": -1.0, "acc": 0.0, "pred": "[INVALID]"}
    assert compute_score("\\boxed{4", "4")["pred"] == "[INVALID]"  # cut off inside the box


@pytest.mark.parametrize("data_source", ["math_dapo", "math", "aime-2024", "aime25"])
def test_verls_math_dapo_sources_reach_the_rule(data_source):
    assert unknown_data_sources([data_source]) == []
    assert default_compute_score(data_source, "Answer: 12", "12")["score"] == 1.0
    assert default_compute_score(data_source, "Answer: 13", "12")["score"] == -1.0


def test_a_source_that_only_contains_aime_is_not_one_of_them():
    assert unknown_data_sources(["HuggingFaceH4/aime_2024"]) == ["HuggingFaceH4/aime_2024"]
