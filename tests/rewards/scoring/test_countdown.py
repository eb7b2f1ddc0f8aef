import pytest

from hybridflow.rewards.scoring.countdown import compute_score, uses_allowed_numbers

TRUTH = {"target": 22, "numbers": [3, 5, 7]}


@pytest.mark.parametrize(
    "response, score",
    [
        ("#### 3*5+7", 1.0),
        ("#### (7*3)+1+0", 0.1),  # 1 and 0 are not given numbers
        ("#### 7*3+1", 0.1),
        ("#### 5*5-3", 0.1),  # 5 used twice
        ("#### 3*5+7=22", 1.0),
        ("#### 3+5", 0.1),  # well formed but wrong
        ("#### 3*5+", 0.0),
        ("#### __import__('os')", 0.0),
        ("3*5+7", 0.0),  # no marker
    ],
)
def test_scores(response, score):
    assert compute_score(response, TRUTH)["score"] == score


def test_numbers_may_be_used_at_most_once():
    assert uses_allowed_numbers([3, 7], [3, 5, 7])
    assert not uses_allowed_numbers([3, 3], [3, 5, 7])
    assert uses_allowed_numbers([3, 3], [3, 3])


def test_acc_and_pred():
    assert compute_score("#### 3*5+7", TRUTH) == {"score": 1.0, "acc": 1.0, "pred": "3*5+7"}
