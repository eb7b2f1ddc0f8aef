import pytest

from hybridflow.rewards.scoring.gsm8k import compute_score, extract_gsm8k_answer


@pytest.mark.parametrize(
    "response, expected",
    [
        ("so 1000+234=1234\n#### 1234", 1.0),
        ("#### 1,234", 1.0),
        ("#### $1234.", 1.0),
        ("#### 1234.0", 1.0),
        ("#### 12 then #### 1234", 1.0),  # the last marker counts
        ("#### 1233", 0.0),
        ("the answer is 1234", 0.0),  # strict mode needs the marker
    ],
)
def test_strict_mode(response, expected):
    assert compute_score(response, "1234")["score"] == expected


def test_flexible_mode_takes_the_last_number():
    assert extract_gsm8k_answer("I think 12, no, 1,234 apples", "flexible") == "1,234"
    assert compute_score("I think 12, no, 1,234 apples", "1234", method="flexible")["score"] == 1.0
    assert compute_score("1234 first, then 5", "1234", method="flexible")["score"] == 0.0


def test_format_score_acc_and_pred():
    result = compute_score("#### -3", "4", format_score=0.1)
    assert result == {"score": 0.1, "acc": 0.0, "pred": "-3"}
    assert compute_score("no answer", "4", format_score=0.1) == {"score": 0.0, "acc": 0.0, "pred": ""}


def test_only_the_tail_of_a_long_response_is_searched():
    assert compute_score("#### 5" + "x" * 1000, "5")["score"] == 0.0
    assert compute_score("x" * 100_000 + "#### 5", "5")["score"] == 1.0


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match=r"method='loose' is not one of \['strict', 'flexible'\]"):
        extract_gsm8k_answer("#### 1", "loose")
