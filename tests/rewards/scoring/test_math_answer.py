import pytest

from hybridflow.rewards.scoring.math_answer import compute_score, last_boxed, normalize_math_answer


def test_last_boxed_handles_nesting_and_the_space_form():
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{x^{2}}{2}} done") == r"\frac{x^{2}}{2}"
    assert last_boxed(r"so \boxed 5.") == "5"
    assert last_boxed(r"\fbox{7}") == "7"
    assert last_boxed(r"cut off \boxed{\frac{1}{2") is None
    assert last_boxed("no box") is None


@pytest.mark.parametrize(
    "raw, normalized",
    [
        (r"\dfrac{1}{2}", "1/2"),
        (r"\frac12", "1/2"),
        (r"\frac{a+b}{2}", "(a+b)/2"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"x = 5", "5"),
        (r"3.0", "3"),
        (r"90^\circ", "90"),
        (r"50\%", "50"),
        (r"\text{ cm}", "cm"),
        (r"$\sqrt2$", r"\sqrt{2}"),
    ],
)
def test_normalisation(raw, normalized):
    assert normalize_math_answer(raw) == normalized


@pytest.mark.parametrize(
    "response, ground_truth, correct",
    [
        (r"The answer is \boxed{\frac{1}{2}}", "1/2", True),
        (r"\boxed{0.5}", r"\frac{1}{2}", True),
        (r"\boxed{\dfrac{3}{4}}", r"\boxed{\frac34}", True),
        (r"\boxed{\left(2,3\right)}", "(2, 3)", True),
        (r"\boxed{12.0}", "12", True),
        (r"\boxed{13}", "12", False),
        ("12", "12", False),  # no box, no answer
    ],
)
def test_compute_score(response, ground_truth, correct):
    result = compute_score(response, ground_truth)
    assert result["score"] == float(correct) and result["acc"] == float(correct)
