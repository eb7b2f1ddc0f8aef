from hybridflow.rewards.scoring.sorting import compute_score


def test_sorted_items_after_the_marker():
    assert compute_score("#### 1 2 5 9", "1 2 5 9")["score"] == 1.0
    assert compute_score("#### 1, 2, 5, 9", "1 2 5 9")["score"] == 1.0
    assert compute_score("#### a c d", "a c d")["score"] == 1.0
    assert compute_score("#### 2 1 5 9", "1 2 5 9") == {"score": 0.0, "acc": 0.0, "pred": "2 1 5 9"}
    assert compute_score("#### 1 2 5", "1 2 5 9")["score"] == 0.0
    assert compute_score("1 2 5 9", "1 2 5 9")["score"] == 0.0
