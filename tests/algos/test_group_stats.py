import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.algos.group_stats import group_counts, group_ids_from_index, group_max, group_mean_std


def test_group_ids_from_string_uids_and_tensor():
    ids, num_groups = group_ids_from_index(np.array(["b", "a", "b", "c"], dtype=object))
    assert num_groups == 3
    assert ids[0] == ids[2] and len({int(ids[0]), int(ids[1]), int(ids[3])}) == 3
    ids, num_groups = group_ids_from_index(torch.tensor([7, 7, 3]))
    assert num_groups == 2 and ids[0] == ids[1] != ids[2]


def test_group_ids_from_unorderable_uids_fall_back_to_first_appearance():
    ids, num_groups = group_ids_from_index(np.array([1, "x", 1, None], dtype=object))
    assert num_groups == 3
    assert ids.tolist() == [0, 1, 0, 2]


def test_near_integer_float_uids_group_as_that_integer():
    # verl's tests/utils/test_groupwise.py case: four uids, three groups {1, 2, 3}.
    ids, num_groups = group_ids_from_index(np.array([1.0000001, 2.0, 1.0, 3.0000000001]))
    assert num_groups == 3 and ids.tolist() == [0, 1, 0, 2]
    ids, num_groups = group_ids_from_index(torch.tensor([1.0, 1.0000000001, 2.0], dtype=torch.float64))
    assert num_groups == 2 and ids.tolist() == [0, 0, 1]
    # numpy floats, Python floats and ints in one object column: 3, 3.0 and 3.0000000001 are one uid.
    ids, num_groups = group_ids_from_index(np.array([3, np.float64(3.0), 3.0000000001, np.int64(4)], dtype=object))
    assert num_groups == 2 and ids.tolist() == [0, 0, 0, 1]


def test_floats_away_from_integers_keep_their_exact_value():
    # 1.2 and 1.7 are two prompts (verl would truncate both to 1); 1.0000000001 is still the integer 1.
    ids, num_groups = group_ids_from_index([1.0, 1.0000000001, 1.2, 1.7, 1.2])
    assert num_groups == 3 and ids.tolist() == [0, 0, 1, 2, 1]


def test_strings_are_compared_as_strings():
    ids, num_groups = group_ids_from_index(np.array(["01", "1", "1"], dtype=object))
    assert num_groups == 2 and ids.tolist() == [0, 1, 1]


def test_group_mean_std_hand_case():
    scores = torch.tensor([1.0, 0.0, 1.0, 2.0, 4.0, 7.0])
    ids, num_groups = group_ids_from_index(np.array(["a", "a", "a", "b", "b", "c"], dtype=object))
    mean, std, counts = group_mean_std(scores, ids, num_groups)
    by_sample = {"mean": mean[ids].tolist(), "std": std[ids].tolist()}
    assert by_sample["mean"] == pytest.approx([2 / 3, 2 / 3, 2 / 3, 3.0, 3.0, 0.0])
    # a: sqrt((1/9 + 4/9 + 1/9) / 2) = sqrt(1/3); b: sqrt(2); c: single sample -> mean 0, std 1
    assert by_sample["std"] == pytest.approx([0.577350, 0.577350, 0.577350, 1.414214, 1.414214, 1.0], abs=1e-6)
    assert counts[ids].tolist() == [3, 3, 3, 2, 2, 1]
    assert group_max(scores, ids, num_groups)[ids].tolist() == [1.0, 1.0, 1.0, 4.0, 4.0, 7.0]


def _per_group_loop(scores: torch.Tensor, uids: list) -> tuple[list, list]:
    """The obvious per-group loop, the reference the vectorised version must equal."""
    mean_of, std_of = {}, {}
    for uid in set(uids):
        members = torch.stack([scores[i] for i in range(len(uids)) if uids[i] == uid])
        mean_of[uid] = members.mean() if len(members) > 1 else torch.tensor(0.0)
        std_of[uid] = members.std() if len(members) > 1 else torch.tensor(1.0)
    return [float(mean_of[u]) for u in uids], [float(std_of[u]) for u in uids]


@settings(max_examples=60, deadline=None)
@given(
    group_sizes=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    seed=st.integers(0, 2**31 - 1),
    shuffle=st.booleans(),
)
def test_vectorised_group_stats_equal_per_group_loop(group_sizes, seed, shuffle):
    generator = torch.Generator().manual_seed(seed)
    uids = [f"uid-{g}" for g, size in enumerate(group_sizes) for _ in range(size)]
    if shuffle:
        order = torch.randperm(len(uids), generator=generator).tolist()
        uids = [uids[i] for i in order]
    scores = torch.randn(len(uids), generator=generator)
    ids, num_groups = group_ids_from_index(np.array(uids, dtype=object))
    mean, std, counts = group_mean_std(scores, ids, num_groups)
    expected_mean, expected_std = _per_group_loop(scores, uids)
    assert mean[ids].tolist() == pytest.approx(expected_mean, abs=1e-5)
    assert std[ids].tolist() == pytest.approx(expected_std, abs=1e-5)
    assert group_counts(ids, num_groups)[ids].tolist() == [uids.count(u) for u in uids]
