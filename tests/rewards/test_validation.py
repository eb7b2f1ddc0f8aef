import pytest

from hybridflow.rewards.validation import process_validation_metrics


def test_groups_by_data_source_and_prompt():
    data_sources = ["gsm8k"] * 6 + ["sorting"] * 2
    uids = ["p1", "p1", "p1", "p2", "p2", "p2", "s1", "s2"]
    infos = {
        "score": [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0],
        "acc": [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0],
        "pred": ["4", "5", "5", "7", "7", "9", "1 2", "2 1"],
    }
    metrics = process_validation_metrics(data_sources, uids, infos)
    # gsm8k: two prompts of 3 samples; p1 acc mean 1/3, p2 1/3.
    assert metrics["val-core/gsm8k/acc/mean@3"] == pytest.approx(1 / 3)
    assert metrics["val-core/gsm8k/acc/best@3"] == 1.0
    assert metrics["val-core/gsm8k/acc/maj@3"] == 0.0  # majority answers "5" and "7" are wrong
    assert metrics["val-aux/gsm8k/acc/worst@3"] == 0.0
    assert metrics["val-aux/gsm8k/acc/std@3"] == pytest.approx((2 / 9) ** 0.5)
    assert metrics["val-aux/gsm8k/score/mean@3"] == pytest.approx(1 / 3)
    # sorting: one sample per prompt, so only mean@1.
    assert metrics["val-core/sorting/acc/mean@1"] == 0.5
    assert not [name for name in metrics if "sorting" in name and "@1" not in name]
    assert not [name for name in metrics if "/pred/" in name]


def test_score_is_the_core_variable_without_acc():
    metrics = process_validation_metrics(["a", "a"], [0, 0], {"score": [0.2, 0.6], "note": ["x", "y"]})
    assert metrics == pytest.approx(
        {
            "val-core/a/score/mean@2": 0.4,
            "val-core/a/score/best@2": 0.6,
            "val-aux/a/score/worst@2": 0.2,
            "val-aux/a/score/std@2": 0.2,
        }
    )
