"""Rank balancing: the largest differencing method's partitions, worked out by hand, and the row order."""

import pytest
import torch

from hybridflow.data.seqlen_balancing import (
    PartitionError,
    calculate_workload,
    group_balanced_order,
    karmarkar_karp,
    rank_balanced_order,
)


def test_workload_is_verls_7b_estimate():
    # 24576 * s + s**2: 24576 + 1 for one token, 24576 * 100 + 10000 for a hundred.
    assert calculate_workload(torch.tensor([1, 100])).tolist() == [24577, 2467600]


def test_equal_size_two_ways_by_hand():
    # Ascending values taken two at a time: {1,1}, {1,1}, {10,10}, {10,10}, all of spread 0. The ties go
    # to the largest part first: {10|10} (rows 0,1) + {10|10} (rows 2,3), largest with smallest: {0,3 | 1,2}
    # = {20|20}; then + {1|1} (rows 4,5) = {0,3,5 | 1,2,4} = {21|21}; then + {1|1} (rows 6,7) = {22|22}.
    assert karmarkar_karp([10, 10, 10, 10, 1, 1, 1, 1], 2, equal_size=True) == [[0, 3, 5, 7], [1, 2, 4, 6]]


def test_equal_size_three_ways_by_hand():
    # {1,2,3} -> parts 3|2|1 and {4,5,6} -> 6|5|4 (spread 2 each); merged largest with smallest: 7|7|7.
    assert karmarkar_karp([1, 2, 3, 4, 5, 6], 3, equal_size=True) == [[0, 5], [1, 4], [2, 3]]


def test_unequal_sizes_balance_the_sums_only():
    # 5 against five 1s: 5 | 1+1+1+1+1.
    assert karmarkar_karp([5, 1, 1, 1, 1, 1], 2, equal_size=False) == [[0], [1, 2, 3, 4, 5]]


def test_impossible_splits_are_refused():
    with pytest.raises(PartitionError, match="cannot split 6 rows into 4 parts of equal size"):
        karmarkar_karp([1] * 6, 4, equal_size=True)
    with pytest.raises(PartitionError, match="cannot split 0 rows into 2 parts"):
        karmarkar_karp([], 2, equal_size=False)


def test_rank_order_gives_each_rank_slice_the_same_tokens():
    seqlens = torch.tensor([10, 10, 10, 10, 1, 1, 1, 1])  # in batch order: 40 tokens on rank 0, 4 on rank 1
    order, partitions = rank_balanced_order(seqlens, 2)
    assert order == [0, 3, 5, 7, 1, 2, 4, 6] and partitions == [[0, 3, 5, 7], [1, 2, 4, 6]]
    assert seqlens[order].view(2, -1).sum(-1).tolist() == [22, 22]
    assert rank_balanced_order(seqlens, 1)[0] == list(range(8))  # one rank: the batch order


def test_group_order_keeps_each_prompts_samples_on_one_rank():
    # Four prompts of 3 samples on 2 ranks: the long ones go to different ranks, each with a short one.
    seqlens = torch.tensor([30, 30, 30, 28, 28, 28, 5, 5, 5, 6, 6, 6])  # batch order: 174 tokens on rank 0, 33
    uids = ["a"] * 3 + ["b"] * 3 + ["c"] * 3 + ["d"] * 3
    order, partitions = group_balanced_order(seqlens, uids, 2)
    assert partitions == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]  # a + c: 105 tokens, b + d: 102
    assert order == [0, 1, 2, 6, 7, 8, 3, 4, 5, 9, 10, 11]
    assert group_balanced_order(seqlens, uids, 1)[0] == list(range(12))  # one rank: the batch order


def test_group_order_splits_a_group_only_where_no_rank_has_room_for_it():
    # Three prompts of 2 samples on 2 ranks of 3 rows: one prompt must be split, the others stay whole.
    seqlens = torch.tensor([9, 9, 5, 5, 1, 1])
    order, partitions = group_balanced_order(seqlens, ["a", "a", "b", "b", "c", "c"], 2)
    assert [len(rows) for rows in partitions] == [3, 3] and sorted(order) == list(range(6))
    whole = [
        uid for uid, rows in {"a": {0, 1}, "b": {2, 3}, "c": {4, 5}}.items() if any(rows <= set(p) for p in partitions)
    ]
    assert len(whole) == 2 and "a" in whole  # the largest prompt is placed first, whole
    # Runs are consecutive rows: a uid seen again later (a padding copy) is a group of its own.
    assert group_balanced_order(torch.tensor([4, 4, 1, 4]), ["a", "a", "b", "a"], 2)[1] == [[0, 1], [2, 3]]


def test_group_order_refuses_rows_that_do_not_divide():
    with pytest.raises(PartitionError, match="cannot split 3 rows into 2 parts of equal size"):
        group_balanced_order(torch.tensor([1, 2, 3]), ["a", "a", "b"], 2)
