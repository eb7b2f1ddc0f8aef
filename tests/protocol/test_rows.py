"""How DataProto.concat merges meta_info: verl's cases (tests/test_protocol_on_cpu.py) through merge_meta_info."""

import math

import pytest

from hybridflow.protocol import MetaInfoConflictError
from hybridflow.protocol.rows import merge_meta_info


def test_metrics_of_every_part_become_lists_and_shared_keys_are_kept_once():
    merged = merge_meta_info(
        [
            {"metrics": [{"loss": 0.5, "accuracy": 0.9}], "config_flag": True},
            {"metrics": [{"loss": 0.6, "accuracy": 0.85}], "config_flag": True},
            {"metrics": [{"loss": 0.55, "accuracy": 0.88}], "config_flag": True},
        ]
    )
    assert merged == {"config_flag": True, "metrics": {"loss": [0.5, 0.6, 0.55], "accuracy": [0.9, 0.85, 0.88]}}


def test_metrics_may_be_a_dict_a_list_or_missing():
    assert merge_meta_info([{"metrics": [{"loss": 0.5}], "flag": True}, {"flag": True}]) == {
        "flag": True,
        "metrics": {"loss": [0.5]},
    }
    # The first part reporting none must not lose the others' metrics.
    merged = merge_meta_info([{"config_flag": True}, {"metrics": {"loss": 0.6}}, {"metrics": {"loss": 0.55}}])
    assert merged["metrics"] == {"loss": [0.6, 0.55]}
    assert merge_meta_info([{"metrics": None}, {"single_value": 42}, {"single_value": 42}]) == {"single_value": 42}
    assert merge_meta_info([{"metrics": {}}]) == {"metrics": {}}


def test_a_metric_missing_from_the_first_part_is_kept():
    merged = merge_meta_info([{"metrics": {"loss": 1.0}}, {"metrics": {"loss": 2.0, "grad_norm": 3.0}}])
    assert merged["metrics"] == {"loss": [1.0, 2.0], "grad_norm": [3.0]}


def test_other_keys_from_all_parts_are_kept_when_they_agree():
    merged = merge_meta_info(
        [
            {"config": "A", "shared_key": "X"},
            {"extra_key": "B", "shared_key": "X"},
            {"another_key": "C", "shared_key": "X", "nan": math.nan},
            {"nan": math.nan},
        ]
    )
    assert merged.keys() == {"config", "shared_key", "extra_key", "another_key", "nan"}
    assert merged["extra_key"] == "B" and merged["another_key"] == "C" and math.isnan(merged["nan"])


def test_conflicting_keys_name_the_key_and_both_parts():
    with pytest.raises(MetaInfoConflictError) as err:
        merge_meta_info([{"config": "A"}, {}, {"config": "B"}])
    assert str(err.value) == (
        "cannot concat: meta_info key 'config' is 'A' in part 0 but 'B' in part 2; per-part values belong in "
        "meta_info['metrics']"
    )
    with pytest.raises(MetaInfoConflictError, match="part 1's meta_info\\['metrics'\\] holds a float"):
        merge_meta_info([{"metrics": {"loss": 1.0}}, {"metrics": [0.5]}])
