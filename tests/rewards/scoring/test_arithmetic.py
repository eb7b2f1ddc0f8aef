from hybridflow.rewards.scoring.arithmetic import compute_score


def test_number_after_the_marker_is_compared_by_value():
    assert compute_score("#### 42", "42")["score"] == 1.0
    assert compute_score("#### -7", "-7")["score"] == 1.0
    assert compute_score("#### 42.0 done", "42")["score"] == 1.0
    assert compute_score("#### 41", "42") == {"score": 0.0, "acc": 0.0, "pred": "41"}
    assert compute_score("42", "42")["score"] == 0.0
    assert compute_score("#### 41", "42", format_score=0.2)["score"] == 0.2
