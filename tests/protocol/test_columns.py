"""The batch keys of each worker call, non-tensor columns: list conversion and the equality used by union."""

import numpy as np
import pytest
import torch

from hybridflow.protocol.columns import (
    ACTOR_UPDATE_INPUTS,
    actor_update_columns,
    columns_equal,
    tensors_equal,
    to_column,
    values_equal,
)


def test_to_column_types():
    assert to_column("index", [1, 2, 3]).dtype == np.int64
    assert to_column("score", (0.5, 1)).dtype == np.float64
    assert to_column("uid", ["a", "b"]).dtype == object
    assert to_column("mixed", [1, "a"]).dtype == object
    assert to_column("empty", []).shape == (0,)
    typed = np.array(["a", "b"])
    assert to_column("uid", typed) is typed


def test_to_column_errors_name_the_key():
    with pytest.raises(TypeError, match="column 'uid' is a 0-d array"):
        to_column("uid", np.array("a"))
    with pytest.raises(TypeError, match="column 'rm' is a dict"):
        to_column("rm", {"ground_truth": "1"})


def test_values_equal_handles_nested_arrays_tensors_and_nan():
    assert values_equal({"a": [1, np.array([1.0, np.nan])]}, {"a": [1, np.array([1.0, np.nan])]})
    assert not values_equal({"a": [1, 2]}, {"a": [1, 3]})
    assert not values_equal([1, 2], (1, 2))
    assert values_equal(torch.tensor([1.0]), torch.tensor([1.0]))
    assert not values_equal(torch.tensor([1.0]), np.array([1.0]))
    assert values_equal(float("nan"), float("nan")) and not values_equal(1.0, float("nan"))


def test_columns_and_tensors_equal():
    rows = to_column("rm", [{"gt": np.array([1, 2])}, {"gt": np.array([3])}])
    same = to_column("rm", [{"gt": np.array([1, 2])}, {"gt": np.array([3])}])
    assert columns_equal(rows, same)
    assert not columns_equal(rows, same[:1])
    assert not columns_equal(np.array([1, 2]), np.array([1, 3]))
    assert columns_equal(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))
    assert not tensors_equal(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    assert not tensors_equal(torch.zeros(2), torch.zeros(3))
    assert tensors_equal(torch.tensor([float("nan")]), torch.tensor([float("nan")]))


def test_self_referencing_containers_compare_without_recursing_forever():
    loop, other_loop, not_a_loop = (np.empty(1, dtype=object) for _ in range(3))
    loop[0], other_loop[0] = loop, other_loop
    assert columns_equal(loop, other_loop)
    assert not columns_equal(loop, not_a_loop)  # [loop] vs [None]
    cyclic_list, other_list, different_list = [1], [1], [2]
    for items in (cyclic_list, other_list, different_list):
        items.append(items)
    assert values_equal({"a": cyclic_list}, {"a": other_list})
    assert not values_equal(cyclic_list, different_list)


def test_nested_tensors_compare_row_by_row():
    rows = [torch.ones(1, 2), torch.zeros(3, 2)]
    jagged = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    assert tensors_equal(jagged, torch.nested.as_nested_tensor([r.clone() for r in rows], layout=torch.jagged))
    assert not tensors_equal(jagged, torch.nested.as_nested_tensor([rows[0], rows[1] + 1], layout=torch.jagged))
    assert not tensors_equal(jagged, torch.nested.as_nested_tensor(rows[:1], layout=torch.jagged))
    assert not tensors_equal(jagged, torch.zeros(2, 2))


def test_an_actor_update_reads_its_keys_and_the_optional_ones_present():
    present = [
        "input_ids",
        "attention_mask",
        "position_ids",
        "responses",
        "response_mask",
        "advantages",
        "old_log_probs",
        "rollout_is_weights",
        "token_level_scores",
    ]
    assert actor_update_columns(present, old_log_probs_from_update=False) == [
        *ACTOR_UPDATE_INPUTS,
        "old_log_probs",
        "rollout_is_weights",
    ]
    assert actor_update_columns(present, old_log_probs_from_update=True) == [*ACTOR_UPDATE_INPUTS, "rollout_is_weights"]
