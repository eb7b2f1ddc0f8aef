"""Validation metrics: verl's names and bootstrap (tests/trainer/ppo/test_metric_utils_on_cpu.py cases, by hand)."""

import math
from collections import Counter

import numpy as np
import pytest

from hybridflow.rewards.validation import N_BOOTSTRAP, majority_values, process_validation_metrics, subset_sizes


def resamples(count: int, n: int, seed: int = 42) -> np.ndarray:
    """The draws the metrics must use: verl's np.random.seed(seed) then np.random.choice, as a local generator."""
    return np.random.RandomState(seed).choice(count, size=(N_BOOTSTRAP, n), replace=True)


def test_subset_sizes_double_from_two_and_end_at_the_sample_count():
    assert [subset_sizes(count) for count in (1, 2, 3, 4, 5, 8, 12)] == [
        [],
        [2],
        [2, 3],
        [2, 4],
        [2, 4, 5],
        [2, 4, 8],
        [2, 4, 8, 12],
    ]


def test_groups_by_data_source_and_prompt():
    data_sources = ["gsm8k"] * 6 + ["sorting"] * 2
    uids = ["p1", "p1", "p1", "p2", "p2", "p2", "s1", "s2"]
    infos = {
        "reward": [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0],
        "acc": [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0],
        "pred": ["4", "5", "5", "7", "7", "9", "1 2", "2 1"],
    }
    metrics = process_validation_metrics(data_sources, uids, infos)
    # gsm8k: two prompts of 3 samples, one right each: acc mean 1/3, population std sqrt(2/9).
    assert metrics["val-core/gsm8k/acc/mean@3"] == pytest.approx(1 / 3)
    assert metrics["val-aux/gsm8k/acc/std@3"] == pytest.approx((2 / 9) ** 0.5)
    assert metrics["val-aux/gsm8k/reward/mean@3"] == pytest.approx(1 / 3)
    # Both prompts draw the same resamples. best@3 of p1 is 1 where a row holds sample 0, of p2 where it holds
    # sample 2; the two prompts' means are averaged.
    rows = resamples(3, 3)
    best = ((rows == 0).any(axis=1).mean() + (rows == 2).any(axis=1).mean()) / 2
    assert metrics["val-core/gsm8k/acc/best@3/mean"] == pytest.approx(best, rel=1e-12)
    worst = ((rows == 0).all(axis=1).mean() + (rows == 2).all(axis=1).mean()) / 2
    assert metrics["val-aux/gsm8k/acc/worst@3/mean"] == pytest.approx(worst, rel=1e-12)
    # best@2 is core only at the largest n (3): at n=2 it is auxiliary.
    assert "val-aux/gsm8k/acc/best@2/mean" in metrics and "val-core/gsm8k/acc/best@2/mean" not in metrics
    # sorting: one sample per prompt, so only mean@1.
    assert metrics["val-core/sorting/acc/mean@1"] == 0.5
    assert sorted(name for name in metrics if "sorting" in name) == [
        "val-aux/sorting/reward/mean@1",
        "val-core/sorting/acc/mean@1",
    ]
    assert not [name for name in metrics if "/pred/" in name]


def test_bootstrap_of_zero_one_values_counts_the_rows_by_hand():
    metrics = process_validation_metrics(["a", "a"], [0, 0], {"reward": [0.0, 1.0], "note": ["x", "y"]})
    rows = resamples(2, 2)
    p_best = 1 - (rows == 0).all(axis=1).mean()  # a row's best is 1 unless it drew sample 0 twice
    p_worst = (rows == 1).all(axis=1).mean()
    assert metrics == pytest.approx(
        {
            "val-core/a/reward/mean@2": 0.5,
            "val-aux/a/reward/std@2": 0.5,
            "val-core/a/reward/best@2/mean": p_best,
            "val-core/a/reward/best@2/std": math.sqrt(p_best * (1 - p_best)),  # std of 0/1 values with mean p
            "val-aux/a/reward/worst@2/mean": p_worst,
            "val-aux/a/reward/worst@2/std": math.sqrt(p_worst * (1 - p_worst)),
        },
        rel=1e-12,
    )


def test_majority_vote_takes_the_first_seen_pred_on_a_tie():
    values, preds = np.array([1.0, 0.0, 0.5]), ["A", "B", "A"]
    # [B, A] tie -> B's 0.0; [A, A] from samples 0, 2 -> the first, 1.0; [B, B] -> 0.0.
    assert majority_values(values, preds, np.array([[1, 0], [0, 2], [1, 1]])).tolist() == [0.0, 1.0, 0.0]
    # [A, B, B] -> B's 0.0; [B, A, A] -> A, first drawn as sample 0: 1.0; [A, A, B] from samples 2, 0 -> 0.5.
    assert majority_values(values, preds, np.array([[2, 1, 1], [1, 0, 2], [2, 0, 1]])).tolist() == [0.0, 1.0, 0.5]


def test_maj_at_n_averages_the_majority_value_of_each_resample():
    values, preds = [1.0, 0.0, 0.5], ["A", "B", "A"]
    metrics = process_validation_metrics(["s"] * 3, ["u"] * 3, {"acc": values, "pred": preds})
    # With 2 draws the majority is always the first draw's pred (a pair, or a tie going to the first seen).
    first_draws = np.asarray(values)[resamples(3, 2)[:, 0]]
    assert metrics["val-aux/s/acc/maj@2/mean"] == pytest.approx(first_draws.mean(), rel=1e-12)
    assert metrics["val-aux/s/acc/maj@2/std"] == pytest.approx(first_draws.std(), rel=1e-12)
    by_vote = []
    for row in resamples(3, 3):
        top = max(Counter(preds[i] for i in row).items(), key=lambda item: item[1])[0]  # first seen on a tie
        by_vote.append(values[next(i for i in row if preds[i] == top)])
    assert metrics["val-core/s/acc/maj@3/mean"] == pytest.approx(np.mean(by_vote), rel=1e-12)


def test_equal_samples_bootstrap_to_their_value_and_the_seed_is_local():
    state = np.random.get_state()
    metrics = process_validation_metrics(["s"] * 4, ["u"] * 4, {"reward": [0.25] * 4}, seed=7)
    assert metrics["val-core/s/reward/best@4/mean"] == 0.25 and metrics["val-core/s/reward/best@4/std"] == 0.0
    assert metrics["val-aux/s/reward/worst@2/mean"] == 0.25
    assert all(a == b for a, b in zip(np.random.get_state()[1], state[1]))  # numpy's global stream untouched
